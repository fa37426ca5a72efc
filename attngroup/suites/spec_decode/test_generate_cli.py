"""``python -m attngroup.reference_engine generate``: a run prints its summary; bad input exits 2."""

from __future__ import annotations

import argparse
import contextlib
import io
import json

import pytest

from attngroup.reference_engine.cli import generate_cli
from attngroup.suites.spec_decode.harness import ON_GPU, case_marks
from tests.json_schemas import (
    MISSING,
    assert_matches_schema,
    assert_refuses_planted_fault,
    fault_id,
)


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    generate_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["generate", *argv])
    return args.run(args)


GENERATE_CASE = pytest.mark.parametrize(
    "json_run",
    [
        pytest.param(
            "gemma4-e2b-mtp",
            marks=case_marks("gemma4-e2b-mtp", "torch", "fp32"),
            id="gemma4-e2b-mtp-torch-fp32-k3",
        )
    ],
    indirect=True,
)


@pytest.fixture(scope="module")
def json_run(request: pytest.FixtureRequest) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one small ``generate --json`` run, shared by the
    summary's checks and its schema's planted faults (an engine run is the slow part)."""
    argv = [request.param, "--backend", "torch", "--num-spec-tokens", "3", "--batch", "2"]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        exit_code = _run([*argv, "--prompt-len", "8", "--max-tokens", "4", "--json"])
    return exit_code, stdout.getvalue(), stderr.getvalue()


@GENERATE_CASE
def test_generate_prints_a_json_summary(json_run: tuple[int, str, str]) -> None:
    exit_code, stdout, stderr = json_run
    assert exit_code == 0, stderr
    summary = json.loads(stdout)
    assert_matches_schema(summary, "reference-engine-generate")
    assert summary["generated_tokens"] == 8
    assert 0 < summary["steps"] <= 8
    assert summary["draft_tokens"] > 0
    assert 0.0 <= summary["acceptance_rate"] <= 1.0
    assert 1.0 <= summary["mean_accepted_length"] <= 4.0
    assert summary["tokens_per_second"] > 0
    assert set(summary["ms_per_step"]) == {"draft", "verify", "metadata", "schedule", "sampling"}
    assert summary["ms_per_step"]["draft"] > 0 and summary["ms_per_step"]["verify"] > 0
    assert "\r" not in stderr  # no progress bar: stderr is not a terminal here


SUMMARY_FAULTS = [
    (("pair",), MISSING),
    (("backend",), "cuda"),
    (("num_spec_tokens",), 9),
    (("generated_tokens",), "8"),
    (("acceptance_rate",), 1.5),
    (("tokens_per_second",), None),
    (("ms_per_step", "verify"), -1.0),
    (("wall_seconds",), -0.1),
    (("preemptions",), -1),
    (("draft_tokens",), -3),
    (("ms_per_step", "draft"), MISSING),
]


@GENERATE_CASE
@pytest.mark.parametrize(
    ("path", "value"), SUMMARY_FAULTS, ids=[fault_id(*fault) for fault in SUMMARY_FAULTS]
)
def test_summary_schema_refuses_a_planted_fault(
    json_run: tuple[int, str, str], path: tuple, value: object
) -> None:
    summary = json.loads(json_run[1])
    assert_refuses_planted_fault(summary, "reference-engine-generate", path, value)


@pytest.mark.spec_decode
@pytest.mark.parametrize(
    "argv",
    [
        ["gemma4-e2b-mtp", "--num-spec-tokens", "9"],
        ["no-such-pair"],
        ["gemma4-e2b-mtp", "--batch", "0"],
    ],
    ids=["k-out-of-range", "unknown-pair", "empty-batch"],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as raised:
        _run(argv)
    assert raised.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.spec_decode
@pytest.mark.skipif(ON_GPU, reason="checks the refusal of a GPU-only backend on the CPU")
def test_gpu_only_backend_on_cpu_exits_2(capsys: pytest.CaptureFixture) -> None:
    assert _run(["gemma4-e2b-mtp", "--backend", "flashinfer", "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    assert "flashinfer" in captured.err and captured.out == ""
