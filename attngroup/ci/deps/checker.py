"""Dependency-gap checker: does each step declare every file its tests actually import?

For each step: its pytest commands -> the test files they collect -> the transitive import
closure of those files, their conftest.py chain and installed pytest plugins -> repository
paths. Reachable paths that no ``source_file_dependencies`` entry covers are gaps: a change
there would not select the step (the missed attention-backend -> spec-decode rule). Gaps are
*static* (an import chain reaches them) or *registry* (only a registry's dotted-path string
does); closures are bitsets (``attngroup.ci.deps.reach``), so a vLLM-sized tree takes seconds.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from attngroup.ci.areas.config import RunConfig, Step, TestAreas
from attngroup.ci.areas.entries import matches_dependency, matching_entry, split_dependencies
from attngroup.ci.deps.imports import (
    MODULE_LEVEL,
    REGISTRY,
    STATIC,
    ImportGraph,
    import_root_problems,
)
from attngroup.ci.deps.inventory_cache import TestInventory
from attngroup.ci.deps.reach import members
from attngroup.ci.deps.runtime_coverage import LineTests, RanThisCode
from attngroup.ci.deps.test_inventory import (
    TestFunction,
    clear_caches,
    collected_files,
    conftest_chain,
    is_test_file,
    missing_targets,
    selected_tests,
)
from attngroup.ci.errors import CIInputError
from attngroup.ci.selection.pytest_commands import CommandParseError, PytestRun, pytest_runs
from attngroup.ci.selection.select_steps import Selection


@dataclass(frozen=True)
class Gap:
    """A file the step's tests import that no dependency entry covers."""

    path: str
    kind: str  # "static" (an import chain) or "registry" (only via a registry's strings)
    suggestion: str  # the shortest entry that covers it without covering unreachable files
    tier_a: bool = False  # module-level imports reach it on the step's device (change tier a)
    direct: bool = False  # a test file, conftest or test helper of the step imports it itself


class EntryToAdd(NamedTuple):
    """A suggested ``source_file_dependencies`` entry and the gaps it would cover."""

    entry: str
    gaps: int
    kind: str  # ``registry`` when every gap under the entry is a registry gap
    tier_a: int  # of ``gaps``, those module-level imports reach on the step's device
    direct: int  # of ``gaps``, those the step's tests or their helpers import themselves


@dataclass(frozen=True)
class StepReport:
    key: str
    location: str
    test_files: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()  # test files, their conftest chain, plugins
    reachable: int = 0
    gaps: tuple[Gap, ...] = ()
    missing_declared: tuple[str, ...] = ()
    declared_at: tuple[tuple[str, str], ...] = ()  # (missing entry, YAML "file:line")
    problems: tuple[str, ...] = ()  # unparseable commands, missing test paths, empty filters
    ignored: tuple[tuple[str, str], ...] = ()  # (path, reason)
    off_platform: frozenset[str] = frozenset()  # platform modules its device never imports

    @property
    def ok(self) -> bool:
        return not (self.gaps or self.missing_declared or self.problems)

    def entries_to_add(self) -> list[EntryToAdd]:
        """Entries the step's tests import themselves first, then by the tier-(a) gaps they
        cover, then by all gaps: a directory reached only through other product modules or
        registry strings (a model package behind a kernel test) ranks behind them."""
        counts = Counter(gap.suggestion for gap in self.gaps)
        tier_a = Counter(gap.suggestion for gap in self.gaps if gap.tier_a)
        direct = Counter(gap.suggestion for gap in self.gaps if gap.direct)
        static = {gap.suggestion for gap in self.gaps if gap.kind == STATIC}
        ranked = sorted(
            counts.items(),
            key=lambda item: (not direct[item[0]], -tier_a[item[0]], -item[1], item[0]),
        )
        return [
            EntryToAdd(
                entry, n, STATIC if entry in static else REGISTRY, tier_a[entry], direct[entry]
            )
            for entry, n in ranked
        ]

    @property
    def tier_a_gaps(self) -> int:
        return sum(gap.tier_a for gap in self.gaps)

    def where_declared(self, entry: str) -> str:
        """The YAML ``file:line`` of a declared entry (the step's line if unknown)."""
        return dict(self.declared_at).get(entry, self.location)


@dataclass(frozen=True)
class DependencyReport:
    steps: tuple[StepReport, ...]
    orphan_tests: tuple[str, ...]
    stale_ignores: tuple[str, ...]
    modules_indexed: int
    closures: dict[str, frozenset[str]] = field(default_factory=dict, compare=False)
    known: int = 0  # findings left out because the baseline records them

    @property
    def ok(self) -> bool:
        return all(step.ok for step in self.steps) and not self.orphan_tests


# Tiers of change-mode evidence, strongest first (``MissedTrigger.tier``).
TIER_STATIC = "a"  # the step's tests import the file, by imports that run on its device
TIER_NAMED = (
    "b"  # its test files or their helpers name the module, a class of it or its registry key
)
TIER_WEAK = "c"  # only registry strings or imports of a package reach it
COVERED = "covered"  # an entry already covers the file; the step is unselected for another reason
TIERS = (TIER_STATIC, TIER_NAMED, TIER_WEAK)


@dataclass(frozen=True)
class MissedTrigger:
    """A changed file that an unselected step's tests import: the step should have run."""

    key: str
    location: str
    path: str
    kind: str
    chain: tuple[str, ...]  # test file (or conftest/plugin) -> ... -> the changed file
    suggestion: str
    known: bool = False  # recorded in the baseline
    tier: str = TIER_STATIC
    nightly: bool = False  # an optional step: it runs nightly


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


class _Coverage:
    """Bitsets over the graph's nodes: which files a dependency entry covers, and the
    shortest directory entry whose every file a step already reaches or covers."""

    def __init__(self, graph: ImportGraph) -> None:
        self.nodes = graph.nodes
        self.all = (1 << len(self.nodes)) - 1
        self.under: dict[str, int] = defaultdict(int)  # file or directory -> files at/below it
        for index, path in enumerate(self.nodes):
            parts = path.split("/")
            for depth in range(1, len(parts) + 1):
                self.under["/".join(parts[:depth])] |= 1 << index

    def covered(self, dependencies: tuple[str, ...]) -> int:
        includes, excludes = split_dependencies(tuple(dependencies))
        bits = 0
        for entry in includes:
            bits |= self.under.get(entry.rstrip("/"), 0)
        for entry in excludes:
            bits &= ~self.under.get(entry.rstrip("/"), 0)
        return bits

    def suggest(self, path: str, outside: int, known: dict[str, str | None]) -> str:
        """The shortest directory entry covering ``path`` and nothing in ``outside``
        (``known`` remembers the answer per parent directory, for one step)."""
        parent = path.rpartition("/")[0]
        if parent not in known:
            parts = parent.split("/") if parent else []
            known[parent] = next(
                (
                    f"{directory}/"
                    for directory in ("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
                    if not self.under[directory] & outside
                ),
                None,
            )
        return known[parent] or path


@dataclass(frozen=True)
class _Scope:
    """What one step's commands collect and import."""

    test_files: tuple[str, ...]
    roots: tuple[str, ...]
    problems: tuple[str, ...]
    runs: tuple[tuple[PytestRun, tuple[str, ...]], ...] = ()  # each run and the files it collects


def _scope(
    step: Step, repo_root: Path, config: RunConfig, settings: ProjectSettings, graph: ImportGraph
) -> _Scope:
    problems: list[str] = []
    try:
        runs = pytest_runs(
            step.commands, step.working_dir or config.default_working_dir, config.workspace_root
        )
    except CommandParseError as error:
        runs, problems = [], [str(error)]
    test_files: list[str] = []
    collected = []
    for run in runs:
        problems.extend(
            f"{run.command!r}: test path {path!r} does not exist"
            for path in missing_targets(repo_root, run)
        )
        files = tuple(collected_files(repo_root, run, settings.testpaths))
        collected.append((run, files))
        test_files.extend(files)
    test_files = list(dict.fromkeys(test_files))
    roots = dict.fromkeys(test_files)
    if test_files:
        for test_file in test_files:
            roots.update(dict.fromkeys(conftest_chain(repo_root, test_file)))
        roots.update(
            dict.fromkeys(
                graph.modules[module]
                for module in settings.plugin_modules
                if module in graph.modules
            )
        )
    return _Scope(tuple(test_files), tuple(roots), tuple(problems), tuple(collected))


def _selection_problems(
    repo_root: Path,
    scope: _Scope,
    step_key: str,
    selected: dict[str, set[str]],
    inventory: TestInventory,
) -> list[str]:
    """Commands whose paths and filters select no test; records which tests each step runs."""
    problems = []
    for run, files in scope.runs:
        try:
            tests = selected_tests(repo_root, run, list(files), inventory)
        except ValueError as error:
            problems.append(f"{run.command!r}: {error}")
            continue
        if not tests:
            problems.append(f"{run.command!r}: its paths and filters select no test")
        for test in tests:
            selected.setdefault(test.node_id, set()).add(step_key)
    return problems


def _missing_declared(step: Step, repo_root: Path) -> list[str]:
    includes, excludes = split_dependencies(step.source_file_dependencies)
    return [
        entry
        for entry in (*includes, *(f"!{item}" for item in excludes))
        if not (repo_root / entry.removeprefix("!").rstrip("/")).exists()
    ]


def _ignore_reason(ignores: Mapping[str, str], path: str) -> str | None:
    """The reason of the first ``ignore`` entry (path -> reason) that covers ``path``."""
    return next((why for entry, why in ignores.items() if matches_dependency(entry, path)), None)


class DependencyChecker:
    """One repository's import graph and step scopes, shared by the whole-repository check
    and the change mode."""

    def __init__(
        self,
        areas: TestAreas,
        config: RunConfig,
        repo_root: Path,
        graph: ImportGraph | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        check = config.dependency_check
        problems = import_root_problems(repo_root, check.import_roots)
        problems += [
            f"registries entry {path!r} is not a Python file of the repository"
            for path in check.registries
            if not (path.endswith(".py") and (repo_root / path).is_file())
        ]
        problems += [
            f"platforms entry {path!r} is not a Python file of the repository"
            for path in check.platforms
            if not (path.endswith(".py") and (repo_root / path).is_file())
        ]
        unknown = sorted(set(check.ignore) - {step.key for step in areas.steps})
        if unknown:
            problems.append(f"ignore names unknown steps {unknown}")
        if problems:
            raise CIInputError(
                "\n".join(f"{config.path}: dependency_check: {problem}" for problem in problems)
            )
        clear_caches()  # files may have changed since an earlier check in this process
        self.areas, self.config, self.repo_root = areas, config, repo_root
        self.cache_dir = cache_dir
        self.settings = ProjectSettings.read(repo_root)
        self.graph = graph or ImportGraph.scan(
            repo_root, check.import_roots, check.registries, cache_dir
        )
        self.coverage = _Coverage(self.graph)
        self.scopes = {
            step.key: _scope(step, repo_root, config, self.settings, self.graph)
            for step in areas.steps
        }

    def off_platform(self, step: Step) -> frozenset[str]:
        """The platform modules that never run on the step's device (``platforms``)."""
        device = step.device or "default"
        return frozenset(
            path
            for path, devices in self.config.dependency_check.platforms.items()
            if not any(fnmatch.fnmatchcase(device, pattern) for pattern in devices)
        )

    def _reach(self, step: Step) -> tuple[int, int]:
        """(files reached statically, files reached by any edge) as bitsets, on the step's
        device."""
        roots, excluded = self.scopes[step.key].roots, self.off_platform(step)
        static = self.graph.reach(roots, (STATIC,), excluded)
        return static, static | self.graph.reach(roots, (STATIC, REGISTRY), excluded)

    def check_step(
        self, step: Step, selected: dict[str, set[str]], inventory: TestInventory
    ) -> StepReport:
        scope = self.scopes[step.key]
        static, reachable = self._reach(step)
        covered = self.coverage.covered(step.dependencies)
        outside = self.coverage.all & ~(reachable | covered)
        known: dict[str, str | None] = {}
        ignores = self.config.dependency_check.ignore.get(step.key, {})
        static_gaps = set(members(static & ~covered))
        module_level = self.graph.reach(scope.roots, (MODULE_LEVEL,), self.off_platform(step))
        direct = self._imported_by_tests(scope, self.off_platform(step))
        gaps, ignored = [], []
        for index in members(reachable & ~covered):
            path = self.graph.nodes[index]
            reason = _ignore_reason(ignores, path) if ignores else None
            if reason is not None:
                ignored.append((path, reason))
                continue
            kind = STATIC if index in static_gaps else REGISTRY
            suggestion = self.coverage.suggest(path, outside, known)
            tier_a = bool(module_level >> index & 1)
            gaps.append(Gap(path, kind, suggestion, tier_a, tier_a and path in direct))
        problems = [
            *scope.problems,
            *_selection_problems(self.repo_root, scope, step.key, selected, inventory),
        ]
        missing = _missing_declared(step, self.repo_root)
        return StepReport(
            key=step.key,
            location=f"{step.file}:{step.line}",
            test_files=scope.test_files,
            roots=scope.roots,
            reachable=bin(reachable).count("1"),
            gaps=tuple(gaps),
            missing_declared=tuple(missing),
            declared_at=tuple(
                (entry, f"{step.file}:{step.declared_lines.get(entry, step.line)}")
                for entry in missing
            ),
            problems=tuple(problems),
            ignored=tuple(ignored),
            off_platform=self.off_platform(step),
        )

    def check_all(self) -> DependencyReport:
        """Gaps, dead entries and unrun tests for every step."""
        test_roots = self.config.dependency_check.test_roots or self.settings.testpaths or (".",)
        test_files = {
            *(path for scope in self.scopes.values() for path in scope.test_files),
            *_test_files(test_roots, self.graph),
        }
        inventory = TestInventory(self.repo_root, sorted(test_files), self.cache_dir)
        selected: dict[str, set[str]] = {}
        reports = [self.check_step(step, selected, inventory) for step in self.areas.steps]
        closures = {
            step.key: frozenset(self.graph.nodes[index] for index in members(self._reach(step)[1]))
            for step in self.areas.steps
        }
        used = {(report.key, path) for report in reports for path, _ in report.ignored}
        stale = [
            f"{key}: {entry}"
            for key, entries in self.config.dependency_check.ignore.items()
            for entry in entries
            if not any(k == key and matches_dependency(entry, path) for k, path in used)
        ]
        tests = [
            test
            for path in _test_files(test_roots, self.graph)
            for test in inventory(self.repo_root, path)
        ]
        orphans = _orphans(tests, selected)
        return DependencyReport(
            tuple(reports), tuple(orphans), tuple(stale), len(self.graph.modules), closures
        )

    def missed_triggers(self, selection: Selection) -> list[MissedTrigger]:
        """Each unselected step whose imports reach a changed file on its device, with the
        chain and the tier of the evidence; a step an entry already covers is ``covered``.
        Reach is asked backwards, from each changed file, once per device's excluded
        platform modules: no closure of the whole graph is built."""
        changed = [path for path in selection.changed_files if path in self.graph.path_modules]
        chosen = selection.selected_keys()
        names = {path: self._names_of(path) for path in changed}
        missed = []
        for step in self.areas.steps:
            if step.key in chosen or not changed:
                continue
            scope = self.scopes[step.key]
            excluded = self.off_platform(step)
            ignores = self.config.dependency_check.ignore.get(step.key, {})
            hits = [
                path
                for path in changed
                if self._reaches(scope.roots, path, (STATIC, REGISTRY), excluded)
                and _ignore_reason(ignores, path) is None
            ]
            if not hits:
                continue
            reachable = self._reach(step)[1]
            covered = self.coverage.covered(step.dependencies)
            outside = self.coverage.all & ~(reachable | covered)
            known: dict[str, str | None] = {}
            for path in hits:
                chain, kind = self.graph.chain(scope.roots, path, excluded)
                if matching_entry(step.dependencies, path) is not None:
                    tier = COVERED
                elif self._reaches(scope.roots, path, (MODULE_LEVEL,), excluded):
                    tier = TIER_STATIC
                elif self._tests_name(scope, names[path]):
                    tier = TIER_NAMED
                else:
                    tier = TIER_WEAK
                missed.append(
                    MissedTrigger(
                        step.key,
                        f"{step.file}:{step.line}",
                        path,
                        kind,
                        chain,
                        self.coverage.suggest(path, outside, known),
                        tier=tier,
                        nightly=step.optional,
                    )
                )
        return missed

    def _reaches(
        self, roots: tuple[str, ...], path: str, kinds: tuple[str, ...], excluded: frozenset[str]
    ) -> bool:
        return self.graph.reaches(
            roots, self.graph.reaching(path, kinds, excluded), kinds, excluded
        )

    def _imported_by_tests(self, scope: _Scope, excluded: frozenset[str]) -> set[str]:
        """Files the step's test files, conftest chain, plugins and their test helpers (modules
        outside the package roots) import at module level themselves."""
        sources = set(scope.roots)
        for root in scope.roots:
            sources.update(
                target
                for target in self.graph.edges(root, MODULE_LEVEL)
                if not target.startswith(self._package_roots)
            )
        return {
            target
            for source in sources
            for target in self.graph.edges(source, MODULE_LEVEL)
            if target not in excluded
        }

    def _names_of(self, path: str) -> frozenset[str]:
        """What a test would write to mean ``path``: its module name, its top-level classes
        and the registry keys whose dotted strings point into it."""
        module = self.graph.path_modules.get(path, "")
        names = {module} if module else set()
        names.update(top_level_classes(self.repo_root / path))
        for registry in self.config.dependency_check.registries:
            names.update(registry_keys(self.repo_root / registry, module))
        return frozenset(name for name in names if name)

    def _tests_name(self, scope: _Scope, names: frozenset[str]) -> bool:
        """Whether a test file of the step names one of ``names`` as a word, or calls a
        definition of a helper it imports (a non-test module under the test roots) that does:
        ``tests/utils.py`` names every backend somewhere; a test that uses the function that
        returns ``TRITON_ATTN`` does select it."""
        if not names:
            return False
        pattern = _word_pattern(names)
        for test_file in scope.test_files:
            text = _text(self.repo_root / test_file)
            if pattern.search(text):
                return True
            helpers = [
                target
                for target in self.graph.edges(test_file, STATIC)
                if not target.startswith(self._package_roots) and not is_test_file(target)
            ]
            used = set().union(*(_definitions_naming(self.repo_root / h, names) for h in helpers))
            if used and _word_pattern(frozenset(used)).search(text):
                return True
        return False

    @functools.cached_property
    def _package_roots(self) -> tuple[str, ...]:
        """Top-level folders that hold product code, not test helpers (not under test roots)."""
        roots = self.config.dependency_check.test_roots or self.settings.testpaths or ()
        return tuple(
            f"{name}/"
            for name in {path.split("/")[0] for path in self.graph.nodes if "/" in path}
            if not any(name == root.rstrip("/").split("/")[0] for root in roots)
        )

    def steps_running(self, node_ids: set[str]) -> dict[str, set[str]]:
        """Test node id -> keys of the steps whose pytest commands run it (-k, -m and node-id
        arguments applied as in the whole-repository check)."""
        files = {node.partition("::")[0] for node in node_ids}
        inventory = TestInventory(self.repo_root, sorted(files), self.cache_dir)
        running: dict[str, set[str]] = defaultdict(set)
        for step in self.areas.steps:
            for run, run_files in self.scopes[step.key].runs:
                wanted = [path for path in run_files if path in files]
                if not wanted:
                    continue
                try:
                    tests = selected_tests(self.repo_root, run, wanted, inventory)
                except ValueError:  # a bad -k/-m expression: a problem of the step, reported there
                    continue
                for test in tests:
                    if test.node_id in node_ids:
                        running[test.node_id].add(step.key)
        return running

    def ran_this_code(
        self, selection: Selection, line_tests: LineTests, lines: Mapping[str, Iterable[int]]
    ) -> list[RanThisCode]:
        """Steps whose tests executed a changed line when the coverage data was recorded:
        unselected ones (missed triggers) first, then most changed lines, then most tests
        (a step whose suite exercises the code throughout before one that touches it once)."""
        tests = line_tests.tests_for(lines)
        running = self.steps_running(set(tests))
        per_step: dict[str, set[str]] = defaultdict(set)
        for test, keys in running.items():
            for key in keys:
                per_step[key].add(test)
        steps = self.areas.by_key()
        chosen = selection.selected_keys()
        found = [
            RanThisCode(
                key=key,
                location=f"{steps[key].file}:{steps[key].line}",
                selected=key in chosen,
                tests=tuple(sorted(step_tests)),
                lines=tuple(sorted({line for test in step_tests for line in tests[test]})),
            )
            for key, step_tests in per_step.items()
        ]
        return sorted(
            found, key=lambda item: (item.selected, -len(item.lines), -len(item.tests), item.key)
        )


@functools.lru_cache(maxsize=4096)
def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@functools.lru_cache(maxsize=64)
def _word_pattern(names: frozenset[str]) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(names))) + r")\b")


@functools.lru_cache(maxsize=4096)
def _definitions_naming(path: Path, names: frozenset[str]) -> frozenset[str]:
    """Top-level functions, classes and constants of a helper module whose source names one
    of ``names`` as a word."""
    text = _text(path)
    pattern = _word_pattern(names)
    if not pattern.search(text):
        return frozenset()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return frozenset()
    lines = text.splitlines()
    found = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined = [node.name]
        elif isinstance(node, ast.Assign):
            defined = [target.id for target in node.targets if isinstance(target, ast.Name)]
        else:
            continue
        if pattern.search("\n".join(lines[node.lineno - 1 : node.end_lineno])):
            found.update(defined)
    return frozenset(found)


def top_level_classes(path: Path) -> list[str]:
    """Names of the classes a module defines at its top level (none if it does not parse)."""
    try:
        tree = ast.parse(_text(path))
    except (SyntaxError, ValueError):
        return []
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)]


def registry_keys(registry: Path, module: str) -> list[str]:
    """Keys of a registry whose dotted-path string points into ``module``: enum members or
    constants (``TRITON_ATTN = "vllm...triton_attn.TritonAttentionBackend"``) and dict keys."""
    if not module:
        return []
    try:
        tree = ast.parse(_text(registry))
    except (SyntaxError, ValueError):
        return []

    def names_module(value: ast.expr | None) -> bool:
        return (
            isinstance(value, ast.Constant)
            and isinstance(value.value, str)
            and (value.value == module or value.value.startswith(f"{module}."))
        )

    keys: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and names_module(node.value):
            keys.extend(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.Dict):
            keys.extend(
                key.value
                for key, value in zip(node.keys, node.values, strict=True)
                if isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and names_module(value)
            )
    return keys


def check_dependencies(
    areas: TestAreas,
    config: RunConfig,
    repo_root: Path,
    graph: ImportGraph | None = None,
    cache_dir: Path | None = None,
) -> DependencyReport:
    """Gaps, dead entries and unrun tests for every step of ``areas``."""
    return DependencyChecker(areas, config, repo_root, graph, cache_dir).check_all()


def _test_files(roots: tuple[str, ...], graph: ImportGraph) -> list[str]:
    return [
        path
        for path in graph.nodes
        if is_test_file(path)
        and any(root in (".", "") or path.startswith(f"{root.rstrip('/')}/") for root in roots)
    ]


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


def suggested_entries(step: StepReport) -> list[str]:
    """The entries ``--fix`` adds: one per distinct suggestion, most general first."""
    entries = sorted({gap.suggestion for gap in step.gaps}, key=lambda entry: (len(entry), entry))
    minimal: list[str] = []
    for entry in entries:
        if not any(matches_dependency(kept, entry.rstrip("/")) for kept in minimal):
            minimal.append(entry)
    return minimal


def example_chain(graph: ImportGraph, step: StepReport, entry: str) -> tuple[str, ...]:
    """The shortest import chain to the first gap that ``entry`` would cover."""
    path = next(gap.path for gap in step.gaps if gap.suggestion == entry)
    return graph.chain(step.roots, path, step.off_platform)[0]
