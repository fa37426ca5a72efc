"""Temporary repositories and CLI runs shared by the harness tests."""

from __future__ import annotations

import contextlib
import io
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

from attngroup.ci.cli import main

RUN_CONFIG = """\
job_dirs:
  - .buildkite/test_areas
run_all_patterns:
  - "setup\\\\.py$"
run_all_exclude_patterns: []
legacy_keys: error
unknown_keys: error
device_agents:
  cpu:
    queue: cpu
  h200:
    queue: gpu-h200
"""


def write_tree(root: Path, files: dict[str, str]) -> None:
    """Create ``files`` (path -> text, dedented) under ``root``."""
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=ci-test", "-c", "user.email=ci@test", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def init_repo(root: Path, files: dict[str, str]) -> Path:
    """A git repository on branch main with ``files`` committed."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    write_tree(root, files)
    commit_all(root, "initial")
    return root


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """``python -m ci ARGS`` in-process (fast), capturing output and the exit code."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return CliResult(code, stdout.getvalue(), stderr.getvalue())
