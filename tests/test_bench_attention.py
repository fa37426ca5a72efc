"""The attention benchmark's CLI: a tiny dry run end to end (on the GPU where there is one, else
through the Triton interpreter), and its bad-input exits."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from attngroup.benchmarks import attention_runner
from attngroup.benchmarks.attention_cases import SHAPES, Case, cases
from attngroup.benchmarks.attention_runner import ratio_metrics
from attngroup.benchmarks.backend_names import BACKENDS, MAX_RELATIVE_ERROR
from attngroup.benchmarks.bench_attention import parse_args
from attngroup.benchmarks.flashinfer_sweep import configs_for, table_choice
from attngroup.benchmarks.timing import (
    INTERLEAVED_ROUNDS,
    ROUND_WARMUP,
    Timing,
    time_interleaved,
)
from attngroup.benchmarks.vllm_triton_peer import KERNEL_DIR_VARIABLE, kernel_dir, missing_reason
from attngroup.kernels.registry import BACKEND_PATHS, UnknownBackendError, get_backend
from attngroup.reports.record import load_record
from tests.json_schemas import assert_file_matches_schema

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class DryRun:
    completed: subprocess.CompletedProcess
    metrics: Path
    record: Path
    device_prefix: str
    """How the record must name the device that ran it."""
    cuda_graph: bool
    """On the GPU the run also replays each case from a CUDA graph."""


def run_tiny_dry_run(out: Path, backends: str) -> DryRun:
    """Every quick case run once through ``backends``, both outputs written: compiled on the GPU
    where there is one (GPU images may carry an interpreter too old for NumPy 2), else
    interpreted."""
    metrics, record = out / "attention.json", out / "record.json"
    command = [
        sys.executable,
        "-m",
        "attngroup.benchmarks.bench_attention",
        "--dry-run",
        "--tiny",
        "--quick",
    ]
    outputs = ["--json", str(metrics), "--record", str(record)]
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        device, env, device_prefix = "cuda", dict(os.environ), torch.cuda.get_device_name()
        outputs.append("--cuda-graph")
    else:
        device, device_prefix = "cpu", "CPU"
        env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    completed = subprocess.run(
        [*command, "--backends", backends, "--device", device, *outputs],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    return DryRun(completed, metrics, record, device_prefix, on_gpu)


@pytest.fixture(scope="module")
def tiny_dry_run(tmp_path_factory) -> DryRun:
    return run_tiny_dry_run(tmp_path_factory.mktemp("bench"), "triton")


QUICK_CASES = cases(quick=True, tiny=True, shape_names=list(SHAPES))


def test_tiny_dry_run_writes_checked_metrics(tiny_dry_run: DryRun) -> None:
    """Every quick case matches the oracle (and so does its CUDA-graph replay, on the GPU)."""
    metrics = json.loads(tiny_dry_run.metrics.read_text())
    measures = ["relative_error", "graph_relative_error"][: 1 + tiny_dry_run.cuda_graph]
    expected_names = {f"{case.name}.triton.{m}" for case in QUICK_CASES for m in measures}
    assert {metric["name"] for metric in metrics} == expected_names
    for metric in metrics:
        assert set(metric) == {"name", "value", "unit", "samples", "higher_is_better"}
        assert 0 < metric["value"] < MAX_RELATIVE_ERROR, metric
    assert "draft.gemma4-e2b-sliding-d256.b3x80" in tiny_dry_run.completed.stdout


@pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or "")
def test_tiny_dry_run_checks_vllm_triton_against_the_oracle(tmp_path: Path) -> None:
    """The peer passes the dry run's oracle check too: on the CPU the caches are float32, as the
    interpreter's bf16 ``tl.dot`` is wrong and vLLM's kernel does not cast its operands."""
    dry_run = run_tiny_dry_run(tmp_path, "vllm-triton")
    errors = {
        metric["name"]: metric["value"]
        for metric in json.loads(dry_run.metrics.read_text())
        if metric["name"].endswith(".vllm-triton.relative_error")
    }
    assert len(errors) == len(QUICK_CASES)
    assert all(0 < error < MAX_RELATIVE_ERROR for error in errors.values()), errors


def test_tiny_dry_run_writes_a_passing_run_record(tiny_dry_run: DryRun) -> None:
    """One passed pseudo-test per case; a dry run times nothing, so no metrics."""
    record = load_record(tiny_dry_run.record)
    expected = [f"attngroup/benchmarks/bench_attention.py::{case.name}" for case in QUICK_CASES]
    assert [test.nodeid for test in record.tests] == expected
    assert {test.outcome for test in record.tests} == {"passed"}
    assert (record.exit_status, record.metrics) == (0, ())
    assert str(record.environment["device"]).startswith(tiny_dry_run.device_prefix)
    assert f"wrote the run record {tiny_dry_run.record}" in tiny_dry_run.completed.stdout


def test_tiny_dry_run_outputs_match_their_schemas(tiny_dry_run: DryRun) -> None:
    assert_file_matches_schema(tiny_dry_run.metrics, "benchmark-metrics")
    assert_file_matches_schema(tiny_dry_run.record, "run-record")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dry-run", "--tiny", "--runs", "5"], "--runs must be at least 20"),
        (["--dry-run", "--tiny", "--shapes", "gemma9"], "unknown shapes"),
        (["--dry-run", "--tiny", "--backends", "cudnn"], "unknown backends"),
        (["--tiny"], "--tiny is for --dry-run"),
        (["--dry-run", "--tiny", "--contexts", "b64x8k"], "unknown contexts or modes"),
        (["--dry-run", "--tiny", "--modes", "prefill"], "unknown contexts or modes"),
    ],
    ids=[
        "too-few-runs",
        "unknown-shape",
        "unknown-backend",
        "tiny-without-dry-run",
        "full-context-with-tiny",
        "unknown-mode",
    ],
)
def test_bad_arguments_exit_2(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "timing needs a CUDA device"),
        (["--dry-run"], "--dry-run needs --tiny"),
        (["--dry-run", "--tiny", "--cuda-graph"], "--cuda-graph needs a CUDA device"),
    ],
    ids=["timing", "full-size-dry-run", "cuda-graph"],
)
def test_cpu_refuses_what_needs_a_gpu(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_kv_bytes_match_the_research_anchor() -> None:
    """Llama 32q/8kv/d128 at 64 x 8k reads 2.15 GB of bf16 K+V (research notes, section 0)."""
    case = Case("llama3-8b-d128", "decode", "b64x8k", 64, 8192)
    assert case.kv_bytes == 64 * 8192 * 2 * 8 * 128 * 2
    assert round(case.kv_bytes / 1e9, 2) == 2.15


def test_draft_reads_the_target_pages_with_four_heads() -> None:
    case = Case("gemma4-e2b-sliding-d256", "draft", "b64x8k", 64, 8192)
    target = Case("gemma4-e2b-sliding-d256", "decode", "b64x8k", 64, 8192)
    assert (case.num_heads_q, target.num_heads_q) == (4, 8)
    assert case.kv_bytes == target.kv_bytes


def test_timing_percentiles() -> None:
    timing = Timing(tuple(float(value) for value in range(1, 102)))
    assert timing.median_us == 51.0
    assert timing.percentile_us(10) == pytest.approx(11.0)
    assert timing.percentile_us(90) == pytest.approx(91.0)


@pytest.mark.parametrize(
    ("contexts", "modes", "expected"),
    [
        (["b2x150"], ["draft"], ["draft.gemma4-e2b-sliding-d256.b2x150"]),
        (
            None,
            ["decode"],
            ["decode.gemma4-e2b-sliding-d256.b3x80", "decode.gemma4-e2b-sliding-d256.b2x150"],
        ),
    ],
    ids=["one-context-one-mode", "all-contexts-decode"],
)
def test_cases_follow_the_context_and_mode_selection(contexts, modes, expected) -> None:
    selected = cases(False, True, ["gemma4-e2b-sliding-d256"], contexts, modes)
    assert [case.name for case in selected] == expected


def test_ratios_over_each_peer_and_the_fastest(capsys) -> None:
    """Triton over FlashInfer, over vLLM's Triton, and over whichever of them was faster."""
    case = cases(False, True, ["gemma4-e2b-sliding-d256"], ["b3x80"], ["decode"])[0]

    def timing(median: float) -> Timing:
        return Timing((median - 1.0, median, median + 1.0))

    metrics = ratio_metrics(
        case,
        {"triton": timing(150.0), "flashinfer": timing(120.0), "vllm-triton": timing(200.0)},
    )
    values = {metric.name.removeprefix(f"{case.name}."): metric.value for metric in metrics}
    assert values == pytest.approx(
        {
            "triton_over_flashinfer": 1.25,
            "triton_over_vllm-triton": 0.75,
            "triton_over_best_peer": 1.25,
        }
    )
    assert "triton/best peer (flashinfer) 1.25" in capsys.readouterr().out


def test_vllm_triton_kernel_is_looked_for_where_the_fetch_script_puts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fetch script's default folder, .vllm-triton in the repository root (it once looked
    one level above the root, so the peer's tests skipped beside a fetched kernel)."""
    monkeypatch.delenv(KERNEL_DIR_VARIABLE, raising=False)
    assert kernel_dir() == REPO_ROOT / ".vllm-triton"
    monkeypatch.setenv(KERNEL_DIR_VARIABLE, "/elsewhere")
    assert kernel_dir() == Path("/elsewhere")


def test_vllm_triton_peer_is_no_engine_backend() -> None:
    """The peer runs in the benchmarks only: users cannot pick it for the engine."""
    assert "vllm-triton" in BACKENDS
    assert "vllm-triton" not in BACKEND_PATHS
    with pytest.raises(UnknownBackendError):
        get_backend("vllm-triton")


@pytest.mark.parametrize(
    ("shape", "mode", "expected", "table"),
    [
        (
            "gemma4-e2b-sliding-d256",
            "decode",
            ["decode/cuda-cores", "decode/tensor-cores", "prefill/fa2", "prefill/fa3"],
            "decode/tensor-cores",
        ),
        (
            "gemma4-e2b-full-d512",
            "draft",
            ["decode/cuda-cores", "decode/tensor-cores", "prefill/fa2"],
            "decode/tensor-cores",
        ),
        (
            "llama3-8b-d128",
            "verify",
            ["decode/tensor-cores/q_len_per_req", "prefill/fa2", "prefill/fa3"],
            "prefill/fa2",
        ),
        (
            "gemma4-e4b-full-d512",
            "verify",
            ["decode/tensor-cores/q_len_per_req", "prefill/fa2"],
            "prefill/fa2",
        ),
    ],
    ids=["d256-decode", "d512-draft", "d128-verify", "d512-verify"],
)
def test_flashinfer_sweep_covers_every_configuration_that_can_run(
    shape: str, mode: str, expected: list[str], table: str
) -> None:
    """The FlashInfer peer is the best of these; the backend's own choice is among them."""
    case = Case(shape, mode, "b64x8k", 64, 8192)
    assert [config.describe() for config in configs_for(case)] == expected
    assert table_choice(case).describe() == table
    assert table_choice(case) in configs_for(case)


class FakeTimer:
    """Records each timing call; a launch's samples are its name's number, so the joined
    samples show which calls they came from."""

    def __init__(self, names: dict[object, str]) -> None:
        self.names = names
        self.calls: list[tuple[str, int, int]] = []

    def __call__(self, run, *, warmup: int, runs: int, flush) -> Timing:
        name = self.names.get(run, "launch")
        run()
        self.calls.append((name, warmup, runs))
        return Timing((float(len(self.calls)),) * runs)


def test_interleaved_rounds_rotate_the_order_and_join_the_samples() -> None:
    launches = {name: (lambda: None) for name in "abc"}
    timer = FakeTimer({run: name for name, run in launches.items()})
    timings = time_interleaved(
        launches, total_runs=7, warmup=4, flush=torch.empty(0), rounds=3, timer=timer
    )
    assert [name for name, _, _ in timer.calls] == list("abcbcacab")
    assert [warmup for _, warmup, _ in timer.calls] == [4, 4, 4] + [ROUND_WARMUP] * 6
    assert {runs for _, _, runs in timer.calls} == {3}  # ceil(7 / 3) per round
    assert timings["a"].samples_us == (1.0,) * 3 + (6.0,) * 3 + (8.0,) * 3
    with pytest.raises(ValueError, match="total_runs >= max"):
        time_interleaved(launches, total_runs=2, warmup=1, flush=torch.empty(0), rounds=3)


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "with-graph-replays"])
def test_the_timed_path_checks_then_times_every_launch(
    monkeypatch: pytest.MonkeyPatch, cuda_graph: bool
) -> None:
    """The timed (not dry) path end to end with a fake clock, on the GPU where there is one and
    on the CPU under Triton's interpreter otherwise: each launch checked against the oracle,
    then timed in interleaved rounds, its metrics written; with ``--cuda-graph`` (the capture
    stood in for by the launch itself) the replays checked on a poisoned output and timed as a
    second set of rounds."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    selection = ["--shapes", "gemma4-e2b-sliding-d256", "--contexts", "b3x80"]
    selection += ["--modes", "decode,verify", "--device", device, "--runs", "20"]
    args = parse_args(["--dry-run", "--tiny", "--backends", "triton", *selection])
    args.dry_run, args.cuda_graph = False, cuda_graph
    timer = FakeTimer({})
    monkeypatch.setattr(
        attention_runner, "time_interleaved", functools.partial(time_interleaved, timer=timer)
    )
    monkeypatch.setattr(
        attention_runner, "copy_bandwidth", lambda *_, **__: (Timing((1.0, 1.0)), 3e12)
    )
    monkeypatch.setattr(attention_runner, "l2_flush_buffer", lambda device: torch.empty(0))
    monkeypatch.setattr(attention_runner, "cuda_graph_replay", lambda run: run)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "a fake clock")
    metrics, status = attention_runner.run_cases(args, torch.device(device))
    assert status == 0
    values = {metric.name: metric for metric in metrics}
    measures = ["latency", "graph_latency"][: 1 + cuda_graph]
    for mode in ("decode", "verify"):
        prefix = f"{mode}.gemma4-e2b-sliding-d256.b3x80.triton"
        assert values[f"{prefix}.relative_error"].value < MAX_RELATIVE_ERROR
        assert values[f"{prefix}.fraction_of_copy_bandwidth"].value > 0
        for measure in measures:
            assert len(values[f"{prefix}.{measure}"].samples) == 20  # 5 rounds of 4
        if cuda_graph:
            assert values[f"{prefix}.graph_relative_error"].value < MAX_RELATIVE_ERROR
    assert len(timer.calls) == 2 * INTERLEAVED_ROUNDS * len(measures)
