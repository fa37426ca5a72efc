"""The speculative-decoding step benchmark's CLI on the CPU: a smoke run end to end
(its metric list), the steady-state guard, and its bad-argument exits."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attngroup.benchmarks.bench_spec_decode import parse_args, spread
from tests.json_schemas import assert_file_matches_schema

REPO_ROOT = Path(__file__).resolve().parents[1]
CPU_ENV = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
SMOKE_ARGV = ["--device", "cpu", "--batch", "2", "--prompt-len", "8", "--warmup", "1"]
SMOKE_STEPS = 3
PREFIX = "spec_decode.gemma4-e2b-mtp.torch.fp32.b2.k3"
MS_METRICS = ["step_ms", "draft_ms", "verify_ms", "metadata_ms", "sampling_ms", "pipelined_step_ms"]
HIGHER_IS_BETTER = {"tokens_per_s": "tokens/s", "accepted_length": "tokens"}


def _run_module(*argv: str, code: str | None = None) -> subprocess.CompletedProcess:
    command = ["-c", code] if code else ["-m", "attngroup.benchmarks.bench_spec_decode"]
    return subprocess.run(
        [sys.executable, *command, *argv],
        cwd=REPO_ROOT,
        env=CPU_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def smoke_output(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One smoke run of the default pair on the CPU: its process and its metric list."""
    out = tmp_path_factory.mktemp("bench") / "spec_decode.json"
    steps = ["--steps", str(SMOKE_STEPS), "--smoke"]
    completed = _run_module(*SMOKE_ARGV, *steps, "--json", str(out))
    assert completed.returncode == 0, completed.stderr
    return completed, out


@pytest.fixture(scope="module")
def smoke_run(smoke_output) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """The smoke run's process and its metrics by suffix."""
    completed, out = smoke_output
    metrics = json.loads(out.read_text())
    return completed, {metric["name"].removeprefix(f"{PREFIX}."): metric for metric in metrics}


def test_smoke_metric_list_matches_its_schema(smoke_output) -> None:
    assert_file_matches_schema(smoke_output[1], "benchmark-metrics")


def test_smoke_run_writes_every_metric_once(smoke_run) -> None:
    completed, metrics = smoke_run
    assert sorted(metrics) == sorted([*MS_METRICS, *HIGHER_IS_BETTER])
    assert "smoke run: not a measurement" in completed.stdout
    assert f"{PREFIX} on cpu: {SMOKE_STEPS} timed steps" in completed.stdout


@pytest.mark.parametrize("suffix", [*MS_METRICS, *HIGHER_IS_BETTER])
def test_smoke_metric_is_a_median_of_finite_positive_steps(smoke_run, suffix: str) -> None:
    metric = smoke_run[1][suffix]
    assert set(metric) == {"name", "value", "unit", "samples", "higher_is_better"}
    assert len(metric["samples"]) == SMOKE_STEPS
    assert all(math.isfinite(sample) and sample > 0 for sample in metric["samples"])
    assert min(metric["samples"]) <= metric["value"] <= max(metric["samples"])
    assert metric["higher_is_better"] == (suffix in HIGHER_IS_BETTER)
    assert metric["unit"] == HIGHER_IS_BETTER.get(suffix, "ms")


def test_smoke_step_holds_its_parts(smoke_run) -> None:
    """Draft and verify run inside the step, metadata building inside them."""
    metrics = smoke_run[1]
    parts = zip(
        metrics["draft_ms"]["samples"],
        metrics["verify_ms"]["samples"],
        metrics["metadata_ms"]["samples"],
        metrics["step_ms"]["samples"],
        strict=True,
    )
    assert all(meta < draft + verify <= step for draft, verify, meta, step in parts)


def test_a_step_that_is_not_steady_stops_the_run() -> None:
    """A batch whose requests finish inside the timed steps must not be reported."""
    code = (
        "import sys, attngroup.benchmarks.bench_spec_decode as bench; "
        "bench.max_tokens_for = lambda args: 4; sys.exit(bench.main(sys.argv[1:]))"
    )
    completed = _run_module(*SMOKE_ARGV, "--steps", "2", "--smoke", code=code)
    assert completed.returncode == 1
    assert "not a steady speculative step" in completed.stderr


def test_spread_is_median_p10_p90() -> None:
    assert spread([float(value) for value in range(11)]) == (5.0, 1.0, 9.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "19"], "--steps must be at least 20 for a measurement"),
        (["--steps", "1", "--smoke"], "--steps must be at least 2"),
        (["--warmup", "0"], "--warmup must be at least 1"),
        (["--num-spec-tokens", "0"], "--num-spec-tokens must be in 1..8"),
        (["-k", "9"], "--num-spec-tokens must be in 1..8"),
        (["--batch", "0"], "expected a positive integer, got '0'"),
        (["--pair", "gemma5"], "invalid choice: 'gemma5'"),
        (["--backend", "flashinfer"], "--backend flashinfer needs a CUDA device"),
        (["--device", "bogus"], "--device bogus:"),
    ],
    ids=[
        "too-few-steps",
        "too-few-smoke-steps",
        "no-warmup",
        "no-drafts",
        "too-many-drafts",
        "empty-batch",
        "unknown-pair",
        "flashinfer-on-cpu",
        "unknown-device",
    ],
)
def test_bad_arguments_exit_2(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--device", "cpu", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_without_a_gpu_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--device", "cuda"])
    assert exited.value.code == 2
    assert "no CUDA device is available" in capsys.readouterr().err
