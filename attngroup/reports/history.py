"""A history folder of run records: baseline choice and flaky-test detection."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from attngroup.reports.record import (
    FAILING_OUTCOMES,
    PASSING_OUTCOMES,
    RecordError,
    RunRecord,
    TestResult,
    load_record,
    write_record,
)

FLAKY_WINDOW = 20  # most recent runs looked at for pass/fail flips
DEFAULT_KEEP = 100  # archived runs kept in a history folder
ARCHIVE_NAME = re.compile(r"\d{14}-[0-9A-Za-z_.-]+\.json")  # <UTC timestamp>-<run id>.json


@dataclass(frozen=True)
class History:
    """The usable run records of a history folder, oldest first, and what was left out."""

    records: tuple[RunRecord, ...] = ()
    skipped: tuple[str, ...] = ()  # one line per file left out: which file and why

    def of_kind(self, kind: str) -> History:
        """Only records of ``kind``: the others are left out, each with a line saying so."""
        return History(
            records=tuple(record for record in self.records if record.kind == kind),
            skipped=self.skipped
            + tuple(
                f"{record.source}: a {record.kind} record; this run is a {kind} record"
                for record in self.records
                if record.kind != kind
            ),
        )


def load_history(directory: str | Path) -> History:
    """All run records (``*.json``) in ``directory``, oldest first.

    A missing folder is an empty history (the first run on a fresh clone has none). A
    file that is not a valid run record is left out with a line naming it and the
    problem, so one corrupt file does not stop every later report.
    """
    folder = Path(directory)
    if not folder.exists():
        return History()
    if not folder.is_dir():
        raise RecordError(f"history {str(folder)!r} is not a directory")
    records, skipped = [], []
    for path in sorted(folder.glob("*.json")):
        try:
            records.append(load_record(path))
        except RecordError as error:
            skipped.append(str(error))
    return History(
        records=tuple(sorted(records, key=lambda record: (record.created_at, record.run_id))),
        skipped=tuple(skipped),
    )


def archive_run(run: RunRecord, directory: str | Path, keep: int = DEFAULT_KEEP) -> Path:
    """Add a (validated) run to a history folder; drop the oldest archived runs beyond ``keep``.

    Only files this function wrote (by their name pattern) are ever removed.
    """
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise RecordError(f"history {str(folder)!r} is not a directory")
    stamp = re.sub(r"\D", "", run.created_at)[:14].ljust(14, "0")
    safe_id = re.sub(r"[^0-9A-Za-z_.-]", "_", run.run_id)
    path = write_record(run, folder / f"{stamp}-{safe_id}.json")
    archived = sorted(p for p in folder.iterdir() if ARCHIVE_NAME.fullmatch(p.name))
    for old in archived[: max(0, len(archived) - keep)]:
        old.unlink()
    return path


def previous_runs(history: Sequence[RunRecord], run: RunRecord) -> tuple[RunRecord, ...]:
    """History without the current run (it may already have been archived there)."""
    return tuple(record for record in history if record.run_id != run.run_id)


def latest_baseline(history: Sequence[RunRecord], run: RunRecord) -> RunRecord | None:
    earlier = previous_runs(history, run)
    return earlier[-1] if earlier else None


def flaky_reasons(run: RunRecord, history: Sequence[RunRecord]) -> dict[str, str]:
    """Tests whose outcome is unstable, with why: mixed reruns here, or repeated flips.

    One pass->fail change is a regression (or a fix), not flakiness; two or more flips
    over the recent history are.
    """
    reasons = {
        test.nodeid: f"outcome changed across reruns in this run ({', '.join(_attempt_trail(test))})"
        for test in run.tests
        if _mixed(_attempt_trail(test))
    }
    recent = [*previous_runs(history, run)[-FLAKY_WINDOW:], run]
    outcomes_by_run = [record.test_by_nodeid() for record in recent]
    for test in run.tests:
        if test.nodeid in reasons:
            continue
        flips = _count_flips(test.nodeid, outcomes_by_run)
        if flips >= 2:
            reasons[test.nodeid] = (
                f"passed/failed flipped {flips} times over the last {len(recent)} runs"
            )
    return reasons


def _attempt_trail(test: TestResult) -> tuple[str, ...]:
    return (*test.attempts, test.outcome)


def _mixed(outcomes: Sequence[str]) -> bool:
    return any(o in PASSING_OUTCOMES for o in outcomes) and any(
        o in FAILING_OUTCOMES for o in outcomes
    )


def _count_flips(nodeid: str, outcomes_by_run: Sequence[Mapping[str, TestResult]]) -> int:
    verdicts = []
    for tests in outcomes_by_run:
        test = tests.get(nodeid)
        if test is None:
            continue
        if test.outcome in FAILING_OUTCOMES:
            verdicts.append(False)
        elif test.outcome in PASSING_OUTCOMES:
            verdicts.append(True)
    return sum(1 for before, after in itertools.pairwise(verdicts) if before != after)
