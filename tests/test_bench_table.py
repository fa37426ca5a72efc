"""The performance table derives every ratio from one run's metrics and refuses broken runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attngroup.benchmarks.table import main


def _case_metrics(
    key: str,
    triton_us: float,
    flashinfer_us: float | None,
    graph_us: float | None = None,
    vllm_us: float | None = None,
) -> list[dict]:
    metrics = [
        {"name": f"{key}.triton.latency", "value": triton_us},
        {"name": f"{key}.triton.kv_read_bandwidth", "value": 3.5},
        {"name": f"{key}.triton.fraction_of_copy_bandwidth", "value": 0.82},
    ]
    if flashinfer_us is not None:
        metrics.append({"name": f"{key}.flashinfer.latency", "value": flashinfer_us})
    if graph_us is not None:
        metrics.append({"name": f"{key}.triton.graph_latency", "value": graph_us})
    if vllm_us is not None:
        metrics.append({"name": f"{key}.vllm-triton.latency", "value": vllm_us})
    return metrics


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    metrics = [
        *_case_metrics("decode.gemma4-e2b-sliding-d256.b64x8k", 160.0, 128.0),
        *_case_metrics("verify.gemma4-e2b-sliding-d256.b64x8k", 200.0, None),
    ]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(metrics))
    return path


def test_table_rows_and_side_by_side_ratios(run_file: Path, capsys) -> None:
    assert main([str(run_file)]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert rows == [
        "| decode gemma4-e2b-sliding-d256 b64x8k | 160.0 | 3.50 | 82.0 % | 128.0 | 1.25 (flashinfer) |  |",
        "| verify gemma4-e2b-sliding-d256 b64x8k | 200.0 | 3.50 | 82.0 % | — | — | 1.25 |",
    ]


def test_graph_columns_when_the_run_replayed_cuda_graphs(tmp_path: Path, capsys) -> None:
    metrics = [
        *_case_metrics("decode.s.b64x8k", 160.0, 128.0, graph_us=150.0),
        *_case_metrics("verify.s.b64x8k", 200.0, 1000.0, graph_us=180.0),
        *_case_metrics("draft.s.b64x8k", 170.0, 150.0),
    ]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(metrics))
    assert main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("| Triton graph us | graph vs decode |")
    assert lines[1].count("---") == 9
    assert lines[2].endswith("| 1.25 (flashinfer) |  | 150.0 |  |")
    assert lines[3].endswith("| 0.20 (flashinfer) | 1.25 | 180.0 | 1.20 |")
    assert lines[4].endswith("| 1.13 (flashinfer) | 1.06 | — | — |")


def test_vs_best_peer_takes_the_fastest_peer_of_each_case(tmp_path: Path, capsys) -> None:
    """Both peers get a column; the ratio is over whichever peer was faster in that case."""
    metrics = [
        *_case_metrics("decode.s.b64x8k", 150.0, 120.0, vllm_us=200.0),
        *_case_metrics("verify.s.b64x8k", 180.0, 1000.0, vllm_us=240.0),
        *_case_metrics("draft.s.b64x8k", 160.0, None, vllm_us=320.0),
    ]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(metrics))
    assert main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "| case | Triton us | TB/s | % of copy | FlashInfer us | vLLM Triton us | vs best peer "
        "| vs decode |"
    )
    assert lines[2].endswith("| 120.0 | 200.0 | 1.25 (flashinfer) |  |")
    assert lines[3].endswith("| 1000.0 | 240.0 | 0.75 (vllm-triton) | 1.20 |")
    assert lines[4].endswith("| — | 320.0 | 0.50 (vllm-triton) | 1.07 |")


def test_run_record_is_refused_with_exit_2(tmp_path: Path, capsys) -> None:
    """A run record (issue 15: it crashed with "string indices must be integers")."""
    path = tmp_path / "run.record.json"
    path.write_text(json.dumps({"run_id": "x", "tests": []}))
    assert main([str(path)]) == 2
    captured = capsys.readouterr()
    assert "this is a run record" in captured.err and "NAME.json" in captured.err
    assert captured.out == "" and "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "Expecting property name"),
        (json.dumps([{"name": "decode.s.c.triton.latency", "value": 1.0}]), "lacks metric"),
        (json.dumps([]), "no Triton latency metrics"),
        (json.dumps([1, 2]), "expected a JSON list of metric objects"),
    ],
    ids=["corrupt-json", "missing-metric", "empty-run", "list-of-numbers"],
)
def test_broken_run_exits_2_naming_the_problem(tmp_path: Path, text, message, capsys) -> None:
    path = tmp_path / "run.json"
    path.write_text(text)
    assert main([str(path)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_flashinfer_cell_names_its_fastest_configuration(tmp_path: Path, capsys) -> None:
    """The FlashInfer column says which configuration of the sweep was the fastest correct one."""
    metrics = _case_metrics("decode.s.b64x8k", 150.0, 120.0)
    metrics += [
        {"name": f"decode.s.b64x8k.flashinfer.config_{slug}_latency", "value": value, "unit": "us"}
        for slug, value in (("decode-cuda-cores", 300.0), ("decode-tensor-cores", 120.0))
    ]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(metrics))
    assert main([str(path)]) == 0
    assert "| 120.0 (decode-tensor-cores) | 1.25 (flashinfer) |" in capsys.readouterr().out
