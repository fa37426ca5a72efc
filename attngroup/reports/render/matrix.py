"""The model pair x check-area matrix: one row per model pair, one column per check area.

A test counts once, in one area: the check marker it carries (grouping, kernels, spec
decode, HF parity); with several, the one its suite folder is named after, else the first
in ``CHECKS`` order; with none, its folder (``attngroup/suites/engine_units`` -> engine units,
``tests/`` -> harness). Inside a cell the tests are split by backend and dtype, each part
with its counts. Tests that were not run because they were not selected stay visible as
grey parts, and a cell whose tests were all skipped reads as skipped, never as a pass.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from attngroup.reports.compare import Comparison

CHECKS = ("grouping", "kernels", "spec_decode", "hf_parity")
AREA_LABELS = {
    "grouping": "Grouping",
    "kernels": "Kernels",
    "spec_decode": "Spec decode",
    "hf_parity": "HF parity",
    "harness": "Harness",
    "other": "Other",
}
HARNESS_FOLDER = "tests"  # the harness's own tests (ci, reports, CLIs)
SUITES_FOLDER = "suites"  # the conformance suites: the folder below it is the area
NO_PAIR = "no model pair"  # the row of tests that are not about one pair
NO_VALUE = "—"
ANY_BACKEND = "any backend"  # the part of tests that name neither backend nor dtype
# Count order in a cell, worst first.
OUTCOME_ORDER = (
    "adapter_error",
    "failed",
    "error",
    "flaky",
    "xpassed",
    "passed",
    "xfailed",
    "skipped",
    "not selected",
)
SHORT_OUTCOMES = {  # how a count reads inside a cell: "3 pass", "48 skip"
    "adapter_error": "harness error",
    "failed": "fail",
    "error": "error",
    "flaky": "flaky",
    "xpassed": "xpass",
    "passed": "pass",
    "xfailed": "xfail",
    "skipped": "skip",
    "not selected": "not run",
}


def cell_status(counts: Mapping[str, int]) -> str:
    """One word for a set of outcomes: the worst problem, else how much of it really ran."""
    for problem in ("adapter_error", "failed", "error", "flaky", "xpassed"):
        if counts.get(problem):
            return problem
    ran = counts.get("passed", 0) + counts.get("xfailed", 0)
    if ran and counts.get("skipped"):
        return "partly skipped"
    if counts.get("passed"):
        return "passed"
    if counts.get("xfailed"):
        return "xfailed"
    if counts.get("skipped"):
        return "skipped"
    return "not selected"


@dataclass(frozen=True)
class CellTest:
    nodeid: str
    status: str


class _HasTests(Protocol):
    """Read-only, so that a field (``CellPart``) and a property (``MatrixCell``) both fit."""

    @property
    def tests(self) -> tuple[CellTest, ...]: ...


class _CountedTests:
    """Counts by status and the colour of a set of tests: a cell, or one backend and
    dtype inside it."""

    @property
    def counts(self: _HasTests) -> tuple[tuple[str, int], ...]:
        return _ordered_counts(test.status for test in self.tests)

    @property
    def status(self: _HasTests) -> str:
        return cell_status(Counter(test.status for test in self.tests))


@dataclass(frozen=True)
class CellPart(_CountedTests):
    """The tests of one backend and dtype inside a cell."""

    backend: str
    dtype: str
    tests: tuple[CellTest, ...]

    @property
    def label(self) -> str:
        return " ".join(v for v in (self.backend, self.dtype) if v != NO_VALUE) or ANY_BACKEND


@dataclass(frozen=True)
class MatrixCell(_CountedTests):
    pair: str
    area: str
    parts: tuple[CellPart, ...]  # sorted by backend, then dtype

    @property
    def tests(self) -> tuple[CellTest, ...]:
        return tuple(test for part in self.parts for test in part.tests)

    @property
    def summary(self) -> str:
        return ", ".join(f"{count} {status}" for status, count in self.counts)

    @property
    def is_split(self) -> bool:
        """Whether the parts say more than the total: some test names a backend or dtype."""
        return any(part.label != ANY_BACKEND for part in self.parts)


@dataclass(frozen=True)
class MatrixRow:
    pair: str
    cells: tuple[MatrixCell | None, ...]  # one per area column; None: no such test


@dataclass(frozen=True)
class OutcomeMatrix:
    areas: tuple[str, ...]
    rows: tuple[MatrixRow, ...]

    @property
    def area_labels(self) -> tuple[str, ...]:
        return tuple(area_label(area) for area in self.areas)


def area_label(area: str) -> str:
    return AREA_LABELS.get(area, area.replace("_", " ").capitalize())


def area_of(nodeid: str, markers: Iterable[str]) -> str:
    """The one check area a test counts in (see the module docstring)."""
    folders = nodeid.split("::", 1)[0].split("/")[:-1]
    marked = [check for check in CHECKS if check in set(markers)]
    if marked:
        return next((check for check in marked if check in folders), marked[0])
    if folders and folders[0] == HARNESS_FOLDER:
        return "harness"
    if SUITES_FOLDER in folders[:-1]:
        return folders[folders.index(SUITES_FOLDER) + 1]  # [.../]attngroup/suites/<area>/...
    return "other"


def build_matrix(comparison: Comparison) -> OutcomeMatrix:
    flaky = {change.nodeid for change in comparison.flaky}
    # (pair, area) -> (backend, dtype) -> tests
    cells: dict[tuple[str, str], dict[tuple[str, str], list[CellTest]]] = defaultdict(
        lambda: defaultdict(list)
    )

    def add(nodeid: str, fields: Mapping[str, str], markers: Sequence[str], status: str) -> None:
        pair = fields.get("pair") or NO_PAIR
        part = (fields.get("backend") or NO_VALUE, fields.get("dtype") or NO_VALUE)
        cells[(pair, area_of(nodeid, markers))][part].append(CellTest(nodeid, status))

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

    present = {area for _, area in cells}
    areas = (
        *(check for check in CHECKS if check in present),
        *sorted(present - {*CHECKS, "harness", "other"}),
        *(area for area in ("harness", "other") if area in present),
    )
    pairs = sorted({pair for pair, _ in cells}, key=lambda pair: (pair == NO_PAIR, pair))
    rows = tuple(
        MatrixRow(
            pair=pair,
            cells=tuple(
                _cell(pair, area, cells[(pair, area)]) if (pair, area) in cells else None
                for area in areas
            ),
        )
        for pair in pairs
    )
    return OutcomeMatrix(areas=areas, rows=rows)


def _cell(pair: str, area: str, parts: Mapping[tuple[str, str], list[CellTest]]) -> MatrixCell:
    return MatrixCell(
        pair=pair,
        area=area,
        parts=tuple(
            CellPart(
                backend=backend,
                dtype=dtype,
                tests=tuple(sorted(tests, key=lambda test: test.nodeid)),
            )
            for (backend, dtype), tests in sorted(parts.items())
        ),
    )


def _ordered_counts(statuses: Iterable[str]) -> tuple[tuple[str, int], ...]:
    counts = Counter(statuses)
    return tuple((status, counts[status]) for status in OUTCOME_ORDER if counts[status])
