"""The model-pair x check outcome matrix (rows per pair, backend and dtype).

A check is what a test verifies (grouping, kernels, spec decode, HF parity), taken from
its markers, else from the suite folder it lives in. Tests that were not run because
they were not selected stay visible as grey cells, so absence never looks green.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from reports.compare import Comparison

CHECKS = ("grouping", "kernels", "spec_decode", "hf_parity")
CHECK_LABELS = {
    "grouping": "Grouping",
    "kernels": "Kernels",
    "spec_decode": "Spec decode",
    "hf_parity": "HF parity",
    "other": "Other",
}
# Worst first: a cell shows the worst status among its tests.
STATUS_ORDER = (
    "failed",
    "error",
    "flaky",
    "xpassed",
    "passed",
    "xfailed",
    "skipped",
    "not selected",
)
NO_VALUE = "—"
TOOLTIP_TESTS = 25


@dataclass(frozen=True)
class MatrixCell:
    status: str
    counts: tuple[tuple[str, int], ...]  # (status, number of tests), worst first
    nodeids: tuple[str, ...]

    @property
    def summary(self) -> str:
        return " ".join(f"{count} {status}" for status, count in self.counts)

    @property
    def tooltip(self) -> str:
        shown = self.nodeids[:TOOLTIP_TESTS]
        more = len(self.nodeids) - len(shown)
        return "\n".join([*shown, f"… and {more} more"] if more else shown)


@dataclass(frozen=True)
class MatrixRow:
    pair: str
    backend: str
    dtype: str
    cells: tuple[MatrixCell | None, ...]  # one per check column; None: no such test


@dataclass(frozen=True)
class OutcomeMatrix:
    checks: tuple[str, ...]
    rows: tuple[MatrixRow, ...]

    @property
    def check_labels(self) -> tuple[str, ...]:
        return tuple(CHECK_LABELS[check] for check in self.checks)


def checks_of(nodeid: str, markers: Iterable[str]) -> tuple[str, ...]:
    marked = tuple(check for check in CHECKS if check in set(markers))
    if marked:
        return marked
    folders = nodeid.split("::", 1)[0].split("/")[:-1]
    return tuple(check for check in CHECKS if check in folders)[:1] or ("other",)


def build_matrix(comparison: Comparison) -> OutcomeMatrix:
    flaky = {change.nodeid for change in comparison.flaky}
    entries: list[tuple[tuple[str, str, str], str, str, str]] = []  # (row key, check, status, id)

    def add(nodeid: str, fields: Mapping[str, str], markers: Iterable[str], status: str) -> None:
        row = tuple(fields.get(name, NO_VALUE) for name in ("pair", "backend", "dtype"))
        entries.extend((row, check, status, nodeid) for check in checks_of(nodeid, markers))

    for test in comparison.run.tests:
        if test.outcome == "deselected":
            status = "not selected"
        elif test.nodeid in flaky and test.outcome == "passed":
            status = "flaky"
        else:
            status = test.outcome
        add(test.nodeid, test.fields, test.markers, status)
    for change in comparison.not_selected:
        if change.current_outcome is None:  # only in the baseline; deselected ones are above
            add(change.nodeid, change.fields, change.markers, "not selected")

    grouped: dict[tuple[tuple[str, str, str], str], list[tuple[str, str]]] = defaultdict(list)
    for row, check, status, nodeid in entries:
        grouped[(row, check)].append((status, nodeid))
    checks = tuple(c for c in (*CHECKS, "other") if any(check == c for _, check in grouped))
    row_keys = sorted(
        {row for row, _ in grouped}, key=lambda key: (*(v == NO_VALUE for v in key), *key)
    )
    rows = tuple(
        MatrixRow(
            *key,
            cells=tuple(_cell(grouped[(key, c)]) if (key, c) in grouped else None for c in checks),
        )
        for key in row_keys
    )
    return OutcomeMatrix(checks=checks, rows=rows)


def _cell(members: list[tuple[str, str]]) -> MatrixCell:
    counts = Counter(status for status, _ in members)
    ordered = tuple((status, counts[status]) for status in STATUS_ORDER if counts[status])
    return MatrixCell(
        status=ordered[0][0], counts=ordered, nodeids=tuple(sorted(n for _, n in members))
    )
