"""Selection rules: vLLM's path-component prefix match, exclusions, run-all, docs-only, knobs."""

from __future__ import annotations

import re

import pytest

from attngroup.ci.areas.config import RunConfig, Step, TestAreas
from attngroup.ci.areas.entries import matching_entry
from attngroup.ci.errors import CIInputError
from attngroup.ci.selection.changes import ChangeSet
from attngroup.ci.selection.select_steps import Knobs, is_docs_only, select_steps


@pytest.mark.parametrize(
    ("entries", "path", "selected"),
    [
        (["vllm/attention"], "vllm/attention/backends/x.py", True),
        (["vllm/attention"], "vllm/attention_utils.py", False),
        (["tests/test_foo"], "tests/test_foo.py", False),
        (["vllm/*.py"], "vllm/envs.py", False),
        (["vllm/", "!vllm/distributed/kv_transfer/"], "vllm/distributed/kv_transfer/x.py", False),
        (["vllm/", "!vllm/distributed/kv_transfer/"], "vllm/distributed/x.py", True),
        (["setup.py"], "setup.py", True),
        ([], "anything.py", False),
        (["/"], "anything.py", False),
    ],
    ids=[
        "directory",
        "sibling-prefix",
        "extensionless-file",
        "no-glob",
        "excluded",
        "exclusion-elsewhere",
        "exact-file",
        "empty-list",
        "root-entry",
    ],
)
def test_vllm_matching_rule(entries, path, selected):
    assert (matching_entry(entries, path) is not None) is selected


def _step(key: str, deps: tuple[str, ...] = (), **fields) -> Step:
    return Step(
        key=key,
        label=key.title(),
        group="g",
        file=f".buildkite/test_areas/{key}.yaml",
        line=1,
        commands=("true",),
        source_file_dependencies=deps,
        depends_on=fields.pop("depends_on", ()),
        **fields,
    )


AREAS = TestAreas(
    steps=(
        _step("build"),
        _step("kernels", ("kernels/",), depends_on=("build",)),
        _step("spec-decode", ("kernels/", "reference_engine/", "!kernels/docs/")),
        _step("nightly", ("kernels/",), optional=True),
    ),
    files=(),
)
CONFIG = RunConfig(
    path="ci_config.yaml",
    job_dirs=(".buildkite/test_areas",),
    run_all_patterns=(re.compile("setup.py"), re.compile("csrc/")),
    run_all_exclude_patterns=(re.compile("csrc/cpu/"),),
)


def _select(files, knobs=None):
    changes = ChangeSet(
        "main",
        "HEAD",
        "abc",
        None if files is None else tuple(files),
        None if files is not None else "unknown base ref 'nope'",
    )
    selection = select_steps(AREAS, CONFIG, changes, knobs or Knobs())
    return selection, {d.key: d for d in selection.decisions}


def test_dependency_match_explains_file_and_rule():
    selection, decisions = _select(["kernels/registry.py"])
    assert selection.selected_keys() == {"kernels", "spec-decode"}
    assert decisions["kernels"].why == ("'kernels/registry.py' matches dependency 'kernels/'",)
    # ci-infra pulls depends_on only for ONLY_STEP_KEYS; on a change the dependency is blocked.
    assert decisions["build"].why == ("no changed file matches its 1 dependency entries",)
    assert decisions["nightly"].why == ("optional step: runs only with NIGHTLY=1",)


def test_exclusion_applies_per_step():
    _, decisions = _select(["kernels/docs/notes.txt"])
    assert decisions["kernels"].selected and not decisions["spec-decode"].selected


def test_own_yaml_file_selects_its_step():
    _, decisions = _select([".buildkite/test_areas/spec-decode.yaml"])
    assert decisions["spec-decode"].selected
    assert decisions["spec-decode"].why == (
        "'.buildkite/test_areas/spec-decode.yaml' matches its own YAML file",
    )
    assert not decisions["kernels"].selected


@pytest.mark.parametrize(
    ("path", "run_all"),
    [
        ("setup.py", True),
        ("csrc/attn.cu", True),
        ("csrc/cpu/attn.cpp", False),
        ("third_party/setup.py", False),
        ("setupXpy", True),
    ],
    ids=["file", "directory", "excluded", "anchored-at-start", "unescaped-dot-is-a-wildcard"],
)
def test_run_all_patterns_are_regexes_anchored_at_start(path, run_all):
    selection, _ = _select([path])
    assert selection.run_all is run_all
    assert (
        "build" in selection.selected_keys() and "spec-decode" in selection.selected_keys()
    ) is run_all


def test_docs_only_change_skips_everything_but_empty_diff_is_not_docs_only():
    selection, _ = _select(["docs/index.md", "README.md"])
    assert selection.selected_keys() == set()
    assert selection.reason == "docs-only change: every step skipped"
    assert not is_docs_only([])
    enabled, _ = _select(["kernels/README.md"], Knobs(docs_only_disable=True))
    assert "kernels" in enabled.selected_keys()


def test_fail_safe_selects_every_non_optional_step_and_says_why():
    selection, decisions = _select(None)
    assert selection.run_all
    assert selection.selected_keys() == {"build", "kernels", "spec-decode"}
    assert "unknown base ref 'nope'" in selection.reason
    assert decisions["spec-decode"].why == ("fail-safe: unknown base ref 'nope'",)


@pytest.mark.parametrize(
    ("knobs", "files", "expected"),
    [
        (Knobs(run_all=True), ["tools/x.sh"], {"build", "kernels", "spec-decode"}),
        (Knobs(nightly=True), ["tools/x.sh"], {"build", "kernels", "spec-decode", "nightly"}),
        (Knobs(only_step_keys=("kernels",)), ["README.md"], {"kernels", "build"}),
        (Knobs(nightly=True), ["README.md"], set()),
        (Knobs(run_all=True), ["README.md"], {"build", "kernels", "spec-decode"}),
    ],
    ids=[
        "run-all",
        "nightly-includes-optional",
        "only-step-keys-with-depends-on",
        "docs-only-wins-over-nightly",
        "run-all-wins-over-docs-only",
    ],
)
def test_knobs(knobs, files, expected):
    """vLLM skips a docs-only change before it looks at NIGHTLY, but not under RUN_ALL."""
    selection, _ = _select(files, knobs)
    assert selection.selected_keys() == expected


def test_only_step_keys_rejects_unknown_keys_with_suggestion():
    with pytest.raises(
        CIInputError, match=r"unknown steps \['kernel'\] \(did you mean 'kernels'\?\)"
    ):
        _select([], Knobs(only_step_keys=("kernel",)))


def test_json_shape():
    selection, _ = _select(["kernels/x.py"])
    document = selection.to_json()
    assert set(document) == {"base", "head", "run_all", "reason", "changed_files", "steps"}
    assert document["steps"][1] == {
        "key": "kernels",
        "label": "Kernels",
        "selected": True,
        "why": ["'kernels/x.py' matches dependency 'kernels/'"],
    }
