"""This repository's own test areas: no dependency gaps, and measured selection recall.

Computed from whatever suites exist when the tests run; the import closures come from the
code, so a new import that a step does not declare fails here before it can hide a bug.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attngroup.ci.areas.config import load_run_config
from attngroup.ci.areas.load import load_test_areas
from attngroup.ci.deps.checker import check_dependencies
from attngroup.ci.selection.changes import ChangeSet
from attngroup.ci.selection.select_steps import Knobs, select_steps

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_run_config(REPO_ROOT / ".buildkite/ci_config.yaml", ".buildkite/ci_config.yaml")
AREAS = load_test_areas(CONFIG, REPO_ROOT)
STEP_KEYS = [step.key for step in AREAS.steps]
SPEC_DECODE_KEYS = {"spec-decode-cpu", "spec-decode-gpu-mtp"}


def _files_under(directory: str) -> list[str]:
    found = []
    for root, subdirs, files in os.walk(REPO_ROOT / directory):
        subdirs[:] = sorted(name for name in subdirs if name != "__pycache__")
        found.extend(Path(root, name).relative_to(REPO_ROOT).as_posix() for name in sorted(files))
    return found


@pytest.fixture(scope="module")
def report():
    return check_dependencies(AREAS, CONFIG, REPO_ROOT)


def _select_for(path: str) -> set[str]:
    changes = ChangeSet("main", "HEAD", "merge-base", (path,))
    return select_steps(AREAS, CONFIG, changes, Knobs()).selected_keys()


@pytest.mark.parametrize("key", STEP_KEYS)
def test_step_declares_everything_its_tests_import(report, key):
    step = next(step for step in report.steps if step.key == key)
    assert step.gaps == (), "\n".join(f"{gap.path} (add {gap.suggestion})" for gap in step.gaps)


@pytest.mark.parametrize("key", STEP_KEYS)
def test_step_paths_and_filters_select_existing_tests(report, key):
    step = next(step for step in report.steps if step.key == key)
    assert step.missing_declared == ()
    assert step.problems == ()


def test_every_test_is_run_by_some_step(report):
    assert report.orphan_tests == ()


@pytest.mark.parametrize("path", _files_under("attngroup/kernels"))
def test_kernels_change_selects_spec_decode_steps(path):
    assert _select_for(path) >= SPEC_DECODE_KEYS


def test_measured_recall_of_one_file_changes_is_complete(report, record_property):
    """For each source file: every step whose import closure holds it must be selected."""
    sources = sorted(
        {path for closure in report.closures.values() for path in closure} | set(_python_sources())
    )
    misses = [
        f"{path}: {key}"
        for path in sources
        for key in sorted(_needing(report, path) - _select_for(path))
    ]
    pairs = sum(len(_needing(report, path)) for path in sources)
    record_property("recall_files_checked", len(sources))
    record_property("recall_step_file_pairs", pairs)
    print(
        f"recall: {len(sources)} source files, {pairs} (file, step) pairs, "
        f"{pairs - len(misses)} selected ({100 * (pairs - len(misses)) / max(pairs, 1):.1f} %)"
    )
    assert len(sources) > 0
    assert misses == []


def _needing(report, path: str) -> set[str]:
    return {key for key, closure in report.closures.items() if path in closure}


def _python_sources() -> list[str]:
    return [
        path
        for directory in ("kernels", "reference_engine", "suites", "ci", "reports", "tests")
        for path in _files_under(directory)
        if path.endswith(".py")
    ]
