"""Runtime evidence for ``check-deps --coverage``: which tests executed the lines a change touches.

Static imports say a test *could* run a file; on a monorepo whose ``tests/conftest.py`` imports
most of the package that is true of nearly every step. coverage.py data recorded with per-test
contexts (``pytest --cov --cov-context=test``) says which test *did* run each line, so a changed
line maps to the tests that executed it and, through the steps' pytest commands, to the steps
that run those tests. Measured paths are absolute paths of the machine that recorded them; each
is mapped to the repository by its longest suffix that is a repository file.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath

from attngroup.ci.errors import CIInputError

CONTEXT_PHASES = ("|setup", "|run", "|teardown")  # pytest-cov's suffixes of a test context


@dataclass(frozen=True)
class RanThisCode:
    """A step whose tests executed changed lines when the coverage data was recorded."""

    key: str
    location: str
    selected: bool
    tests: tuple[str, ...]  # test node ids, parametrizations folded
    lines: tuple[str, ...]  # "path:line" of the changed lines they executed


def node_of_context(context: str) -> str | None:
    """``tests/a.py::test_x[p]|run`` -> ``tests/a.py::test_x``; None for code run outside a test."""
    for phase in CONTEXT_PHASES:
        if context.endswith(phase):
            context = context[: -len(phase)]
            break
    if "::" not in context:
        return None
    return context.split("[", 1)[0]


def _repository_path(measured: str, repo_root: Path) -> str | None:
    """The repository file a measured path names: relative to the root, or else its longest
    suffix that exists in the repository (data recorded in another checkout or container)."""
    path = PurePath(measured)
    root = repo_root.resolve()
    if path.is_relative_to(root):
        return path.relative_to(root).as_posix()
    parts = path.parts
    for start in range(1, len(parts)):
        candidate = PurePath(*parts[start:])
        if (root / candidate).is_file():
            return candidate.as_posix()
    return None


class LineTests:
    """Per repository path and line, the tests that executed it."""

    def __init__(self, data_file: Path, repo_root: Path) -> None:
        try:
            from coverage import CoverageData
            from coverage.exceptions import CoverageException
        except ImportError:
            raise CIInputError(
                "--coverage needs coverage.py (pip install coverage, or the 'ci' extra)"
            ) from None
        if not data_file.is_file():
            raise CIInputError(f"--coverage {data_file}: no such file")
        data = CoverageData(basename=str(data_file))
        try:
            data.read()
            measured = data.measured_files()
            contexts = data.measured_contexts()
        except (sqlite3.Error, CoverageException) as error:
            raise CIInputError(f"--coverage {data_file}: not coverage.py data ({error})") from None
        if not any(node_of_context(context) for context in contexts):
            raise CIInputError(
                f"--coverage {data_file}: recorded without per-test contexts; record with "
                "'pytest --cov --cov-context=test'"
            )
        self._data = data
        self._measured: dict[str, list[str]] = defaultdict(list)  # repository path -> measured
        for measured_path in measured:
            path = _repository_path(measured_path, repo_root)
            if path is not None:
                self._measured[path].append(measured_path)

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(self._measured)

    def _lines_of(self, path: str) -> dict[int, set[str]]:
        """Line -> tests that executed it, read only for the files a change touches."""
        lines: dict[int, set[str]] = defaultdict(set)
        for measured_path in self._measured.get(path, ()):
            for line, contexts in (self._data.contexts_by_lineno(measured_path) or {}).items():
                lines[line].update(test for test in map(node_of_context, contexts) if test)
        return lines

    def tests_for(self, changed: Mapping[str, Iterable[int]]) -> dict[str, set[str]]:
        """Test node id -> the "path:line" of changed lines it executed."""
        found: dict[str, set[str]] = defaultdict(set)
        for path, lines in changed.items():
            by_line = self._lines_of(path)
            for line in lines:
                for test in by_line.get(line, ()):
                    found[test].add(f"{path}:{line}")
        return dict(found)
