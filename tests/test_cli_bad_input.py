"""Bad input to every command line: exit 2, one line naming the problem, no
traceback, and nothing left behind in the working folder.

Each case runs the command as a user would (``python -m ...`` in a fresh folder
holding only the case's input files, with no GPU visible) and checks the exit status, that stderr
names the problem, and that the folder holds exactly the inputs afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.pytest_subprocess import python_path

REPO_ROOT = Path(__file__).resolve().parents[1]
CORRUPT_JSON = '{"tests": ['


@dataclass(frozen=True)
class BadInput:
    name: str
    argv: tuple[str, ...]
    message: str
    inputs: tuple[str, ...] = ()  # files written with CORRUPT_JSON before the run

    def __str__(self) -> str:
        return self.name


ENGINE = ("attngroup.reference_engine",)
PAIR = "gemma4-e2b-mtp"
CASES = [
    BadInput("engine-no-command", ENGINE, "the following arguments are required: COMMAND"),
    BadInput("engine-unknown-command", (*ENGINE, "bogus"), "invalid choice: 'bogus'"),
    BadInput("inspect-unknown-pair", (*ENGINE, "inspect", "nope"), "unknown model pair 'nope'"),
    BadInput(
        "inspect-unknown-backend",
        (*ENGINE, "inspect", PAIR, "--backend", "bogus"),
        "argument --backend: invalid choice: 'bogus'",
    ),
    BadInput(
        "inspect-state-backend",
        (*ENGINE, "inspect", PAIR, "--backend", "mamba"),
        "argument --backend: invalid choice: 'mamba'",
    ),
    BadInput(
        "inspect-tp-not-a-number",
        (*ENGINE, "inspect", PAIR, "--tp", "abc"),
        "argument --tp: invalid int value: 'abc'",
    ),
    BadInput(
        "inspect-tp-indivisible",
        (*ENGINE, "inspect", PAIR, "--tp", "3"),
        "8 query heads do not divide over tp=3",
    ),
    BadInput(
        "inspect-unknown-policy",
        (*ENGINE, "inspect", PAIR, "--policy", "bogus"),
        "argument --policy: invalid choice: 'bogus'",
    ),
    BadInput("generate-unknown-pair", (*ENGINE, "generate", "nope"), "unknown model pair 'nope'"),
    BadInput(
        "generate-state-backend",
        (*ENGINE, "generate", PAIR, "--backend", "mamba"),
        "argument --backend: invalid choice: 'mamba'",
    ),
    BadInput(
        "generate-too-many-drafts",
        (*ENGINE, "generate", PAIR, "--num-spec-tokens", "9"),
        "must be in 0..8",
    ),
    BadInput(
        "generate-empty-batch",
        (*ENGINE, "generate", PAIR, "--batch", "0"),
        "argument --batch: expected a positive integer, got '0'",
    ),
    BadInput(
        "generate-negative-temperature",
        (*ENGINE, "generate", PAIR, "--temperature", "-1"),
        "--temperature must be >= 0",
    ),
    BadInput(
        "generate-unknown-device",
        (*ENGINE, "generate", PAIR, "--device", "bogus"),
        "unknown device 'bogus'",
    ),
    BadInput(
        "generate-cuda-without-gpu",
        (*ENGINE, "generate", PAIR, "--device", "cuda"),
        "--device cuda: this torch",
    ),
    BadInput("ci-unknown-command", ("attngroup.ci", "bogus"), "invalid choice: 'bogus'"),
    BadInput(
        "ci-select-without-base", ("attngroup.ci", "select"), "the following arguments are required"
    ),
    BadInput(
        "ci-missing-config",
        ("attngroup.ci", "lint", "--repo", str(REPO_ROOT), "--config", "missing.yaml"),
        "missing.yaml does not exist",
    ),
    BadInput(
        "ci-pipeline-unknown-format",
        ("attngroup.ci", "pipeline", "--format", "xml"),
        "argument --format: invalid choice: 'xml'",
    ),
    BadInput(
        "reports-build-missing-record",
        ("attngroup.reports", "build", "--run", "missing.json", "-o", "report.html"),
        "run record 'missing.json' does not exist",
    ),
    BadInput(
        "reports-build-corrupt-record",
        ("attngroup.reports", "build", "--run", "corrupt.json", "-o", "report.html"),
        "run record 'corrupt.json' is not valid JSON",
        inputs=("corrupt.json",),
    ),
    BadInput(
        "reports-compare-corrupt-record",
        ("attngroup.reports", "compare", "--run", "corrupt.json", "--baseline", "corrupt.json"),
        "is not valid JSON",
        inputs=("corrupt.json",),
    ),
    BadInput(
        "reports-archive-missing-record",
        ("attngroup.reports", "archive", "--run", "missing.json", "--history", "history"),
        "run record 'missing.json' does not exist",
    ),
    BadInput(
        "reports-archive-keep-zero",
        ("attngroup.reports", "archive", "--run", "r.json", "--history", "history", "--keep", "0"),
        "argument --keep: expected a positive integer",
    ),
    BadInput(
        "reports-bad-threshold-regex",
        (
            "attngroup.reports",
            "build",
            "--run",
            "r.json",
            "--threshold",
            "[=0.1",
            "-o",
            "report.html",
        ),
        "bad regular expression",
    ),
    BadInput("table-missing-run", ("attngroup.benchmarks.table", "missing.json"), "missing.json"),
    BadInput(
        "run-record-missing-list",
        ("attngroup.benchmarks.run_record", "missing.json", "-o", "record.json"),
        "metric list 'missing.json' does not exist",
    ),
    BadInput(
        "run-record-corrupt-list",
        ("attngroup.benchmarks.run_record", "corrupt.json", "-o", "record.json"),
        "is not valid JSON",
        inputs=("corrupt.json",),
    ),
    BadInput(
        "bench-attention-too-few-runs",
        ("attngroup.benchmarks.bench_attention", "--runs", "5", "--json", "metrics.json"),
        "--runs must be at least 20",
    ),
    BadInput(
        "bench-spec-decode-too-many-drafts",
        ("attngroup.benchmarks.bench_spec_decode", "--num-spec-tokens", "9"),
        "--num-spec-tokens must be in 1..8",
    ),
    BadInput(
        "bench-spec-decode-cuda-without-gpu",
        ("attngroup.benchmarks.bench_spec_decode", "--device", "cuda", "--json", "metrics.json"),
        "no CUDA device is available",
    ),
    BadInput(
        "bench-metadata-one-run",
        ("attngroup.benchmarks.bench_metadata", "--runs", "1", "--json", "metrics.json"),
        "--runs must be >= 2",
    ),
    BadInput(
        "bench-metadata-unknown-pair",
        ("attngroup.benchmarks.bench_metadata", "--pair", "bogus"),
        "argument --pair: invalid choice: 'bogus'",
    ),
    BadInput(
        "tune-attention-bad-list",
        ("attngroup.benchmarks.tuning.sweep", "--block-m", "x"),
        "expected comma-separated integers; got 'x'",
    ),
    BadInput(
        "tune-attention-without-gpu",
        ("attngroup.benchmarks.tuning.sweep", "--json", "sweep.json"),
        "the sweep needs a CUDA device",
    ),
    BadInput(
        "ab-attention-unknown-case",
        ("attngroup.benchmarks.tuning.ab", "--cases", "decode.nothing.b1x1"),
        "no benchmark case named 'decode.nothing.b1x1'",
    ),
    BadInput(
        "ab-attention-unknown-variant",
        ("attngroup.benchmarks.tuning.ab", "--variants", "value-split-3"),
        "unknown variants ['value-split-3']",
    ),
    BadInput(
        "ab-attention-without-gpu",
        ("attngroup.benchmarks.tuning.ab", "--variants", "value-split-2"),
        "the A/B needs a CUDA device",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_exits_2_with_one_clear_line(case: BadInput, tmp_path: Path) -> None:
    for name in case.inputs:
        (tmp_path / name).write_text(CORRUPT_JSON)
    # No GPU visible, so the missing-device cases hold on GPU machines too.
    env = {**os.environ, "PYTHONPATH": python_path(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    completed = subprocess.run(
        [sys.executable, "-m", *case.argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert case.message in completed.stderr, completed.stderr
    assert "Traceback" not in completed.stderr, completed.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(case.inputs)


PIPED_COMMANDS = [
    pytest.param(("attngroup.reference_engine", "inspect", PAIR, "--json"), id="inspect-json"),
    pytest.param(("attngroup.ci", "pipeline", "--all"), id="ci-pipeline"),
]


@pytest.mark.parametrize("argv", PIPED_COMMANDS)
def test_a_reader_that_stops_early_is_not_an_error(argv: tuple[str, ...]) -> None:
    """``... | head``: the reader closes the pipe before the command writes; the command
    ends quietly with exit 0 instead of a BrokenPipeError traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the command prints anything
    env = {**os.environ, "PYTHONPATH": python_path(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    try:
        completed = subprocess.run(
            [sys.executable, "-m", *argv],
            cwd=REPO_ROOT,
            env=env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write_end)
    assert completed.returncode == 0, completed.stderr
    assert "Traceback" not in completed.stderr, completed.stderr
