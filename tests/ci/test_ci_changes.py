"""Changed files from git in temporary repositories, and the fail-safe when git cannot say."""

from __future__ import annotations

import json
import subprocess

import pytest

from attngroup.ci.selection.changes import compute_changes
from tests.ci.helpers import RUN_CONFIG, commit_all, git, init_repo, run_cli, write_tree
from tests.json_schemas import assert_matches_schema

AREAS = {
    ".buildkite/ci_config.yaml": RUN_CONFIG,
    ".buildkite/test_areas/spec.yaml": """\
        group: Spec
        steps:
          - label: Spec decode
            key: spec-decode
            device: cpu
            source_file_dependencies: [kernels/, engine/]
            commands: [python -m pytest suites/spec]
          - label: Docs build
            key: docs
            device: cpu
            source_file_dependencies: [docs/]
            commands: [make docs]
        """,
    "kernels/__init__.py": "",
    "kernels/registry.py": "NAMES = {}\n",
    "engine/builder.py": "X = 1\n",
    "docs/index.md": "# docs\n",
}


@pytest.fixture
def repo(tmp_path):
    root = init_repo(tmp_path / "repo", AREAS)
    git(root, "checkout", "-q", "-b", "feature")
    return root


def test_rename_counts_both_paths_and_deletion_counts(repo):
    git(repo, "mv", "kernels/registry.py", "kernels/backends.py")
    git(repo, "rm", "-q", "engine/builder.py")
    commit_all(repo, "move")
    changes = compute_changes(repo, "main", "HEAD")
    assert set(changes.files) == {"kernels/registry.py", "kernels/backends.py", "engine/builder.py"}


def test_merge_base_ignores_commits_on_the_base_branch(repo):
    write_tree(repo, {"engine/builder.py": "X = 2\n"})
    commit_all(repo, "feature change")
    git(repo, "checkout", "-q", "main")
    write_tree(repo, {"kernels/registry.py": "NAMES = {1: 2}\n"})
    commit_all(repo, "main moves on")
    git(repo, "checkout", "-q", "feature")
    assert compute_changes(repo, "main", "HEAD").files == ("engine/builder.py",)


def test_untracked_files_count_only_with_the_flag(repo):
    write_tree(repo, {"engine/new.py": "", "kernels/registry.py": "NAMES = {2: 3}\n"})
    assert compute_changes(repo, "main").files == ("kernels/registry.py",)
    assert set(compute_changes(repo, "main", include_untracked=True).files) == {
        "kernels/registry.py",
        "engine/new.py",
    }


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("unknown-base", "unknown base ref 'no-such-branch'"),
        ("not-a-repo", "is not a git work tree"),
        ("shallow", "shallow clone"),
    ],
    ids=["unknown-base", "no-git-repository", "shallow-clone"],
)
def test_fail_safe_selects_everything_and_says_why(repo, tmp_path, setup, reason):
    base = "no-such-branch" if setup == "unknown-base" else "main"
    target = repo
    if setup == "not-a-repo":
        target = tmp_path / "plain"
        write_tree(target, AREAS)
    elif setup == "shallow":
        write_tree(repo, {"engine/builder.py": "X = 3\n"})
        commit_all(repo, "one")
        write_tree(repo, {"engine/builder.py": "X = 4\n"})
        commit_all(repo, "two")
        target = tmp_path / "shallow"
        subprocess.run(
            [
                "git",
                "clone",
                "-q",
                "--depth",
                "1",
                "--branch",
                "feature",
                f"file://{repo}",
                str(target),
            ],
            check=True,
        )
    assert reason in compute_changes(target, base, "HEAD").unavailable_reason
    result = run_cli("select", "--repo", str(target), "--base", base, "--json")
    document = json.loads(result.stdout)
    assert result.exit_code == 0
    assert_matches_schema(document, "ci-select")
    assert document["run_all"] is True and reason in document["reason"]
    assert [step["selected"] for step in document["steps"]] == [True, True]
    assert reason in result.stderr


def test_select_json_and_explain_on_a_change(repo):
    write_tree(repo, {"kernels/registry.py": "NAMES = {'triton': 1}\n"})
    commit_all(repo, "backend change")
    result = run_cli("select", "--repo", str(repo), "--base", "main", "--head", "HEAD", "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert_matches_schema(document, "ci-select")
    assert document["changed_files"] == ["kernels/registry.py"]
    assert document["run_all"] is False
    assert document["steps"] == [
        {
            "key": "spec-decode",
            "label": "Spec decode",
            "selected": True,
            "why": ["'kernels/registry.py' matches dependency 'kernels/'"],
        },
        {
            "key": "docs",
            "label": "Docs build",
            "selected": False,
            "why": ["no changed file matches its 1 dependency entries"],
        },
    ]
    explained = run_cli("select", "--repo", str(repo), "--base", "HEAD~1", "--explain")
    assert "[run] spec-decode: Spec decode" in explained.stdout
    assert "'kernels/registry.py' matches dependency 'kernels/'" in explained.stdout
    assert "[skip] docs: Docs build" in explained.stdout
