"""Judging a vLLM source tree: its identity, its venv's freshness, its timeline column and
the exit status a change that breaks a pair gets. The venv build itself needs the network
and minutes; ``docs/judging-vllm.md`` records a measured run."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from attngroup.suites.engines.vllm_checkout import (
    BUILT_FILE,
    CheckoutSpecError,
    SourceSpec,
    build_checkout_venv,
    checkout_venv,
    dependency_fingerprint,
    identify,
    materialize,
    source_tree,
)
from attngroup.suites.grouping.vllm_timeline import checkout_failures, main, markdown_table
from attngroup.suites.grouping.vllm_verdicts import CheckoutMismatchError, imported_checkout

PASS = {"verdict": "pass", "runner": "v2"}
FAIL = {
    "verdict": "fail", "runner": "v2", "tp": 1, "check": "start-up",
    "message": "got {8, 4}", "source": "vllm/v1/attention/backends/utils.py:531",
}  # fmt: skip


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def _head(root: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A minimal vLLM-shaped source tree, committed on branch ``main``."""
    root = tmp_path / "vllm-src"
    (root / "vllm").mkdir(parents=True)
    (root / "requirements").mkdir()
    (root / "vllm" / "__init__.py").write_text("__version__ = '0.35.0.dev1'\n")
    (root / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools", "torch == 2.14.0"]\n'
    )
    (root / "requirements" / "common.txt").write_text("numpy\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "tree")
    return root


def test_a_tree_without_vllms_files_is_refused_by_name(tmp_path: Path):
    (tmp_path / "vllm").mkdir()
    with pytest.raises(
        CheckoutSpecError, match=r"not a vLLM source tree \(no vllm/__init__.py, setup.py"
    ):
        source_tree(tmp_path)
    with pytest.raises(CheckoutSpecError, match="not a directory"):
        source_tree(tmp_path / "missing")


def test_identity_names_branch_commit_and_uncommitted_changes(tree: Path):
    commit = _head(tree)
    assert identify(tree).label == f"checkout main@{commit}"
    (tree / "notes.txt").write_text("untracked files are not the tree's code\n")
    assert not identify(tree).dirty
    (tree / "vllm" / "__init__.py").write_text("__version__ = '0.35.0.dev2'\n")
    assert identify(tree).label == f"checkout main@{commit}+dirty"
    _git(tree, "checkout", "-q", "--detach")
    assert identify(tree).label == f"checkout {commit}+dirty"


@pytest.mark.parametrize(
    "text, directory, ref",
    [
        ("vllm", "vllm", None),
        ("vllm@origin/main", "vllm", "origin/main"),
        ("/src/vllm@v0.34.0", "/src/vllm", "v0.34.0"),
        ("vllm@", "vllm@", None),
        ("odd@name", "odd@name", None),  # an existing folder whose name holds an @
    ],
    ids=["tree", "tree-at-ref", "absolute-at-tag", "trailing-at", "at-in-an-existing-path"],
)
def test_a_source_names_a_tree_or_one_commit_of_it(text, directory, ref, tmp_path: Path):
    (tmp_path / "odd@name").mkdir()
    assert SourceSpec.parse(text, tmp_path) == SourceSpec(tmp_path / directory, ref)


def test_a_ref_is_judged_in_a_worktree_that_follows_it(tree: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    _git(tree, "checkout", "-q", "-b", "feature")
    (tree / "vllm" / "worker.py").write_text("KEY = ('backend', 'spec')\n")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "drop the head count")
    main = SourceSpec(tree, "main")
    worktree = materialize(main, cache)
    assert worktree.parent == cache / "trees" and not (worktree / "vllm" / "worker.py").exists()
    assert identify(worktree, "main").label == f"checkout main@{_head(worktree)}"
    _git(tree, "checkout", "-q", "main")
    (tree / "vllm" / "worker.py").write_text("KEY = ('backend', 'spec', 'heads')\n")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "main moves on")
    assert materialize(main, cache) == worktree  # the same tree, so the same venv
    assert _head(worktree) == _head(tree)
    assert "heads" in (worktree / "vllm" / "worker.py").read_text()
    assert materialize(SourceSpec(tree), cache) == tree.resolve()  # DIR alone: the tree itself


@pytest.mark.parametrize(
    "ref", ["no-such-branch", "main~5"], ids=["unknown-branch", "past-the-root"]
)
def test_a_ref_git_cannot_resolve_is_refused_before_the_cache_is_touched(
    ref: str, tree: Path, tmp_path: Path
):
    with pytest.raises(CheckoutSpecError, match=f"not a git repository that knows '{ref}'"):
        materialize(SourceSpec(tree, ref), tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_tree_outside_git_is_named_by_its_folder(tmp_path: Path):
    identity = identify(tmp_path)
    assert (identity.commit, identity.label) == (None, f"checkout {tmp_path.name}")


def test_the_fingerprint_follows_dependency_files_not_code(tree: Path):
    before = dependency_fingerprint(tree)
    (tree / "vllm" / "worker.py").write_text("KEY = 1\n")
    assert dependency_fingerprint(tree) == before
    (tree / "requirements" / "common.txt").write_text("numpy\ntransformers >= 5.25\n")
    assert dependency_fingerprint(tree) != before


def test_a_venv_is_current_only_for_the_fingerprint_and_torch_it_was_built_for(
    tree: Path, tmp_path: Path
):
    built = checkout_venv(tree, tmp_path / "cache")
    fingerprint = dependency_fingerprint(tree)
    assert not built.is_current(fingerprint, "torch==2.13.0+cpu")  # nothing built
    (built.root / "bin").mkdir(parents=True)
    built.python.write_text("")
    record = {"fingerprint": fingerprint, "torch": "torch==2.13.0+cpu"}
    (built.root / BUILT_FILE).write_text(json.dumps(record))
    assert built.is_current(fingerprint, "torch==2.13.0+cpu")
    assert not built.is_current(fingerprint, "torch==2.14.0+cpu")
    (tree / "requirements" / "common.txt").write_text("numpy\nregex\n")
    assert not built.is_current(dependency_fingerprint(tree), "torch==2.13.0+cpu")
    (built.root / BUILT_FILE).write_text("{half")
    assert built.built_for() is None


def test_a_malformed_pyproject_is_refused_before_the_cache_is_touched(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The tree's fault is named even where this machine could not build a venv either (a
    CUDA torch: the GPU image), so the error points at the input, not the environment."""

    def cuda_torch() -> str:
        raise RuntimeError("the interpreter building release venvs has a CUDA torch")

    monkeypatch.setattr("attngroup.suites.engines.vllm_checkout.cpu_torch_pin", cuda_torch)
    (tree / "pyproject.toml").write_text("[build-system\nrequires = [")
    cache = tmp_path / "cache"
    with pytest.raises(
        CheckoutSpecError, match=r"pyproject\.toml names no readable build requirements"
    ):
        build_checkout_venv(tree, cache)
    assert not cache.exists()


def _verdicts(pairs: dict, version: str = "0.34.0", checkout: str | None = None) -> dict:
    data = {"vllm": version, "runner": "auto", "seconds": 1.0, "pairs": pairs}
    return data if checkout is None else {**data, "checkout": {"label": checkout}}


def test_a_checkout_column_follows_the_releases_and_marks_what_the_change_broke():
    branch = _verdicts({"gemma4-e2b-mtp": FAIL, "llama3-eagle": PASS}, "0.30.0", "checkout b@1")
    releases = [
        _verdicts({"gemma4-e2b-mtp": PASS, "llama3-eagle": PASS}, v) for v in ("0.34.0", "0.33.0")
    ]
    table = markdown_table([branch, *releases]).splitlines()
    assert table[0] == "| pair | vLLM 0.33.0 | vLLM 0.34.0 | checkout b@1 |"
    assert table[2].startswith(
        "| gemma4-e2b-mtp | pass (v2) | pass (v2) | ▶ **fail** (v2, tp1, start-up)"
    )
    assert table[3] == "| llama3-eagle | pass (v2) | pass (v2) | pass (v2) |"
    assert checkout_failures([branch, *releases]) == ["checkout b@1: gemma4-e2b-mtp"]


def test_a_checkouts_change_is_not_put_down_to_a_known_upstream_pr():
    """Pass -> "builder heads" between releases is PR #43241; on a branch it is the branch."""
    builder = {**FAIL, "check": "builder heads", "message": "4 vs 8"}
    release = _verdicts({"gemma4-e2b-mtp": PASS}, "0.23.0")
    table = markdown_table([release, _verdicts({"gemma4-e2b-mtp": builder}, "0.24.0")])
    assert "(#43241)" in table
    table = markdown_table(
        [release, _verdicts({"gemma4-e2b-mtp": builder}, "0.23.0", "checkout b@1")]
    )
    assert "▶ **fail**" in table and "#43241" not in table


def test_render_exits_1_when_a_checkout_fails_a_pair_and_still_writes_the_timeline(
    tmp_path, capsys
):
    files = []
    for name, data in [
        ("release", _verdicts({"gemma4-e2b-mtp": PASS})),
        ("checkout", _verdicts({"gemma4-e2b-mtp": FAIL}, "0.35.0.dev1", "checkout b@1")),
    ]:
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(data))
    out = tmp_path / "out"
    assert main(["render", *map(str, files), "--out", str(out)]) == 1
    assert "checkout fails: checkout b@1: gemma4-e2b-mtp" in capsys.readouterr().err
    assert "<th>checkout b@1</th>" in (out / "timeline.html").read_text()
    assert main(["render", str(files[0]), "--out", str(out)]) == 0  # releases' failures are history


def test_a_checkout_entry_without_a_label_is_refused(tmp_path, capsys):
    path = tmp_path / "v.json"
    path.write_text(json.dumps({**_verdicts({"u": PASS}), "checkout": {"path": "/x"}}))
    assert main(["render", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "checkout must be an object with a label" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--versions", "none"], "nothing to judge"),
        (["--source", "/nonexistent/vllm"], "--source /nonexistent/vllm: not a directory"),
    ],
    ids=["nothing-to-judge", "missing-source"],
)
def test_run_refuses_bad_trees_before_building_anything(
    args, message, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("AGC_VLLM_CACHE", str(tmp_path / "cache"))
    assert main(["run", *args, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_verdicts_refuse_a_venv_whose_vllm_is_not_the_checkouts(tree: Path, tmp_path, monkeypatch):
    elsewhere = types.ModuleType("vllm")
    elsewhere.__file__ = str(tmp_path / "site-packages" / "vllm" / "__init__.py")
    monkeypatch.setitem(sys.modules, "vllm", elsewhere)
    with pytest.raises(
        CheckoutMismatchError, match=r"imports vLLM from .*site-packages/vllm, not from"
    ):
        imported_checkout(tree)
    editable = types.ModuleType("vllm")
    editable.__file__ = str(tree / "vllm" / "__init__.py")
    monkeypatch.setitem(sys.modules, "vllm", editable)
    assert imported_checkout(tree)["label"].startswith("checkout main@")
