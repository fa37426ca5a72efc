""".pre-commit-config.yaml runs the checks of `nox -s lint`, at the versions of the lock."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / ".pre-commit-config.yaml"
LOCK = REPO / "requirements" / "lock.txt"
LOCK_INPUT = REPO / "requirements" / "lock.in"


def _pin(requirements: Path, package: str) -> str:
    match = re.search(rf"^{re.escape(package)}==(\S+)", requirements.read_text(), flags=re.M)
    assert match, f"{requirements.relative_to(REPO)} pins no {package}"
    return match.group(1)


@pytest.fixture(scope="module")
def repos() -> dict[str, dict]:
    config = yaml.safe_load(CONFIG.read_text())
    return {repo["repo"]: repo for repo in config["repos"]}


def _hooks(repos: dict[str, dict]) -> dict[str, dict]:
    return {hook["id"]: hook for repo in repos.values() for hook in repo["hooks"]}


def test_every_check_of_the_lint_session_is_a_hook(repos):
    assert set(_hooks(repos)) == {"ruff-check", "ruff-format", "import-linter", "mypy-ratchet"}


@pytest.mark.parametrize(
    ("repository", "package"),
    [
        ("https://github.com/astral-sh/ruff-pre-commit", "ruff"),
        ("https://github.com/seddonym/import-linter", "import-linter"),
    ],
    ids=["ruff", "import-linter"],
)
def test_hook_revs_are_the_locked_versions(repos, repository, package):
    assert repos[repository]["rev"] == f"v{_pin(LOCK, package)}", (
        f"{CONFIG.name} pins {package} at {repos[repository]['rev']}, the lock at "
        f"{_pin(LOCK, package)}: bump the rev with the lock"
    )


def test_mypy_runs_through_the_ratchet_in_the_locked_environment(repos):
    hook = _hooks(repos)["mypy-ratchet"]
    assert hook["entry"] == "python scripts/mypy_ratchet.py"
    assert (REPO / "scripts" / "mypy_ratchet.py").is_file()
    # language: system is the project's environment, whose mypy the ratchet holds to the lock.
    assert hook["language"] == "system"
    assert hook["pass_filenames"] is False, "the baseline counts the whole package"


def test_mypy_hand_pin_is_the_locked_version():
    assert _pin(LOCK_INPUT, "mypy") == _pin(LOCK, "mypy"), (
        "requirements/lock.in and lock.txt disagree on mypy: recompile the lock"
    )
