"""The suites' tests say what they are about (``@pytest.mark.case``, ``attngroup/suites/cases.py``)
and the run record's matrix puts them there: real suite files collected by pytest with
the run-record plugin (every test deselected, so nothing runs), then the matrix built.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from attngroup.reports.compare import compare_runs
from attngroup.reports.record import RunRecord, load_record
from attngroup.reports.render.matrix import NO_PAIR, OutcomeMatrix, build_matrix
from attngroup.suites.cases import CaseArgumentError, case_of
from tests.pytest_subprocess import PYTEST

REPO_ROOT = Path(__file__).resolve().parents[1]
SUITE_FILES = (
    "attngroup/suites/kernels/test_step_metadata.py",  # a parameter of two batches, once called pair
    "attngroup/suites/kernels/test_merged_group_hazard.py",  # pair, backend and dtype arguments
    "attngroup/suites/spec_decode/test_memory.py",  # backend and dtype named by case_marks only
    "attngroup/suites/grouping/test_grouping_conformance.py",  # pair_name, tp and the policy
    # engine units: the spec-decode column only for those about drafting and verifying
    "attngroup/suites/engine_units/test_scheduler.py",
    "attngroup/suites/engine_units/test_block_manager.py",
    "attngroup/suites/engine_units/test_sampler.py",
    "attngroup/suites/engine_units/test_engine_loop.py",
    "attngroup/suites/engine_units/test_rejection_sampler.py",
    "attngroup/suites/engine_units/test_drafters.py",
)
DESELECT_ALL = ("-k", "no_test_is_called_this")  # collected and recorded, none run
NOT_PAIRS = ("large-then-small", "small-then-large", "padding-reset-after-fuller-step")


@pytest.fixture(scope="module")
def suite_record(tmp_path_factory: pytest.TempPathFactory) -> RunRecord:
    path = tmp_path_factory.mktemp("cases") / "run.json"
    completed = subprocess.run(
        [*PYTEST, "-q", *SUITE_FILES, *DESELECT_ALL, "--run-record", str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, completed.stdout
    return load_record(path)


@pytest.fixture(scope="module")
def matrix(suite_record: RunRecord) -> OutcomeMatrix:
    return build_matrix(compare_runs(suite_record, None))


def _part_of(matrix: OutcomeMatrix, nodeid: str) -> tuple[str, str, str, str]:
    """(row, column, backend, dtype) of the one cell part that holds ``nodeid``."""
    (found,) = [
        (row.pair, cell.area, part.backend, part.dtype)
        for row in matrix.rows
        for cell in row.cells
        if cell is not None
        for part in cell.parts
        if any(test.nodeid == nodeid for test in part.tests)
    ]
    return found


@pytest.mark.parametrize(
    ("nodeid", "expected"),
    [
        pytest.param(
            "attngroup/suites/spec_decode/test_memory.py::test_preemption_by_recompute_keeps_tokens"
            "[qwen3-next-mtp-torch-fp32-k3]",
            ("qwen3-next-mtp", "spec_decode", "torch", "fp32"),
            id="case-marks",
        ),
        pytest.param(
            "attngroup/suites/kernels/test_merged_group_hazard.py::test_merged_group_hazard"
            "[gemma4-e2b-mtp-full-d512-triton-fp32-target-builder-serves-draft-verify]",
            ("gemma4-e2b-mtp", "kernels", "triton", "fp32"),
            id="pair-backend-dtype-arguments",
        ),
        pytest.param(
            "attngroup/suites/grouping/test_grouping_conformance.py::test_every_layer_in_exactly_one_group"
            "[split-llama3-eagle-tp2]",
            ("llama3-eagle", "grouping", "—", "—"),
            id="pair-name-argument",
        ),
        pytest.param(
            "attngroup/suites/kernels/test_step_metadata.py::test_second_step_matches_the_reference"
            "[large-then-small]",
            (NO_PAIR, "kernels", "—", "—"),
            id="two-steps-no-pair",
        ),
    ],
)
def test_marked_test_lands_in_its_row_and_cell(matrix, nodeid: str, expected: tuple) -> None:
    assert _part_of(matrix, nodeid) == expected


@pytest.mark.parametrize(
    ("prefix", "column"),
    [
        pytest.param("engine_units/test_scheduler.py::", "engine_units", id="scheduler"),
        pytest.param("engine_units/test_block_manager.py::", "engine_units", id="block-manager"),
        pytest.param("engine_units/test_sampler.py::", "engine_units", id="sampler"),
        pytest.param(
            "engine_units/test_engine_loop.py::test_chunked_prefill",
            "engine_units",
            id="loop-chunking",
        ),
        pytest.param(
            "engine_units/test_engine_loop.py::test_rejected_drafts",
            "spec_decode",
            id="loop-drafts",
        ),
        pytest.param("engine_units/test_rejection_sampler.py::", "spec_decode", id="rejection"),
        pytest.param("engine_units/test_drafters.py::", "spec_decode", id="drafters"),
    ],
)
def test_only_spec_decode_units_land_in_the_spec_decode_column(
    suite_record: RunRecord, matrix, prefix: str, column: str
) -> None:
    nodeids = [
        test.nodeid
        for test in suite_record.tests
        if test.nodeid.startswith(f"attngroup/suites/{prefix}")
    ]
    assert nodeids, f"no test collected under {prefix}"
    assert {_part_of(matrix, nodeid)[1] for nodeid in nodeids} == {column}


def test_test_parameters_never_become_pairs(suite_record: RunRecord, matrix) -> None:
    assert not {row.pair for row in matrix.rows} & set(NOT_PAIRS)
    step_tests = [test for test in suite_record.tests if "test_second_step" in test.nodeid]
    assert len(step_tests) == len(NOT_PAIRS)
    assert all("pair" not in test.fields for test in step_tests)


def test_fields_come_from_the_marker(suite_record: RunRecord) -> None:
    (test,) = [
        test
        for test in suite_record.tests
        if test.nodeid.endswith("test_every_layer_in_exactly_one_group[split-llama3-eagle-tp2]")
    ]
    assert dict(test.fields) == {
        "pair": "llama3-eagle",
        "tp": "2",
        "policy": "split",
        "engine": "reference",
    }


def test_a_pair_argument_that_holds_no_model_pair_is_refused() -> None:
    with pytest.raises(CaseArgumentError, match="'large-then-small', not a model pair"):
        case_of("attngroup/suites/x.py::test[large-then-small]", {"pair": "large-then-small"})
