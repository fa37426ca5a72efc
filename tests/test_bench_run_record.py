"""A benchmark metric list as a run record: cases, verdicts, metrics, the CLI's bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attngroup.benchmarks.backend_names import MAX_RELATIVE_ERROR
from attngroup.benchmarks.run_record import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    device_label,
    load_metric_list,
    main,
    parse_metric_list,
    run_environment,
    split_name,
    to_run_record,
)
from attngroup.reports.cli import main as reports_main
from attngroup.reports.record import load_record

CASE = "decode.gemma4-e2b-sliding-d256.b64x8k"
TOOL = "attngroup/benchmarks/bench_attention.py"
REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "attngroup" / "benchmarks" / "results"
MEASURED = RESULTS / "h200-2026-12-02-full-matrix.json"  # the H200 run's metric list
BASELINE = RESULTS / "h200-2026-12-02-full-matrix.record.json"  # the same, converted
MEASURING_COMMIT = "c9ee6d8707d8a299082655b0aada6453cf4ee6f7"  # committed the H200 run


def metric(name: str, value: float, unit: str = "us", samples=(), higher_is_better=False) -> dict:
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "samples": list(samples),
        "higher_is_better": higher_is_better,
    }


def metric_list(triton_error: float = 1e-3) -> list[dict]:
    """One device metric and one case as bench_attention writes them, ratios included."""
    return [
        metric("device.copy_bandwidth", 4.25, "TB/s", [4.2, 4.25, 4.3], True),
        metric(f"{CASE}.triton.relative_error", triton_error, "ratio"),
        metric(f"{CASE}.triton.latency", 166.4, "us", [165.0, 166.4, 170.0]),
        metric(f"{CASE}.triton.kv_read_bandwidth", 3.23, "TB/s", [3.2, 3.23, 3.25], True),
        metric(f"{CASE}.triton.fraction_of_copy_bandwidth", 0.76, "ratio", [], True),
        metric(f"{CASE}.flashinfer.relative_error", 2e-3, "ratio"),
        metric(f"{CASE}.flashinfer.latency", 147.6, "us", [147.0, 147.6, 149.0]),
        metric(f"{CASE}.triton_over_flashinfer", 1.13, "ratio"),
    ]


def convert(metrics: list[dict]):
    return to_run_record(parse_metric_list(metrics, "test"), environment={"device": "GPU"})


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"{CASE}.triton.latency", (CASE, "triton.latency")),
        (f"{CASE}.flashinfer.relative_error", (CASE, "flashinfer.relative_error")),
        (f"{CASE}.triton_over_flashinfer", (CASE, "triton_over_flashinfer")),
        ("device.copy_bandwidth", ("device", "copy_bandwidth")),
        ("metadata.gemma4-e2b-mtp.b64.host_us", ("metadata.gemma4-e2b-mtp.b64", "host_us")),
    ],
    ids=["backend-metric", "backend-error", "case-ratio", "device", "metadata"],
)
def test_split_name_into_case_and_measure(name: str, expected: tuple[str, str]) -> None:
    assert split_name(name) == expected


@pytest.mark.parametrize("name", ["latency", "a..latency", ".latency", "case."])
def test_split_name_refuses_a_name_without_case(name: str) -> None:
    with pytest.raises(ValueError, match=r"is not CASE\.MEASURE"):
        split_name(name)


def test_one_pseudo_test_per_case_in_run_order() -> None:
    record = convert(metric_list())
    assert [test.nodeid for test in record.tests] == [f"{TOOL}::device", f"{TOOL}::{CASE}"]
    assert [test.outcome for test in record.tests] == ["passed", "passed"]
    assert record.exit_status == 0


def test_timed_metrics_attached_errors_and_ratios_left_out() -> None:
    record = convert(metric_list())
    assert {metric.key for metric in record.metrics} == {
        (f"{TOOL}::device", "copy_bandwidth"),
        (f"{TOOL}::{CASE}", "triton.latency"),
        (f"{TOOL}::{CASE}", "triton.kv_read_bandwidth"),
        (f"{TOOL}::{CASE}", "flashinfer.latency"),
    }
    latency = next(metric for metric in record.metrics if metric.name == "triton.latency")
    assert (latency.value, latency.unit, latency.samples) == (166.4, "us", (165.0, 166.4, 170.0))
    assert latency.higher_is_better is False


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (1e-3, "passed"),
        (MAX_RELATIVE_ERROR, "failed"),
        (2 * MAX_RELATIVE_ERROR, "failed"),
        (math.nan, "failed"),
        (math.inf, "failed"),
    ],
    ids=["below-bound", "at-bound", "above-bound", "nan", "inf"],
)
def test_case_outcome_judged_by_relative_error(error: float, outcome: str) -> None:
    record = convert(metric_list(triton_error=error))
    case = record.test_by_nodeid()[f"{TOOL}::{CASE}"]
    assert case.outcome == outcome
    assert record.exit_status == (outcome == "failed")


def test_failure_message_names_backend_error_and_bound() -> None:
    case = convert(metric_list(triton_error=0.5)).test_by_nodeid()[f"{TOOL}::{CASE}"]
    assert case.message == "triton relative error 5.00e-01 not below 2e-02"


@pytest.mark.parametrize(("error", "outcome"), [(1e-3, "passed"), (0.5, "failed")])
def test_a_cuda_graph_replay_error_is_judged_too(error: float, outcome: str) -> None:
    """--cuda-graph's replay error fails its case like the eager launch's, and is no timed metric."""
    graph_error = metric(f"{CASE}.triton.graph_relative_error", error, "ratio")
    record = convert([*metric_list(), graph_error])
    case = record.test_by_nodeid()[f"{TOOL}::{CASE}"]
    assert case.outcome == outcome
    if outcome == "failed":
        assert case.message == "triton.graph relative error 5.00e-01 not below 2e-02"
    assert "triton.graph_relative_error" not in {metric.name for metric in record.metrics}


def test_environment_overrides_win_over_this_machine() -> None:
    environment = run_environment("NVIDIA H200", {"git_sha": "abc", "hostname": None})
    assert (environment["device"], environment["git_sha"]) == ("NVIDIA H200", "abc")
    assert environment["hostname"] is None
    assert "python" in environment


def test_environment_without_this_machine_is_the_overrides_alone() -> None:
    assert run_environment("NVIDIA H200", {"git_sha": "abc"}, local=False) == {
        "device": "NVIDIA H200",
        "git_sha": "abc",
    }


@pytest.fixture
def metrics_file(tmp_path: Path) -> Path:
    path = tmp_path / "attention.json"
    path.write_text(json.dumps(metric_list()))
    return path


def test_cli_writes_a_record_the_reports_read(metrics_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out" / "record.json"
    argv = [str(metrics_file), "-o", str(out), "--env", "device=NVIDIA H200", "--env", "git_sha="]
    assert main([*argv, "--created-at", "2026-12-02T18:51:36+01:00"]) == EXIT_OK
    record = load_record(out)
    assert (record.environment["device"], record.environment["git_sha"]) == ("NVIDIA H200", None)
    assert record.created_at == "2026-12-02T17:51:36+00:00"
    assert len(record.tests) == 2
    assert "2 cases (0 failed), 4 metrics" in capsys.readouterr().out


def test_cli_tool_names_the_pseudo_tests(metrics_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "record.json"
    argv = [str(metrics_file), "-o", str(out), "--tool", "attngroup/benchmarks/bench_metadata.py"]
    assert main([*argv, "--no-local-env"]) == EXIT_OK
    record = load_record(out)
    assert record.tests[0].nodeid == "attngroup/benchmarks/bench_metadata.py::device"
    assert record.environment == {}


BAD_INPUTS = {
    "corrupt-json": ('[{"name": "device.copy', "is not valid JSON"),
    "empty-file": ("", "is empty"),
    "object-not-list": ('{"metrics": []}', "expected a JSON list of metrics, got an object"),
    "empty-list": ("[]", "holds no metrics"),
    "item-not-object": ("[1.5]", "[0]: expected a metric object, got float"),
    "missing-samples": (
        json.dumps([{k: v for k, v in metric("a.b", 1.0).items() if k != "samples"}]),
        "required field(s) 'samples' missing",
    ),
    "missing-value-and-unit": (
        json.dumps([{"name": "a.b", "samples": [], "higher_is_better": False}]),
        "required field(s) 'value', 'unit' missing",
    ),
    "nan-value": (
        '[{"name": "a.latency", "value": NaN, "unit": "us", "samples": [], '
        '"higher_is_better": false}]',
        "'a.latency').value: expected a finite number",
    ),
    "infinite-sample": (
        '[{"name": "a.latency", "value": 1.0, "unit": "us", "samples": [1.0, Infinity], '
        '"higher_is_better": false}]',
        ".samples[1]: expected a finite number, got inf",
    ),
    "string-value": (json.dumps([metric("a.b", "fast")]), ".value: expected a number, got str"),
    "boolean-value": (json.dumps([metric("a.b", True)]), ".value: expected a number, got bool"),
    "samples-not-list": (json.dumps([metric("a.b", 1.0) | {"samples": 3}]), "expected a list"),
    "name-without-case": (json.dumps([metric("latency", 1.0)]), "is not CASE.MEASURE"),
    "duplicate-name": (json.dumps([metric("a.b", 1.0), metric("a.b", 2.0)]), "appears twice"),
}


@pytest.mark.parametrize(("text", "problem"), BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_exits_2_naming_file_and_problem(text, problem, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    out = tmp_path / "record.json"
    assert main([str(bad), "-o", str(out)]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert str(bad) in error
    assert problem in error
    assert not out.exists()


def test_bad_input_keeps_the_previous_record(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[")
    out = tmp_path / "record.json"
    out.write_text("previous")
    assert main([str(bad), "-o", str(out)]) == EXIT_BAD_INPUT
    assert out.read_text() == "previous"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.json", "record.json"]


def test_missing_metric_list_exits_2(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "absent.json"), "-o", str(tmp_path / "out.json")]) == 2
    assert "absent.json' does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--env", "device"], "expected KEY=VALUE"),
        (["--env", "=NVIDIA H200"], "expected KEY=VALUE"),
        (["--created-at", "yesterday"], "expected an ISO 8601 time"),
        (["--created-at", "2026-12-02T17:51:36"], "has no time zone"),
    ],
    ids=["env-without-value", "env-without-key", "bad-time", "time-without-zone"],
)
def test_bad_options_exit_2(option, message, metrics_file: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main([str(metrics_file), "-o", str(tmp_path / "out.json"), *option])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_committed_baseline_is_the_committed_run_converted() -> None:
    baseline = load_record(BASELINE)
    converted = to_run_record(load_metric_list(MEASURED), environment={})
    assert (baseline.tests, baseline.metrics) == (converted.tests, converted.metrics)
    assert dict(baseline.environment) == {
        "device": "NVIDIA H200",
        "flashinfer": "0.6.13",
        "git_sha": MEASURING_COMMIT,
    }
    assert baseline.created_at == "2026-12-02T17:51:36+00:00"
    assert (len(baseline.tests), len(baseline.metrics)) == (29, 113)


def compare(run: Path, capsys) -> tuple[int, str]:
    status = reports_main(["compare", "--run", str(run), "--baseline", str(BASELINE)])
    return status, capsys.readouterr().out


@pytest.fixture
def slower_run(tmp_path: Path) -> Path:
    """The baseline with one case's Triton latency samples scaled by 1.2."""
    data = json.loads(BASELINE.read_text())
    latency = next(
        metric
        for metric in data["metrics"]
        if (metric["nodeid"], metric["name"]) == (f"{TOOL}::{CASE}", "triton.latency")
    )
    latency["samples"] = [sample * 1.2 for sample in latency["samples"]]
    latency["value"] *= 1.2
    data["run_id"] = "slower"
    path = tmp_path / "slower.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def failing_run(tmp_path: Path) -> Path:
    """The H200 metric list with one backend's relative error over the bound, converted."""
    metrics = json.loads(MEASURED.read_text())
    error = next(m for m in metrics if m["name"] == f"{CASE}.flashinfer.relative_error")
    error["value"] = 0.5
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps(metrics))
    path = tmp_path / "failing.json"
    assert main([str(measured), "-o", str(path), "--no-local-env"]) == EXIT_OK
    return path


def test_baseline_compared_with_itself_exits_0() -> None:
    """The README's command, as a GPU run would be compared."""
    command = [sys.executable, "-m", "attngroup.reports", "compare", "--run", str(BASELINE)]
    completed = subprocess.run(
        [*command, "--baseline", str(BASELINE)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "Verdict: OK" in completed.stdout


def test_one_latency_20_percent_slower_is_a_regression(slower_run: Path, capsys) -> None:
    status, out = compare(slower_run, capsys)
    assert status == 1
    assert "Metric regressions (1):" in out
    assert f"triton.latency [{TOOL}::{CASE}]: 166.4 us -> 199.7 us (+20.0 %" in out


def test_error_over_the_bound_is_a_new_failure(failing_run: Path, capsys) -> None:
    status, out = compare(failing_run, capsys)
    assert status == 1
    assert f"New failures (1):\n  {TOOL}::{CASE} (passed -> failed)" in out
    assert "flashinfer relative error 5.00e-01 not below 2e-02" in out


def test_html_report_shows_the_regression(slower_run: Path, tmp_path: Path, capsys) -> None:
    html = tmp_path / "report.html"
    argv = ["build", "--run", str(slower_run), "--baseline", str(BASELINE), "-o", str(html)]
    assert reports_main(argv) == 0
    assert "1 metric regressions" in capsys.readouterr().out
    assert f"{TOOL}::{CASE}" in html.read_text()


def test_a_cpu_run_is_recorded_as_cpu_on_a_gpu_machine(monkeypatch) -> None:
    """A benchmark run with --device cpu on a GPU machine must not be recorded (and so compared)
    as a GPU run."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H200")
    assert device_label(torch.device("cpu")).startswith("CPU: ")
    assert device_label(torch.device("cuda")) == "NVIDIA H200"
