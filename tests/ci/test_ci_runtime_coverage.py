"""check-deps --coverage: coverage.py data with per-test contexts maps a changed line to the
tests that executed it, and those to the steps that run them, ahead of the static evidence."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attngroup.bugzoo.zoo import copy_tree
from attngroup.ci.deps.runtime_coverage import node_of_context
from tests.ci.helpers import RUN_CONFIG, commit_all, init_repo, run_cli
from tests.json_schemas import assert_matches_schema
from tests.pytest_subprocess import python_path

GROUPING = """\
def group_key(layer):
    if layer.get("draft"):
        return ("draft", layer["heads"])
    return ("target", layer["heads"])


def group_sizes(layers):
    return [layer["heads"] for layer in layers]
"""
DRAFT_LINE = 3  # executed only by the draft test
REPO_ROOT = Path(__file__).resolve().parents[2]

# Three steps over one engine: every test imports engine.grouping (the static evidence names all
# three), but only the draft test executes the draft branch.
STEPS = {
    "draft": "tests/draft/test_draft.py",
    "target": "tests/target/test_target.py",
    "sizes": "tests/sizes/test_sizes.py",
}
TREE = {
    ".buildkite/ci_config.yaml": RUN_CONFIG + "dependency_check:\n  test_roots: [tests]\n",
    ".buildkite/test_areas/engine.yaml": "group: Engine\nsteps:\n"
    + "".join(
        f"  - label: {key}\n    key: {key}\n    device: cpu\n"
        f"    source_file_dependencies:\n      - {test_file.rpartition('/')[0]}/\n"
        f"    commands:\n      - python -m pytest {test_file}\n"
        for key, test_file in STEPS.items()
    ),
    "engine/__init__.py": "",
    "engine/grouping.py": GROUPING,
    "tests/__init__.py": "",
    "tests/draft/__init__.py": "",
    "tests/draft/test_draft.py": (
        "from engine.grouping import group_key\n\n"
        "def test_draft_layer_groups_apart():\n"
        "    assert group_key({'draft': True, 'heads': 4}) == ('draft', 4)\n"
    ),
    "tests/target/__init__.py": "",
    "tests/target/test_target.py": (
        "import pytest\nfrom engine.grouping import group_key\n\n"
        "@pytest.mark.parametrize('heads', [4, 8])\n"
        "def test_target_layer(heads):\n"
        "    assert group_key({'heads': heads}) == ('target', heads)\n"
    ),
    "tests/sizes/__init__.py": "",
    "tests/sizes/test_sizes.py": (
        "from engine.grouping import group_sizes\n\n"
        "def test_sizes():\n    assert group_sizes([{'heads': 2}]) == [2]\n"
    ),
}


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, Path]:
    """The tree committed, and coverage data of all its tests recorded with per-test contexts."""
    repo = init_repo(tmp_path / "repo", TREE)
    data = tmp_path / "coverage-data"
    _record_coverage(repo, data, "--cov-context=test")
    return repo, data


def _record_coverage(repo: Path, data: Path, *options: str) -> None:
    """The tree's tests under pytest-cov (``options`` added), their data in ``data``."""
    run_pytest = [sys.executable, "-m", "pytest", "-q", "-p", "pytest_cov", "--cov-report="]
    result = subprocess.run(
        [*run_pytest, "--cov=engine", *options, "tests"],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "COVERAGE_FILE": str(data), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _change_line(repo: Path, path: str, line: int) -> None:
    lines = (repo / path).read_text().splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].rstrip("\n") + "  # changed\n"
    (repo / path).write_text("".join(lines))
    commit_all(repo, f"change {path}:{line}")


@pytest.mark.parametrize(
    ("context", "test"),
    [
        pytest.param("tests/a.py::test_x|run", "tests/a.py::test_x", id="run"),
        pytest.param(
            "tests/a.py::TestA::test_x[4-8]|setup", "tests/a.py::TestA::test_x", id="param"
        ),
        pytest.param("", None, id="outside-tests"),
    ],
)
def test_context_names_fold_phases_and_parametrizations(context, test):
    assert node_of_context(context) == test


def test_a_line_only_one_test_runs_puts_exactly_its_step_first(recorded):
    repo, data = recorded
    _change_line(repo, "engine/grouping.py", DRAFT_LINE)
    result = run_cli("check-deps", "--repo", str(repo), "--base", "HEAD~1", "--coverage", str(data))
    assert result.exit_code == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"ran this code ({data}): 1 steps, 1 not selected"
    assert lines[1].startswith("  [MISSED] draft (.buildkite/test_areas/engine.yaml:")
    assert f"e.g. engine/grouping.py:{DRAFT_LINE}, by tests/draft/test_draft.py::" in lines[1]
    # The static evidence still names every step that imports the file, after the runtime tier.
    assert "3 unselected steps reach them (a: 3, b: 0, c: 0)" in lines[2]


def test_a_line_every_target_test_runs_names_that_step_with_both_parametrizations(recorded):
    repo, data = recorded
    _change_line(repo, "engine/grouping.py", 4)  # the target return: both target cases run it
    result = run_cli(
        "check-deps", "--repo", str(repo), "--base", "HEAD~1", "--coverage", str(data), "--json"
    )
    document = json.loads(result.stdout)
    assert_matches_schema(document, "ci-check-deps")
    assert [(item["step"], item["tests"]) for item in document["ran_this_code"]] == [
        ("target", ["tests/target/test_target.py::test_target_layer"])
    ]
    assert document["ok"] is False


def test_coverage_without_test_contexts_is_refused_with_the_recording_command(recorded, tmp_path):
    repo, _ = recorded
    plain = tmp_path / "plain-data"
    _record_coverage(repo, plain)
    _change_line(repo, "engine/grouping.py", DRAFT_LINE)
    result = run_cli(
        "check-deps", "--repo", str(repo), "--base", "HEAD~1", "--coverage", str(plain)
    )
    assert result.exit_code == 2
    assert "--cov-context=test" in result.stderr


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(("--coverage", "missing-file"), id="no-base"),
        pytest.param(("--base", "HEAD~1", "--coverage", "missing-file"), id="missing-file"),
    ],
)
def test_bad_coverage_arguments_exit_2(recorded, arguments):
    repo, _ = recorded
    _change_line(repo, "engine/grouping.py", DRAFT_LINE)
    result = run_cli("check-deps", "--repo", str(repo), *arguments)
    assert result.exit_code == 2
    assert "--coverage" in result.stderr


# This repository's own draft-only line: the draft pass's forward context over the draft layers'
# attention groups (vLLM's analogue is the V2 runner's attention-group code). Found by its text,
# so a refactoring that moves it fails here by name rather than planting a change elsewhere.
DRAFT_CONTEXT_FILE = "attngroup/reference_engine/engine/model_runner.py"
DRAFT_CONTEXT_LINE = "return self._forward_context(rows, self._draft_groups)"
# A CI-sized subset of this repository's CPU suites: one CPU case of the greedy-identity test
# (the GPU step runs its GPU cases), and grouping and engine tests that run the same modules
# without drafting.
GREEDY_IDENTITY = "attngroup/suites/spec_decode/test_greedy_identity.py::test_spec_decode_greedy"
RECORDED_TESTS = (
    f"{GREEDY_IDENTITY}[llama3-eagle-torch-fp32-k1]",
    "attngroup/suites/engine_runner/test_forward_metadata.py",
    "attngroup/suites/grouping/test_attention_groups.py",
)


RECORD = ("--cov=attngroup", "--cov-context=test", "--cov-report=", "-m", "not gpu")


def _copy_of_this_repository(destination: Path) -> Path:
    """This checkout's files as they are on disk (the bug zoo's copy), without the committed
    benchmark results, committed in a fresh repository."""
    copy_tree(REPO_ROOT, destination)
    shutil.rmtree(destination / "attngroup" / "benchmarks" / "results", ignore_errors=True)
    return init_repo(destination, {})


@pytest.mark.slow
def test_a_draft_only_line_of_this_repository_puts_the_spec_decode_steps_first(tmp_path):
    repo = _copy_of_this_repository(tmp_path / "repo")
    data = tmp_path / "coverage-data"
    recorded = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *RECORD, *RECORDED_TESTS],
        cwd=repo,
        capture_output=True,
        text=True,
        # The copy first, then whatever the caller's path holds: on the GPU machine that is
        # where the test dependencies and this project's pytest plugin entry point are.
        env={
            **os.environ,
            "COVERAGE_FILE": str(data),
            "PYTHONPATH": python_path(repo),
        },
        check=False,
    )
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    source = (repo / DRAFT_CONTEXT_FILE).read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if text.strip() == DRAFT_CONTEXT_LINE)
    _change_line(repo, DRAFT_CONTEXT_FILE, line)
    result = run_cli(
        "check-deps", "--repo", str(repo), "--base", "HEAD~1", "--coverage", str(data), "--json"
    )
    document = json.loads(result.stdout)
    ran = document["ran_this_code"]
    # Both spec-decode steps declare the engine: selected, and the only steps that ran the line
    # (the GPU step through the recorded case's test function, whose GPU cases it runs).
    assert [(item["step"], item["selected"]) for item in ran] == [
        ("spec-decode-cpu", True),
        ("spec-decode-gpu-mtp", True),
    ]
    assert [item["tests"] for item in ran] == [[GREEDY_IDENTITY], [GREEDY_IDENTITY]]
    assert ran[0]["lines"] == [f"{DRAFT_CONTEXT_FILE}:{line}"]
