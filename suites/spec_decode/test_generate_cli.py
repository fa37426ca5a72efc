"""``python -m reference_engine generate``: a run prints its summary; bad input exits 2."""

from __future__ import annotations

import argparse
import json

import pytest

from reference_engine import generate_cli
from suites.spec_decode.harness import ON_GPU, case_marks


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    generate_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["generate", *argv])
    return args.run(args)


@pytest.mark.parametrize(
    "pair",
    [
        pytest.param(
            "gemma4-e2b-mtp",
            marks=case_marks("gemma4-e2b-mtp", "torch", "fp32"),
            id="gemma4-e2b-mtp-torch-fp32-k3",
        )
    ],
)
def test_generate_prints_a_json_summary(pair: str, capsys: pytest.CaptureFixture) -> None:
    argv = [
        pair,
        "--backend",
        "torch",
        "--num-spec-tokens",
        "3",
        "--batch",
        "2",
        "--prompt-len",
        "8",
    ]
    assert _run([*argv, "--max-tokens", "4", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["generated_tokens"] == 8
    assert 0 < summary["steps"] <= 8
    assert summary["draft_tokens"] > 0
    assert 0.0 <= summary["acceptance_rate"] <= 1.0
    assert 1.0 <= summary["mean_accepted_length"] <= 4.0
    assert summary["tokens_per_second"] > 0
    assert set(summary["ms_per_step"]) == {"draft", "verify", "metadata", "schedule", "sampling"}
    assert summary["ms_per_step"]["draft"] > 0 and summary["ms_per_step"]["verify"] > 0
    assert "\r" not in captured.err  # no progress bar: stderr is not a terminal here


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
