"""Every command and path the docs name exists: links, repository paths, `python -m`
modules, nox sessions and heading anchors, in the README and every reference page."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        REPO / "CHANGELOG.md",
        REPO / "schemas" / "README.md",
        REPO / "attngroup" / "ci" / "README.md",
        *(REPO / "docs").glob("*.md"),
    ]
)
# Folders whose names open a path of this repository in the docs. docs/, tests/ and
# .buildkite/ are left to the link check: the CI reference names vLLM's paths under them.
REPOSITORY_ROOTS = ("attngroup/", "schemas/", "scripts/", "requirements/")
SESSION = re.compile(r"nox (?:-s|--session) [\"']?([\w-]+)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
MODULE = re.compile(r"python3? -m ([\w.]+)")


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def _text_of(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", _text_of(page), flags=re.M)
    return {_anchor(heading) for heading in headings}


def nox_sessions() -> set[str]:
    """The sessions the noxfiles define (functions under ``@nox.session``)."""
    names: set[str] = set()
    for noxfile in REPO.glob("noxfile*.py"):
        for node in ast.walk(ast.parse(noxfile.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                "session" in ast.unparse(decorator) for decorator in node.decorator_list
            ):
                names.add(node.name)
    return names


def _repository_paths(text: str) -> set[str]:
    """Paths named in code spans and code blocks that start at a repository root folder."""
    candidates = set()
    for span in CODE_SPAN.findall(text) + re.findall(r"^[^#\n]*$", text, flags=re.M):
        for word in re.split(r"[\s`'\"(),]+", span):
            word = re.sub(r":\d+$", "", word.split("::", 1)[0].rstrip(".:;"))  # path:line
            if word.startswith(REPOSITORY_ROOTS) and "$" not in word and "{" not in word:
                candidates.add(word)
    return candidates


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_page_exists(page: Path):
    assert page.is_file(), f"{_page_id(page)} is linked as a reference page but missing"


@pytest.mark.parametrize("page", [page for page in PAGES if page.is_file()], ids=_page_id)
def test_links_point_at_files_and_headings(page: Path):
    broken = []
    for target in LINK.findall(_text_of(page)):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"{_page_id(page)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", [page for page in PAGES if page.is_file()], ids=_page_id)
def test_named_paths_exist(page: Path):
    missing = []
    for path in sorted(_repository_paths(_text_of(page))):
        if any(char in path for char in "*?["):
            found = any(REPO.glob(path))
        else:
            found = (REPO / path).exists()
        if not found:
            missing.append(path)
    assert not missing, f"{_page_id(page)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", [page for page in PAGES if page.is_file()], ids=_page_id)
def test_named_modules_and_sessions_exist(page: Path):
    text = _text_of(page)
    modules = sorted(set(MODULE.findall(text)) - {"pip", "pytest", "venv", "nox"})
    unknown_modules = [
        module
        for module in modules
        if module.startswith("attngroup") and importlib.util.find_spec(module) is None
    ]
    sessions = nox_sessions()
    unknown_sessions = sorted(set(SESSION.findall(text)) - sessions)
    assert not unknown_modules, f"{_page_id(page)}: no module {unknown_modules}"
    assert not unknown_sessions, f"{_page_id(page)}: no nox session {unknown_sessions}"


def test_the_checks_see_a_broken_reference(tmp_path: Path):
    """The helpers above find a planted missing path, module and session."""
    text = "`attngroup/nope.py` and `python -m attngroup.nope` and `nox -s nope`"
    assert "attngroup/nope.py" in _repository_paths(text)
    assert importlib.util.find_spec(MODULE.findall(text)[0]) is None
    assert "nope" not in nox_sessions() and "tests" in nox_sessions()


def test_readme_is_a_front_page():
    lines = _text_of(REPO / "README.md").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; reference material goes to docs/"


SESSION_LANGUAGE = re.compile(
    r"\b(this (round|stop|session)|since fixed|issue \d+|last session|next session)\b", re.I
)


@pytest.mark.parametrize("page", [page for page in PAGES if page.is_file()], ids=_page_id)
def test_reference_pages_speak_no_session_language(page: Path):
    hits = [line for line in _text_of(page).splitlines() if SESSION_LANGUAGE.search(line)]
    assert not hits, f"{_page_id(page)}: {hits[:3]}"
