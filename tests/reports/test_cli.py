"""``python -m reports build|compare``: exit codes, JSON output, never a broken report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reports.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_REGRESSION, main
from reports.record import record_to_json, write_record
from tests.reports.records import (
    HOSTILE_SELECTION,
    hostile_history,
    make_metric,
    make_run,
    noisy_samples,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def records(tmp_path) -> dict[str, Path]:
    baseline, current = hostile_history()
    clean = make_run(
        *baseline.tests,
        metrics=(make_metric(noisy_samples(1.01, 0.02, 12, seed=9)),),
        run_id="clean",
    )
    paths = {
        name: write_record(run, tmp_path / f"{name}.json")
        for name, run in (("baseline", baseline), ("current", current), ("clean", clean))
    }
    paths["selection"] = tmp_path / "selection.json"
    paths["selection"].write_text(json.dumps(HOSTILE_SELECTION))
    paths["truncated"] = tmp_path / "truncated.json"
    paths["truncated"].write_text(paths["current"].read_text()[:200])
    paths["foreign"] = tmp_path / "foreign.json"
    paths["foreign"].write_text(json.dumps({"schema": "something-else", "tests": []}))
    paths["missing"] = tmp_path / "missing.json"
    return paths


def test_compare_exits_1_on_planted_regression(records, capsys):
    assert (
        main(["compare", "--run", str(records["current"]), "--baseline", str(records["baseline"])])
        == 1
    )
    out = capsys.readouterr().out
    assert "New failures (1):" in out
    assert "Metric regressions (1):" in out
    assert "Verdict: REGRESSION" in out


def test_compare_exits_0_when_only_noise_changed(records, capsys):
    assert (
        main(["compare", "--run", str(records["clean"]), "--baseline", str(records["baseline"])])
        == EXIT_OK
    )
    assert "Verdict: OK" in capsys.readouterr().out


def test_compare_json(records, capsys):
    code = main(
        [
            "compare",
            "--run",
            str(records["current"]),
            "--baseline",
            str(records["baseline"]),
            "--json",
        ]
    )
    assert code == EXIT_REGRESSION
    document = json.loads(capsys.readouterr().out)
    assert [f["nodeid"] for f in document["new_failures"]] == [
        record_to_json(hostile_history()[1])["tests"][0]["nodeid"]
    ]
    assert [f["nodeid"] for f in document["fixed"]] == [
        "suites/kernels/test_k.py::test_decode[flashinfer-bf16]"
    ]
    [metric] = document["metric_regressions"]
    assert metric["name"] == "decode_latency" and metric["significant"] is True


@pytest.mark.parametrize("bad", ["truncated", "foreign", "missing"])
@pytest.mark.parametrize("role", ["--run", "--baseline", "--selection"])
def test_bad_input_exits_2_and_keeps_the_previous_report(records, tmp_path, capsys, bad, role):
    output = tmp_path / "report.html"
    good = [
        "build",
        "--run",
        str(records["current"]),
        "--baseline",
        str(records["baseline"]),
        "--selection",
        str(records["selection"]),
        "-o",
        str(output),
    ]
    assert main(good) == EXIT_OK
    previous = output.read_bytes()
    broken = list(good)
    broken[broken.index(role) + 1] = str(records[bad])
    capsys.readouterr()
    assert main(broken) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith("error: ")
    assert output.read_bytes() == previous


def test_compare_with_bad_input_exits_2(records, capsys):
    assert (
        main(
            ["compare", "--run", str(records["truncated"]), "--baseline", str(records["baseline"])]
        )
        == 2
    )
    assert "not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(["compare", "--run", "x.json"], id="compare-without-baseline"),
        pytest.param(
            ["build", "--run", "x.json", "--baseline", "b.json", "--history", "h", "-o", "r.html"],
            id="baseline-and-history",
        ),
        pytest.param(
            ["compare", "--run", "x.json", "--baseline", "b", "--threshold", "latency"],
            id="bad-threshold",
        ),
        pytest.param(
            ["compare", "--run", "x.json", "--baseline", "b", "--default-threshold", "-1"],
            id="negative-threshold",
        ),
    ],
)
def test_usage_errors_exit_2(arguments):
    with pytest.raises(SystemExit) as exit_info:
        main(arguments)
    assert exit_info.value.code == EXIT_BAD_INPUT


def test_build_with_history_uses_latest_earlier_run(records, tmp_path, capsys):
    history = tmp_path / "history"
    history.mkdir()
    for name in ("baseline", "current"):  # the current run may already be archived
        (history / f"{name}.json").write_text(records[name].read_text())
    output = tmp_path / "report.html"
    assert (
        main(
            [
                "build",
                "--run",
                str(records["current"]),
                "--history",
                str(history),
                "-o",
                str(output),
            ]
        )
        == 0
    )
    assert "1 new failures, 1 metric regressions" in capsys.readouterr().out
    assert "baseline <code>bbbbbbbbbb</code>" in output.read_text()


def test_build_with_empty_history_reports_the_run_alone(records, tmp_path, capsys):
    output = tmp_path / "report.html"
    code = main(
        [
            "build",
            "--run",
            str(records["current"]),
            "--history",
            str(tmp_path / "none"),
            "-o",
            str(output),
        ]
    )
    assert code == EXIT_OK
    assert "no earlier run" in capsys.readouterr().err
    assert "no baseline" in output.read_text()


def test_module_entry_point(records):
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "reports",
            "compare",
            "--run",
            str(records["current"]),
            "--baseline",
            str(records["baseline"]),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == EXIT_REGRESSION, completed.stderr
    assert "Verdict: REGRESSION" in completed.stdout


def test_threshold_option_silences_a_regression(records):
    arguments = [
        "compare",
        "--run",
        str(records["current"]),
        "--baseline",
        str(records["baseline"]),
    ]
    assert (
        main([*arguments, "--threshold", "decode=50%"]) == EXIT_REGRESSION
    )  # the new failure remains
    only_metric = make_run(
        *hostile_history()[0].tests, metrics=hostile_history()[1].metrics, run_id="m"
    )
    path = write_record(only_metric, records["current"].parent / "metric_only.json")
    assert (
        main(["compare", "--run", str(path), "--baseline", str(records["baseline"])])
        == EXIT_REGRESSION
    )
    assert (
        main(
            [
                "compare",
                "--run",
                str(path),
                "--baseline",
                str(records["baseline"]),
                "--threshold",
                "decode=50%",
            ]
        )
        == EXIT_OK
    )


def test_archive_keeps_the_newest_runs(records, tmp_path):
    history = tmp_path / "history"
    for name in ("baseline", "current", "clean"):
        assert (
            main(["archive", "--run", str(records[name]), "--history", str(history), "--keep", "2"])
            == 0
        )
    (history / "notes.json.bak").write_text("not ours")
    kept = sorted(path.name for path in history.iterdir())
    assert len(kept) == 3
    assert kept[-1] == "notes.json.bak"  # never touched
    assert [name.split("-", 1)[1] for name in kept[:2]] == ["clean.json", "current.json"]


def test_archive_refuses_a_broken_record(records, tmp_path, capsys):
    history = tmp_path / "history"
    assert main(["archive", "--run", str(records["truncated"]), "--history", str(history)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert not history.exists()
