"""The model pair x check matrix: one row per pair, each test once, honest cell colours."""

from __future__ import annotations

import pytest

from reports.compare import compare_runs
from reports.matrix import NO_PAIR, area_of, build_matrix, cell_status
from tests.reports.records import make_run, make_test

PAIRS = ("gemma4-e2b-mtp", "qwen3-mtp")


def case(nodeid: str, outcome: str = "passed", markers=("grouping",), **fields: str):
    return make_test(nodeid, outcome, fields=fields, markers=markers)


@pytest.fixture(scope="module")
def matrix():
    tests = [
        # a pair spread over three backends and two dtypes, as the suites run it
        *(
            case(
                f"suites/spec_decode/test_g.py::test_greedy[{pair}-{backend}-{dtype}]",
                outcome,
                markers=("spec_decode", "mtp"),
                pair=pair,
                backend=backend,
                dtype=dtype,
            )
            for pair in PAIRS
            for backend, dtype, outcome in (
                ("torch", "fp32", "passed"),
                ("triton", "fp32", "passed"),
                ("flashinfer", "bf16", "skipped"),
            )
        ),
        *(
            case(f"suites/grouping/test_a.py::test_groups[{pair}-tp1]", pair=pair, tp="1")
            for pair in PAIRS
        ),
        # the merged-group hazard tests carry both grouping and kernels markers
        *(
            case(
                f"suites/kernels/test_merged_group_hazard.py::test_hazard[{i}]",
                markers=("gpu", "grouping", "kernels", "mtp"),
                pair="gemma4-e2b-mtp",
                backend="triton",
                dtype="fp32",
            )
            for i in range(8)
        ),
        # 30 skipped-only kernel tests without a pair, more than any tooltip used to hold
        *(
            case(
                f"suites/kernels/test_f.py::test_flashinfer[{i}]",
                "skipped",
                markers=("kernels", "gpu"),
                backend="flashinfer",
                dtype="bf16",
            )
            for i in range(30)
        ),
        case("suites/engine_units/test_s.py::test_scheduler", markers=()),
        case("tests/ci/test_select.py::test_rule", "failed", markers=()),
    ]
    return build_matrix(compare_runs(make_run(*tests), None))


def cell_of(matrix, pair: str, area: str):
    [row] = [row for row in matrix.rows if row.pair == pair]
    return row.cells[matrix.areas.index(area)]


def test_one_row_per_pair_and_one_for_the_rest_last(matrix):
    assert [row.pair for row in matrix.rows] == [*PAIRS, NO_PAIR]


def test_areas_are_checks_then_folders_then_harness(matrix):
    assert matrix.areas == ("grouping", "kernels", "spec_decode", "engine_units", "harness")
    assert matrix.area_labels == ("Grouping", "Kernels", "Spec decode", "Engine units", "Harness")


def test_every_test_counts_once(matrix):
    counted = [
        test.nodeid for row in matrix.rows for cell in row.cells if cell for test in cell.tests
    ]
    assert len(counted) == len(set(counted)) == 6 + 2 + 8 + 30 + 2


def test_hazard_tests_count_under_their_folders_area(matrix):
    kernels = cell_of(matrix, "gemma4-e2b-mtp", "kernels")
    assert len(kernels.tests) == 8
    grouping = cell_of(matrix, "gemma4-e2b-mtp", "grouping")
    assert [test.nodeid for test in grouping.tests] == [
        "suites/grouping/test_a.py::test_groups[gemma4-e2b-mtp-tp1]"
    ]


def test_cell_is_split_by_backend_and_dtype(matrix):
    cell = cell_of(matrix, "qwen3-mtp", "spec_decode")
    assert [(part.label, part.status) for part in cell.parts] == [
        ("flashinfer bf16", "skipped"),
        ("torch fp32", "passed"),
        ("triton fp32", "passed"),
    ]
    assert cell.status == "partly skipped"
    assert cell.summary == "2 passed, 1 skipped"


def test_skipped_only_cell_reads_as_skipped_with_every_test(matrix):
    cell = cell_of(matrix, NO_PAIR, "kernels")
    assert cell.status == "skipped"
    assert len(cell.tests) == 30  # none cut off


def test_failure_wins_and_missing_cells_are_empty(matrix):
    assert cell_of(matrix, NO_PAIR, "harness").status == "failed"
    assert cell_of(matrix, "qwen3-mtp", "kernels") is None


@pytest.mark.parametrize(
    ("counts", "status"),
    [
        ({"passed": 2, "skipped": 48}, "partly skipped"),
        ({"skipped": 3}, "skipped"),
        ({"passed": 3}, "passed"),
        ({"passed": 3, "failed": 1, "skipped": 2}, "failed"),
        ({"xfailed": 1}, "xfailed"),
        ({"not selected": 4}, "not selected"),
        ({"skipped": 1, "not selected": 4}, "skipped"),
    ],
)
def test_cell_status(counts, status):
    assert cell_status(counts) == status


@pytest.mark.parametrize(
    ("nodeid", "markers", "area"),
    [
        ("suites/kernels/test_h.py::t", ("grouping", "kernels"), "kernels"),
        ("suites/spec_decode/test_h.py::t", ("grouping", "kernels"), "grouping"),
        ("suites/engine_runner/test_r.py::t", (), "engine_runner"),
        ("tests/reports/test_x.py::t", (), "harness"),
        ("test_top.py::t", (), "other"),
    ],
)
def test_area_of(nodeid, markers, area):
    assert area_of(nodeid, markers) == area
