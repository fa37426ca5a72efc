"""The model pair x check matrix: one row per pair, each test once, honest cell colours."""

from __future__ import annotations

import pytest

from attngroup.reports.compare import compare_runs
from attngroup.reports.render.matrix import NO_PAIR, area_of, build_matrix, cell_status
from tests.reports.records import (
    HAZARD_TESTS,
    MATRIX_PAIRS,
    SKIPPED_KERNEL_TESTS,
    matrix_run,
)


@pytest.fixture(scope="module")
def matrix():
    return build_matrix(compare_runs(matrix_run(), None))


def cell_of(matrix, pair: str, area: str):
    [row] = [row for row in matrix.rows if row.pair == pair]
    return row.cells[matrix.areas.index(area)]


def test_one_row_per_pair_and_one_for_the_rest_last(matrix):
    assert [row.pair for row in matrix.rows] == [*sorted(MATRIX_PAIRS), NO_PAIR]


def test_test_parameters_are_no_pairs(matrix):
    cell = cell_of(matrix, NO_PAIR, "kernels")
    assert sum("test_step_metadata" in test.nodeid for test in cell.tests) == 3


def test_areas_are_checks_then_folders_then_harness(matrix):
    assert matrix.areas == (
        "grouping",
        "kernels",
        "spec_decode",
        "hf_parity",
        "engine_units",
        "harness",
    )
    assert matrix.area_labels[3:] == ("HF parity", "Engine units", "Harness")


def test_every_test_counts_once(matrix):
    counted = [
        test.nodeid for row in matrix.rows for cell in row.cells if cell for test in cell.tests
    ]
    assert len(counted) == len(set(counted)) == len(matrix_run().tests)


def test_hazard_tests_count_under_their_folders_area(matrix):
    assert len(cell_of(matrix, "gemma4-e2b-mtp", "kernels").tests) == HAZARD_TESTS
    grouping = cell_of(matrix, "gemma4-e2b-mtp", "grouping")
    assert all("test_grouping_conformance" in test.nodeid for test in grouping.tests)


def test_cell_is_split_by_backend_and_dtype(matrix):
    cell = cell_of(matrix, "qwen3-mtp", "spec_decode")
    assert [(part.label, part.status) for part in cell.parts] == [
        ("flashinfer bf16", "skipped"),
        ("torch bf16", "skipped"),
        ("torch fp32", "passed"),
        ("triton fp32", "passed"),
    ]
    assert cell.status == "partly skipped"
    assert cell.summary == "4 passed, 4 skipped"


def test_skipped_only_cell_reads_as_skipped_with_every_test(matrix):
    cell = cell_of(matrix, NO_PAIR, "kernels")
    [flashinfer] = [part for part in cell.parts if part.label == "flashinfer bf16"]
    assert flashinfer.status == "skipped"
    assert len(flashinfer.tests) == SKIPPED_KERNEL_TESTS  # none cut off
    assert cell.status == "partly skipped"  # 3 passed beside them: never plain green
    assert cell_of(matrix, "qwen3-mtp", "hf_parity").status == "skipped"


def test_failure_wins_and_missing_cells_are_empty(matrix):
    assert cell_of(matrix, "llama3-eagle", "grouping").status == "failed"
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
        ("attngroup/suites/kernels/test_h.py::t", ("grouping", "kernels"), "kernels"),
        ("attngroup/suites/spec_decode/test_h.py::t", ("grouping", "kernels"), "grouping"),
        ("attngroup/suites/engine_runner/test_r.py::t", (), "engine_runner"),
        ("tests/reports/test_x.py::t", (), "harness"),
        ("test_top.py::t", (), "other"),
    ],
)
def test_area_of(nodeid, markers, area):
    assert area_of(nodeid, markers) == area


def test_parts_are_shown_only_when_tests_name_a_backend_or_dtype(matrix):
    assert not cell_of(matrix, "qwen3-mtp", "grouping").is_split
    assert cell_of(matrix, "qwen3-mtp", "spec_decode").is_split
