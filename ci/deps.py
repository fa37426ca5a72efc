"""Dependency-gap checker: does each step declare every file its tests actually import?

For each step: its pytest commands -> the test files they collect -> the transitive import
closure of those files, their conftest.py chain and installed pytest plugins -> repository
paths. Reachable paths that no ``source_file_dependencies`` entry covers are gaps: a change
there would not select the step (the missed attention-backend -> spec-decode rule).
"""

from __future__ import annotations

import tomllib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ci.config import RunConfig, Step, TestAreas
from ci.errors import CIInputError
from ci.imports import ImportGraph
from ci.pytest_commands import CommandParseError, pytest_runs
from ci.selection import matches_dependency, matching_entry, split_dependencies
from ci.test_inventory import (
    TestFunction,
    clear_caches,
    collected_files,
    conftest_chain,
    is_test_file,
    missing_targets,
    selected_tests,
    tests_in_file,
)


@dataclass(frozen=True)
class Gap:
    """A file the step's tests import that no dependency entry covers."""

    path: str
    distance: int  # import hops from a collected test file
    via: tuple[str, ...]  # the import chain, test file first
    suggestion: str  # the shortest entry that covers it without covering unreachable files


@dataclass(frozen=True)
class StepReport:
    key: str
    location: str
    test_files: tuple[str, ...] = ()
    reachable: tuple[str, ...] = ()
    gaps: tuple[Gap, ...] = ()
    missing_declared: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # unparseable commands, missing test paths, empty filters
    ignored: tuple[tuple[str, str], ...] = ()  # (path, reason)

    @property
    def ok(self) -> bool:
        return not (self.gaps or self.missing_declared or self.problems)


@dataclass(frozen=True)
class DependencyReport:
    steps: tuple[StepReport, ...]
    orphan_tests: tuple[str, ...]
    stale_ignores: tuple[str, ...]
    modules_indexed: int
    closures: dict[str, frozenset[str]] = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return all(step.ok for step in self.steps) and not self.orphan_tests


@dataclass(frozen=True)
class ProjectSettings:
    """What pytest itself reads from pyproject.toml: default paths and auto-loaded plugins."""

    testpaths: tuple[str, ...] = ()
    plugin_modules: tuple[str, ...] = ()

    @classmethod
    def read(cls, repo_root: Path) -> ProjectSettings:
        pyproject = repo_root / "pyproject.toml"
        if not pyproject.is_file():
            return cls()
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as error:
            raise CIInputError(f"pyproject.toml: {error}") from None
        options = data.get("tool", {}).get("pytest", {}).get("ini_options", {})
        plugins = data.get("project", {}).get("entry-points", {}).get("pytest11", {})
        return cls(
            testpaths=tuple(options.get("testpaths", ())),
            plugin_modules=tuple(value.partition(":")[0] for value in plugins.values()),
        )


class _Suggester:
    """Shortest directory entry whose every Python file the step already reaches or covers."""

    def __init__(self, graph: ImportGraph) -> None:
        self.paths = tuple(graph.path_modules)

    def for_step(self, reachable: set[str], dependencies: tuple[str, ...]) -> Callable[[str], str]:
        """A suggestion function for one step (directories scanned once, on first use)."""
        impure: set[str] = set()
        for path in self.paths:
            if path not in reachable and matching_entry(dependencies, path) is None:
                parts = path.split("/")
                impure.update("/".join(parts[:depth]) for depth in range(1, len(parts)))

        def suggest(path: str) -> str:
            parts = path.split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in impure:
                    return f"{directory}/"
            return path

        return suggest


def _import_chain(closure: dict[str, tuple[int, str | None]], path: str) -> tuple[str, ...]:
    chain = [path]
    while (parent := closure[chain[-1]][1]) is not None:
        chain.append(parent)
    return tuple(reversed(chain))


def _missing_declared(step: Step, repo_root: Path) -> list[str]:
    includes, excludes = split_dependencies(step.source_file_dependencies)
    return [
        entry
        for entry in (*includes, *(f"!{item}" for item in excludes))
        if not (repo_root / entry.removeprefix("!").rstrip("/")).exists()
    ]


def check_step(
    step: Step,
    repo_root: Path,
    config: RunConfig,
    graph: ImportGraph,
    settings: ProjectSettings,
    suggester: _Suggester,
    selected: dict[str, set[str]],
) -> tuple[StepReport, set[str]]:
    """One step's report, and the set of files its tests reach (for recall checks)."""
    location = f"{step.file}:{step.line}"
    problems: list[str] = []
    try:
        runs = pytest_runs(
            step.commands, step.working_dir or config.default_working_dir, config.workspace_root
        )
    except CommandParseError as error:
        runs, problems = [], [str(error)]
    test_files: list[str] = []
    for run in runs:
        problems.extend(
            f"{run.command!r}: test path {path!r} does not exist"
            for path in missing_targets(repo_root, run)
        )
        files = collected_files(repo_root, run, settings.testpaths)
        try:
            tests = selected_tests(repo_root, run, files)
        except ValueError as error:
            problems.append(f"{run.command!r}: {error}")
            continue
        if not tests:
            problems.append(f"{run.command!r}: its paths and filters select no test")
        for test in tests:
            selected.setdefault(test.node_id, set()).add(step.key)
        test_files.extend(files)
    test_files = list(dict.fromkeys(test_files))
    roots = dict.fromkeys(test_files, 0)
    if test_files:
        for test_file in test_files:
            roots.update(
                {path: 1 for path in conftest_chain(repo_root, test_file) if path not in roots}
            )
        for module in settings.plugin_modules:
            if module in graph.modules:
                roots.setdefault(graph.modules[module], 1)
    closure = graph.closure(roots)
    reachable = set(closure)
    ignores = config.dependency_check.ignore.get(step.key, {})
    uncovered, ignored = [], []
    for path, (distance, _) in sorted(closure.items(), key=lambda item: (item[1][0], item[0])):
        if matching_entry(step.dependencies, path) is not None:
            continue
        reason = next(
            (why for entry, why in ignores.items() if matches_dependency(entry, path)), None
        )
        if reason is not None:
            ignored.append((path, reason))
        else:
            uncovered.append((path, distance))
    suggest = suggester.for_step(reachable, step.dependencies) if uncovered else str
    gaps = [
        Gap(path, distance, _import_chain(closure, path), suggest(path))
        for path, distance in uncovered
    ]
    report = StepReport(
        key=step.key,
        location=location,
        test_files=tuple(test_files),
        reachable=tuple(sorted(reachable)),
        gaps=tuple(gaps),
        missing_declared=tuple(_missing_declared(step, repo_root)),
        problems=tuple(problems),
        ignored=tuple(ignored),
    )
    return report, reachable


def _all_tests(repo_root: Path, roots: tuple[str, ...], graph: ImportGraph) -> list[TestFunction]:
    tests: list[TestFunction] = []
    for path in sorted(graph.path_modules):
        in_roots = any(
            root in (".", "") or path.startswith(f"{root.rstrip('/')}/") for root in roots
        )
        if in_roots and is_test_file(path):
            tests.extend(tests_in_file(repo_root, path))
    return tests


def _orphans(tests: list[TestFunction], selected: dict[str, set[str]]) -> list[str]:
    """Test node ids no step runs; a whole file is named once when none of it runs."""
    by_file: dict[str, list[TestFunction]] = defaultdict(list)
    for test in tests:
        by_file[test.file].append(test)
    orphans = []
    for path, file_tests in by_file.items():
        unrun = [test.node_id for test in file_tests if test.node_id not in selected]
        orphans.extend([path] if len(unrun) == len(file_tests) else unrun)
    return orphans


def check_dependencies(
    areas: TestAreas, config: RunConfig, repo_root: Path, graph: ImportGraph | None = None
) -> DependencyReport:
    """Gaps, dead entries and unrun tests for every step of ``areas``."""
    settings = ProjectSettings.read(repo_root)
    clear_caches()  # files may have changed since an earlier check in this process
    known_keys = {step.key for step in areas.steps}
    unknown = sorted(set(config.dependency_check.ignore) - known_keys)
    if unknown:
        raise CIInputError(f"{config.path}: dependency_check.ignore names unknown steps {unknown}")
    graph = graph or ImportGraph.scan(repo_root, config.dependency_check.import_roots)
    suggester = _Suggester(graph)
    selected: dict[str, set[str]] = {}
    reports, closures = [], {}
    for step in areas.steps:
        report, reachable = check_step(
            step, repo_root, config, graph, settings, suggester, selected
        )
        reports.append(report)
        closures[step.key] = frozenset(reachable)
    used = {(report.key, path) for report in reports for path, _ in report.ignored}
    stale = [
        f"{key}: {entry}"
        for key, entries in config.dependency_check.ignore.items()
        for entry in entries
        if not any(k == key and matches_dependency(entry, path) for k, path in used)
    ]
    test_roots = config.dependency_check.test_roots or settings.testpaths or (".",)
    orphans = _orphans(_all_tests(repo_root, test_roots, graph), selected)
    return DependencyReport(
        tuple(reports), tuple(orphans), tuple(stale), len(graph.modules), closures
    )


def format_report(report: DependencyReport, verbose: bool = False) -> str:
    """Human-readable report: gaps ranked by import distance with the entry to add."""
    lines = []
    for step in report.steps:
        status = "ok" if step.ok else "FAIL"
        lines.append(
            f"[{status}] {step.key} ({step.location}): {len(step.test_files)} test "
            f"files, {len(step.reachable)} reachable files, {len(step.gaps)} gaps"
        )
        for gap in step.gaps:
            chain = " -> ".join(gap.via)
            lines.append(
                f"    gap (distance {gap.distance}): {gap.path}  add {gap.suggestion!r}  [{chain}]"
            )
        lines.extend(
            f"    declared path does not exist: {entry}" for entry in step.missing_declared
        )
        lines.extend(f"    problem: {problem}" for problem in step.problems)
        if verbose:
            lines.extend(f"    ignored: {path} ({reason})" for path, reason in step.ignored)
    lines.extend(f"test run by no step: {orphan}" for orphan in report.orphan_tests)
    lines.extend(
        f"warning: ignore entry matches nothing: {stale}" for stale in report.stale_ignores
    )
    lines.append(
        f"{report.modules_indexed} modules indexed; "
        + ("no dependency gaps" if report.ok else "dependency check FAILED")
    )
    return "\n".join(lines)


def suggested_entries(step: StepReport) -> list[str]:
    """The entries ``--fix`` adds: one per distinct suggestion, most general first."""
    entries = sorted({gap.suggestion for gap in step.gaps}, key=lambda entry: (len(entry), entry))
    minimal: list[str] = []
    for entry in entries:
        if not any(matches_dependency(kept, entry.rstrip("/")) for kept in minimal):
            minimal.append(entry)
    return minimal
