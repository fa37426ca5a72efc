"""History folders: ordering, baseline choice, and bad files."""

from __future__ import annotations

import pytest

from attngroup.reports.history import History, latest_baseline, load_history
from attngroup.reports.record import RecordError, write_record
from tests.reports.records import make_run, make_test


def test_history_is_ordered_by_time_and_excludes_the_current_run(tmp_path):
    runs = [
        make_run(make_test("a.py::t"), run_id=run_id, created_at=created)
        for run_id, created in [
            ("r2", "2026-11-02T00:00:00"),
            ("r1", "2026-11-01T00:00:00"),
            ("current", "2026-11-03T00:00:00"),
        ]
    ]
    for run in runs:
        write_record(run, tmp_path / f"{run.run_id}.json")
    history = load_history(tmp_path)
    assert [run.run_id for run in history.records] == ["r1", "r2", "current"]
    assert latest_baseline(history.records, runs[2]).run_id == "r2"


def test_missing_history_folder_is_empty(tmp_path):
    assert load_history(tmp_path / "never-written") == History()


def test_corrupt_record_in_history_is_left_out_with_its_name(tmp_path):
    write_record(make_run(run_id="ok"), tmp_path / "ok.json")
    (tmp_path / "broken.json").write_text('{"schema": ')
    history = load_history(tmp_path)
    assert [run.run_id for run in history.records] == ["ok"]
    [line] = history.skipped
    assert "broken.json" in line and "not valid JSON" in line


def test_records_of_another_kind_are_left_out_with_a_line_each(tmp_path):
    write_record(make_run(run_id="tests"), tmp_path / "tests.json")
    write_record(make_run(run_id="bench", kind="benchmark"), tmp_path / "bench.json")
    history = load_history(tmp_path).of_kind("pytest")
    assert [run.run_id for run in history.records] == ["tests"]
    assert history.skipped == (
        f"{tmp_path / 'bench.json'}: a benchmark record; this run is a pytest record",
    )


def test_history_path_that_is_a_file_is_an_error(tmp_path):
    path = tmp_path / "history.json"
    path.write_text("{}")
    with pytest.raises(RecordError, match="not a directory"):
        load_history(path)
