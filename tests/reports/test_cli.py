"""``python -m attngroup.reports build|compare``: exit codes, JSON output, never a broken report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attngroup.reports.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_REGRESSION, main
from attngroup.reports.record import record_to_json, write_record
from tests.json_schemas import assert_matches_schema
from tests.reports.records import (
    HOSTILE_SELECTION,
    hostile_history,
    make_metric,
    make_run,
    make_test,
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
    assert_matches_schema(document, "reports-comparison")
    assert [f["nodeid"] for f in document["new_failures"]] == [
        record_to_json(hostile_history()[1])["tests"][0]["nodeid"]
    ]
    assert [f["nodeid"] for f in document["fixed"]] == [
        "attngroup/suites/kernels/test_k.py::test_decode[flashinfer-bf16]"
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
    assert "1 new failures, 1 metric regressions, 0 harness errors" in capsys.readouterr().out
    assert "baseline <code>bbbbbbbb 12-01 00:00:00</code>" in output.read_text()


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
            "attngroup.reports",
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


@pytest.mark.parametrize(
    ("recorded", "options", "expected"),
    [
        pytest.param(0.5, [], EXIT_OK, id="recorded-50pct"),
        pytest.param(0.5, ["--threshold", "decode=10%"], EXIT_REGRESSION, id="cli-beats-record"),
        pytest.param(0.1, ["--threshold", "decode=50%"], EXIT_OK, id="cli-beats-stricter-record"),
        pytest.param(0.5, ["--default-threshold", "10%"], EXIT_OK, id="record-beats-default"),
    ],
)
def test_command_line_threshold_wins_over_the_run_records(tmp_path, recorded, options, expected):
    """A metric 20 % slower whose run record carries its own threshold: a matching
    ``--threshold`` decides, then the recorded one, then ``--default-threshold``."""
    paths = []
    for run_id, value in (("baseline", 1.0), ("current", 1.2)):
        run = make_run(metrics=(make_metric(value=value, threshold=recorded),), run_id=run_id)
        paths.append(write_record(run, tmp_path / f"{run_id}.json"))
    argv = ["compare", "--run", str(paths[1]), "--baseline", str(paths[0]), *options]
    assert main(argv) == expected


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


@pytest.fixture
def benchmark_baseline(tmp_path) -> Path:
    benchmark = make_run(
        make_test("bench_attention::decode", markers=("bench",)),
        run_id="bench",
        kind="benchmark",
    )
    return write_record(benchmark, tmp_path / "benchmark.json")


@pytest.mark.parametrize("command", ["compare", "build"])
def test_records_of_different_kinds_are_refused(
    records, benchmark_baseline, tmp_path, capsys, command
):
    arguments = [command, "--run", str(records["current"]), "--baseline", str(benchmark_baseline)]
    if command == "build":
        arguments += ["-o", str(tmp_path / "report.html")]
    assert main(arguments) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert "is a pytest record" in error and "is a benchmark record" in error
    assert "--force" in error
    assert not (tmp_path / "report.html").exists()


def test_force_compares_different_kinds_with_a_warning(records, benchmark_baseline, capsys):
    code = main(
        [
            "compare",
            "--run",
            str(records["current"]),
            "--baseline",
            str(benchmark_baseline),
            "--force",
        ]
    )
    assert code == EXIT_REGRESSION  # the run's own failure is still judged
    out = capsys.readouterr().out
    assert "warning: a pytest run compared with a benchmark baseline (--force)" in out


def test_version_1_benchmark_record_is_a_benchmark(records, tmp_path, capsys):
    """Records written before the kind field get theirs from their tests."""
    data = record_to_json(make_run(make_test("bench_attention::decode", markers=("bench",))))
    del data["kind"]
    data["schema_version"] = 1
    old = tmp_path / "old-benchmark.json"
    old.write_text(json.dumps(data))
    arguments = ["compare", "--run", str(records["current"]), "--baseline", str(old)]
    assert main(arguments) == EXIT_BAD_INPUT
    assert "is a benchmark record" in capsys.readouterr().err


def test_corrupt_history_record_is_left_out_and_named(records, tmp_path, capsys):
    history = tmp_path / "history"
    history.mkdir()
    (history / "a-baseline.json").write_text(records["baseline"].read_text())
    (history / "b-broken.json").write_text('{"schema": ')
    output = tmp_path / "report.html"
    arguments = ["--run", str(records["current"]), "--history", str(history)]
    assert main(["build", *arguments, "-o", str(output)]) == EXIT_OK
    assert "warning: history file left out: run record" in capsys.readouterr().err
    html = output.read_text()
    assert "b-broken.json" in html and "not valid JSON" in html
    records_used = html[html.index('id="records-used"') :]
    assert "a-baseline.json" in records_used  # the baseline it used is named
    assert main(["compare", *arguments]) == EXIT_REGRESSION  # the baseline was still found
    assert "b-broken.json" in capsys.readouterr().out


def test_history_of_another_kind_is_left_out(records, benchmark_baseline, tmp_path, capsys):
    history = tmp_path / "history"
    history.mkdir()
    (history / "bench.json").write_text(benchmark_baseline.read_text())
    code = main(["compare", "--run", str(records["current"]), "--history", str(history)])
    assert code == EXIT_REGRESSION  # failures without a baseline
    captured = capsys.readouterr()
    assert "a benchmark record; this run is a pytest record" in captured.err
    assert "(no baseline)" in captured.out


@pytest.mark.parametrize(
    ("output", "message"),
    [
        pytest.param(
            "missing/report.html", "the folder '{tmp}/missing' does not exist", id="no-parent"
        ),
        pytest.param("folder", "is a directory; name a file inside it", id="a-directory"),
        pytest.param(
            "file.txt/report.html", "'{tmp}/file.txt' is a file, not a directory", id="under-a-file"
        ),
    ],
)
def test_bad_output_path_is_refused_before_any_work(tmp_path, capsys, output, message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("x")
    arguments = ["build", "--run", str(tmp_path / "no-such-run.json"), "-o", str(tmp_path / output)]
    assert main(arguments) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert error.startswith("error: output ") and error.count("\n") == 1
    assert message.format(tmp=tmp_path) in error
    assert "no-such-run" not in error  # the path was checked before the run was read
    assert "Errno" not in error and ".tmp" not in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "folder"]
    assert list((tmp_path / "folder").iterdir()) == []
