"""Static view of the tests a pytest invocation collects, and whether its filters keep any.

Python ids of parametrized tests and markers added at collection time are unknowable without
running pytest. ``-k`` and ``-m`` are evaluated per test as pytest evaluates them (``-k``: a
case-insensitive substring of one of the node's names or markers; ``-m``: a marker name), with
each name the test's own fact: true, false, or unknown when ids or markers are dynamic. A test
is "possibly selected" when some truth value of its unknown names (each independently) makes
the expression true; a step is reported as selecting nothing only when no test is even
possibly selected.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attngroup.ci.deps.imports import iter_python_files
from attngroup.ci.selection.pytest_commands import PytestRun, resolve_run
from attngroup.ci.selection.pytest_commands import clear_caches as clear_resolved_runs

# pytest's own -k/-m grammar (private module; SyntaxError on bad input since pytest 8.4),
# imported when a -k/-m is evaluated: change mode without --coverage never does.
if TYPE_CHECKING:
    from _pytest.mark.expression import Expression

DYNAMIC_MARKER_HINTS = ("add_marker", "pytest_collection_modifyitems")
DYNAMIC_ID_HINTS = ("pytest_generate_tests", "params=")


@dataclass(frozen=True)
class TestFunction:
    """One test function (parametrizations folded in) with what -k and -m can see."""

    __test__ = False  # not a pytest test class

    file: str
    node: str  # "test_x" or "TestClass::test_x"
    names: frozenset[str]  # node names pytest matches -k against (file, dirs, class, function)
    markers: frozenset[str]
    dynamic_ids: bool  # parametrized: ids unknown statically
    dynamic_markers: bool  # markers may be added during collection

    @property
    def node_id(self) -> str:
        return f"{self.file}::{self.node}"


def clear_caches() -> None:
    """Forget parsed test files, conftests and resolved runs (a long-lived process may see
    them change)."""
    tests_in_file.cache_clear()
    _conftest_text.cache_clear()
    clear_resolved_runs()


def is_test_file(path: str) -> bool:
    name = posixpath.basename(path)
    return fnmatch.fnmatch(name, "test_*.py") or fnmatch.fnmatch(name, "*_test.py")


def _marker_names(decorators: list[ast.expr]) -> tuple[set[str], bool]:
    """Marker names of ``@pytest.mark.X`` decorators, and whether any other decorator (an
    alias such as ``gpu_only``, ``@given``) might add markers we cannot see."""
    names, unknown = set(), False
    for decorator in decorators:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and "mark" in ast.unparse(target.value):
            names.add(target.attr)
        else:
            unknown = True
    return names, unknown


def _module_markers(tree: ast.Module) -> tuple[set[str], bool]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets
        ):
            value = node.value
            values = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            return _marker_names(list(values))
    return set(), False


@functools.cache
def _conftest_text(repo_root: Path, directory: str) -> str:
    """Concatenated source of every conftest.py from the repository root down to ``directory``."""
    parts = [] if directory in ("", ".") else directory.split("/")
    texts = []
    for depth in range(len(parts) + 1):
        conftest = repo_root.joinpath(*parts[:depth], "conftest.py")
        if conftest.is_file():
            texts.append(conftest.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


def conftest_chain(repo_root: Path, test_file: str) -> list[str]:
    """conftest.py files pytest loads for ``test_file``, root first."""
    parts = posixpath.dirname(test_file).split("/") if "/" in test_file else []
    chain = []
    for depth in range(len(parts) + 1):
        candidate = posixpath.join(*parts[:depth], "conftest.py") if depth else "conftest.py"
        if (repo_root / candidate).is_file():
            chain.append(candidate)
    return chain


@functools.cache
def tests_in_file(repo_root: Path, path: str) -> tuple[TestFunction, ...]:
    """Test functions of one file, read from its AST."""
    try:
        source = (repo_root / path).read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return ()
    context = source + _conftest_text(repo_root, posixpath.dirname(path))
    dynamic_markers = any(hint in context for hint in DYNAMIC_MARKER_HINTS)
    module_dynamic_ids = any(hint in context for hint in DYNAMIC_ID_HINTS)
    base_names = {posixpath.basename(path), *posixpath.dirname(path).split("/")} - {""}
    module_marks, module_unknown = _module_markers(tree)
    found = []

    def add(function: ast.FunctionDef | ast.AsyncFunctionDef, owner: ast.ClassDef | None) -> None:
        markers, unknown = _marker_names(function.decorator_list)
        markers |= module_marks
        names = {*base_names, function.name}
        if owner is not None:
            owner_marks, owner_unknown = _marker_names(owner.decorator_list)
            markers |= owner_marks
            unknown |= owner_unknown
            names.add(owner.name)
        parametrized = "parametrize" in markers
        has_arguments = len(function.args.args) > (1 if owner else 0)
        dynamic_ids = parametrized or (has_arguments and module_dynamic_ids)
        found.append(
            TestFunction(
                file=path,
                node=f"{owner.name}::{function.name}" if owner else function.name,
                names=frozenset(names),
                markers=frozenset(markers),
                dynamic_ids=dynamic_ids,
                # pytest.param(..., marks=...) can come from any helper module.
                dynamic_markers=dynamic_markers or dynamic_ids or unknown or module_unknown,
            )
        )

    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            add(node, None)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    member.name.startswith("test")
                ):
                    add(member, node)
    return tuple(found)


# Unknown names are tried in every combination; past this many, a test counts as possible.
_MAX_UNKNOWN_NAMES = 10


def _possibly(expression: Expression, fact: Callable[[str, dict], bool | None]) -> bool:
    """Whether some truth value of the unknown names (``fact`` -> None) makes it true.

    Explores only the names an evaluation asks for (it short-circuits), branching on each
    new one; ``Expression.evaluate`` is the only part of pytest's parser used, so any
    pytest >= 8.4 serves (``Expression.idents`` is newer)."""

    def search(guess: dict[str, bool]) -> bool:
        asked: list[str] = []

        def matcher(name: str, /, **kwargs: object) -> bool:
            known = fact(name, kwargs)
            if known is not None:
                return known
            if name not in guess:
                asked.append(name)
            return guess.get(name, False)

        if expression.evaluate(matcher):
            return True
        new = next((name for name in asked if name not in guess), None)
        if new is None:
            return False
        if len(guess) >= _MAX_UNKNOWN_NAMES:
            return True
        return search({**guess, new: False}) or search({**guess, new: True})

    return search({})


def possibly_selected(test: TestFunction, run: PytestRun) -> bool:
    """Whether ``run``'s -k, -m and --deselect can leave ``test`` in."""
    if any(test.node_id == item or test.node_id.startswith(f"{item}::") for item in run.deselect):
        return False
    if run.keyword:
        haystack = [name.lower() for name in (*test.names, *test.markers)]

        def keyword_fact(name: str, kwargs: dict) -> bool | None:
            if any(name.lower() in candidate for candidate in haystack):
                return True
            return None if test.dynamic_ids else False

        if not _possibly(_compile(run.keyword), keyword_fact):
            return False
    if run.markers:

        def marker_fact(name: str, kwargs: dict) -> bool | None:
            if name in test.markers:
                return None if kwargs else True  # marker arguments are not read statically
            return None if test.dynamic_markers else False

        if not _possibly(_compile(run.markers), marker_fact):
            return False
    return True


@functools.cache
def _compile(text: str) -> Expression:
    from _pytest.mark.expression import Expression

    try:
        return Expression.compile(text)
    except (SyntaxError, ValueError) as error:
        raise ValueError(f"invalid pytest expression {text!r}: {error}") from None


def collected_files(repo_root: Path, run: PytestRun, default_paths: tuple[str, ...]) -> list[str]:
    """Test files ``run`` collects (and so imports), given pytest's default paths."""
    run = resolve_run(run, repo_root)
    targets = run.paths or (default_paths if run.cwd == "." and default_paths else (run.cwd,))
    files: list[str] = []
    for target in targets:
        file_part = target.partition("::")[0]
        if (repo_root / file_part).is_file():
            files.append(file_part)
        elif (repo_root / file_part).is_dir():
            files.extend(
                path for path in iter_python_files(repo_root, file_part) if is_test_file(path)
            )
    ignored = [path.rstrip("/") for path in run.ignore]
    return [
        path
        for path in dict.fromkeys(files)
        if not any(path == item or path.startswith(f"{item}/") for item in ignored)
    ]


def missing_targets(repo_root: Path, run: PytestRun) -> list[str]:
    """Test paths that do not exist (an unmatched glob stays literal, as in bash)."""
    run = resolve_run(run, repo_root)
    return [path for path in run.paths if not (repo_root / path.partition("::")[0]).exists()]


def _node_matches(node: str, wanted: str) -> bool:
    """``wanted`` (from ``file::wanted``) names ``node``, its class, or one parametrization."""
    return node == wanted or node.startswith(f"{wanted}::") or wanted.startswith(f"{node}[")


def selected_tests(
    repo_root: Path,
    run: PytestRun,
    files: list[str],
    inventory: Callable[[Path, str], tuple[TestFunction, ...]] = tests_in_file,
) -> list[TestFunction]:
    """Tests of ``files`` that ``run`` may run (node-id arguments narrow to those nodes);
    ``inventory`` lists a file's tests (check-deps passes its content-keyed cache)."""
    run = resolve_run(run, repo_root)
    nodes: dict[str, list[str]] = {}
    for path in run.paths:
        file_part, _, node = path.partition("::")
        if node:
            nodes.setdefault(file_part, []).append(node)
    result = []
    for path in files:
        for test in inventory(repo_root, path):
            wanted = nodes.get(path)
            if wanted and not any(_node_matches(test.node, item) for item in wanted):
                continue
            if possibly_selected(test, run):
                result.append(test)
    return result
