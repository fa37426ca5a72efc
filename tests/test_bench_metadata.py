"""The metadata benchmark's CLI on the CPU: a tiny run through the engine's own path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attngroup.benchmarks import bench_metadata
from attngroup.kernels.metadata import CommonAttentionMetadata
from attngroup.reports.record import load_record
from tests.json_schemas import assert_file_matches_schema


def test_tiny_run_writes_one_metric(tmp_path: Path, monkeypatch, capsys) -> None:
    """It times the engine's fast path: the validated constructor is never called."""

    def refuse(*args, **kwargs):
        raise AssertionError("the benchmark must time the engine's path, not from_seq_lens")

    monkeypatch.setattr(CommonAttentionMetadata, "from_seq_lens", refuse)
    out = tmp_path / "bench" / "metadata.json"
    argv = ["--device", "cpu", "--batch", "3", "--context-len", "100", "--runs", "3"]
    assert bench_metadata.main([*argv, "--json", str(out)]) == 0
    (metric,) = json.loads(out.read_text())
    assert set(metric) == {"name", "value", "unit", "samples", "higher_is_better"}
    assert metric["name"] == "metadata.gemma4-e2b-mtp.b3.host_us"
    assert (metric["unit"], metric["higher_is_better"], len(metric["samples"])) == ("us", False, 3)
    assert "7 builders" in capsys.readouterr().out


def test_tiny_run_writes_a_run_record(tmp_path: Path) -> None:
    out = tmp_path / "bench" / "record.json"
    argv = ["--device", "cpu", "--batch", "3", "--context-len", "100", "--runs", "3"]
    assert bench_metadata.main([*argv, "--record", str(out)]) == 0
    record = load_record(out)
    nodeid = "attngroup/benchmarks/bench_metadata.py::metadata.gemma4-e2b-mtp.b3"
    assert [(test.nodeid, test.outcome) for test in record.tests] == [(nodeid, "passed")]
    (metric,) = record.metrics
    assert (metric.nodeid, metric.name, metric.unit, len(metric.samples)) == (
        nodeid,
        "host_us",
        "us",
        3,
    )
    assert str(record.environment["device"]).startswith("CPU")


def test_tiny_run_outputs_match_their_schemas(tmp_path: Path) -> None:
    metrics, record = tmp_path / "metadata.json", tmp_path / "record.json"
    argv = ["--device", "cpu", "--batch", "2", "--context-len", "40", "--runs", "2"]
    assert bench_metadata.main([*argv, "--json", str(metrics), "--record", str(record)]) == 0
    assert_file_matches_schema(metrics, "benchmark-metrics")
    assert_file_matches_schema(record, "run-record")


@pytest.mark.parametrize(
    "argv", [["--runs", "1"], ["--batch", "0"]], ids=["too-few-runs", "empty-batch"]
)
def test_bad_arguments_exit_2(argv, capsys) -> None:
    assert bench_metadata.main(["--device", "cpu", *argv]) == 2
    assert "--runs must be >= 2" in capsys.readouterr().err
