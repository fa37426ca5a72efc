"""Which pytest command-line options take values, read from where they are declared.

An option's value is no test path (``--models llama3.2``, ``--shard 0/2``), so the parser of
step commands must know every option a run accepts: pytest's own, those of the installed
pytest11 plugins, and those the repository registers in its ``conftest.py`` files and its own
pytest11 plugins (``[project.entry-points.pytest11]`` in pyproject.toml). All of them are read
the same way, from the source's ``addoption`` / ``_addoption`` calls (nothing is imported or
run), so no table is kept by hand and a new option is known as soon as it is declared.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import _pytest

# argparse actions that take no value.
_FLAG_ACTIONS = frozenset(
    {"store_true", "store_false", "store_const", "append_const", "count", "help", "version"}
)
_SKIPPED_DIRECTORIES = frozenset({".git", ".nox", ".tox", ".venv", "venv", "node_modules"})


@dataclass(frozen=True)
class OptionArity:
    """How many arguments follow an option: a fixed count, or all until the next option."""

    count: int = 1
    greedy: bool = False  # nargs="+" or "*"


@dataclass(frozen=True)
class PytestOptions:
    """Option string -> arity, for every option that takes at least one value."""

    values: Mapping[str, OptionArity]
    flags: frozenset[str]

    def arity(self, option: str) -> OptionArity | None:
        return self.values.get(option)

    def knows(self, option: str) -> bool:
        return option in self.flags or self.arity(option) is not None

    def merged(self, other: PytestOptions) -> PytestOptions:
        return PytestOptions(
            values={**self.values, **other.values},
            flags=self.flags | other.flags,
        )


def _arity(call: ast.Call) -> OptionArity | None:
    """None for a flag; the arity for an option that takes values."""
    keywords = {keyword.arg: keyword.value for keyword in call.keywords if keyword.arg}
    action = keywords.get("action")
    if isinstance(action, ast.Constant) and action.value in _FLAG_ACTIONS:
        return None
    # A custom action class (pytest's -q) is a flag unless the call declares what follows.
    custom = action is not None and not isinstance(action, ast.Constant)
    if custom and not {"nargs", "metavar", "type"} & set(keywords):
        return None
    nargs = keywords.get("nargs")
    if isinstance(nargs, ast.Constant):
        if nargs.value in ("+", "*"):
            return OptionArity(greedy=True)
        if isinstance(nargs.value, int):
            return OptionArity(count=nargs.value) if nargs.value else None
    return OptionArity()


def options_in_source(source: str) -> PytestOptions:
    """Options declared by ``*.addoption(...)`` / ``*._addoption(...)`` calls in ``source``."""
    if "addoption" not in source:  # most of pytest's files: no need to parse them
        return PytestOptions({}, frozenset())
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return PytestOptions({}, frozenset())
    values: dict[str, OptionArity] = {}
    flags: set[str] = set()
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("addoption", "_addoption")
        ):
            continue
        names = [
            argument.value
            for argument in node.args
            if isinstance(argument, ast.Constant)
            and isinstance(argument.value, str)
            and argument.value.startswith("-")
        ]
        arity = _arity(node)
        for name in names:
            if arity is None:
                flags.add(name)
            else:
                values[name] = arity
    return PytestOptions(values, frozenset(flags))


def _options_in_files(paths: Iterable[Path]) -> PytestOptions:
    found = PytestOptions({}, frozenset())
    for path in paths:
        try:
            found = found.merged(options_in_source(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return found


def _module_file(module: str) -> Path | None:
    """The source file of an installed module, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


@functools.cache
def installed_options() -> PytestOptions:
    """pytest's own options and those of every installed pytest11 plugin."""
    files = list(Path(_pytest.__file__).parent.rglob("*.py"))
    for entry_point in importlib.metadata.entry_points(group="pytest11"):
        module_file = _module_file(entry_point.value.partition(":")[0])
        if module_file is not None:
            files.append(module_file)
    return _options_in_files(files)


def _repository_plugin_files(repo_root: Path) -> list[Path]:
    pyproject = repo_root / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return []
    plugins = data.get("project", {}).get("entry-points", {}).get("pytest11", {})
    files = []
    for value in plugins.values():
        parts = value.partition(":")[0].split(".")
        for candidate in (
            repo_root.joinpath(*parts[:-1], f"{parts[-1]}.py"),
            repo_root.joinpath(*parts, "__init__.py"),
        ):
            if candidate.is_file():
                files.append(candidate)
    return files


def _conftest_files(repo_root: Path) -> list[Path]:
    found = []
    for path in repo_root.rglob("conftest.py"):
        relative = path.relative_to(repo_root).parts
        if not any(part in _SKIPPED_DIRECTORIES for part in relative):
            found.append(path)
    return found


@functools.cache
def repository_options(repo_root: Path) -> PytestOptions:
    """Every option a pytest run in ``repo_root`` accepts (installed + the repository's own)."""
    own = _options_in_files([*_conftest_files(repo_root), *_repository_plugin_files(repo_root)])
    return installed_options().merged(own)
