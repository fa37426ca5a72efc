"""From a step's shell commands to the pytest invocations they run, in repository terms.

Buildkite runs a step's commands as one script, so ``cd`` carries over; ``working_dir``
(absolute under ``workspace_root``, or repository-relative) is where it starts. Commands are
split as a shell splits them: quotes may span lines, a backslash joins lines, ``#`` starts a
comment. An option's value is never a test path: which options take values is read from
pytest, its installed plugins and the repository's own ``addoption`` calls (``attngroup.ci.selection.pytest_options``).
Given the repository (``repo_root``), shell globs in test paths are expanded against the tree,
as the shell would; ``resolve_run`` does that for a run parsed without it.
"""

from __future__ import annotations

import functools
import posixpath
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from attngroup.ci.selection.pytest_options import (
    PytestOptions,
    installed_options,
    repository_options,
)

_WRAPPERS = frozenset({"timeout", "env", "time", "nohup", "xvfb-run", "uv", "poetry", "pdm"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;"})
_WORD_BREAKS = " \t\n;&|()"
_GLOB_CHARACTERS = frozenset("*?[")


class CommandParseError(ValueError):
    pass


@dataclass(frozen=True)
class PytestRun:
    """One pytest invocation: repository-relative cwd and paths, and its filters."""

    command: str
    cwd: str
    paths: tuple[str, ...]  # repository-relative; may carry ::node suffixes
    keyword: str | None = None
    markers: str | None = None
    deselect: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    # Options no declaration names (a plugin that is not installed here): their following
    # argument is taken as their value unless it exists in the tree.
    unknown_options: tuple[str, ...] = ()
    # What pytest was given, to parse again once the repository is known (resolve_run).
    arguments: tuple[str, ...] = field(default=(), compare=False)
    workspace_root: str | None = field(default=None, compare=False)


def map_directory(directory: str, cwd: str, workspace_root: str | None) -> str:
    """A shell directory -> repository-relative path ('.' is the root)."""
    if posixpath.isabs(directory):
        if not workspace_root:
            raise CommandParseError(
                f"absolute directory {directory!r} but no workspace_root in the run configuration"
            )
        relative = posixpath.relpath(directory, workspace_root)
    else:
        relative = posixpath.join(cwd, directory)
    normalized = posixpath.normpath(relative)
    if normalized == ".." or normalized.startswith("../"):
        raise CommandParseError(f"directory {directory!r} lies outside the repository")
    return normalized


def _shell_text(command: str) -> str:
    """``command`` with line continuations joined, comments dropped and every newline outside
    quotes turned into ``;`` (so one shlex pass splits the whole snippet)."""
    out: list[str] = []
    quote: str | None = None
    at_word_start = True
    index = 0
    while index < len(command):
        character = command[index]
        if quote == "'":
            quote = None if character == "'" else quote
        elif character == "\\" and index + 1 < len(command):
            if command[index + 1] != "\n":
                out.append(command[index : index + 2])
                at_word_start = False
            index += 2
            continue
        elif quote == '"':
            quote = None if character == '"' else quote
        elif character in "'\"":
            quote = character
        elif character == "#" and at_word_start:
            end = command.find("\n", index)
            index = len(command) if end < 0 else end
            continue
        elif character == "\n":
            character = " ; "
        out.append(character)
        at_word_start = quote is None and character[-1] in _WORD_BREAKS
        index += 1
    if quote is not None:
        raise CommandParseError(
            f"cannot parse shell command {command.strip()!r}: no closing {quote}"
        )
    return "".join(out)


def _simple_commands(command: str) -> list[list[str]]:
    """Tokens of each simple command in a shell snippet (newlines and ;, &&, | split)."""
    lexer = shlex.shlex(_shell_text(command), posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = list(lexer)
    except ValueError as error:
        raise CommandParseError(
            f"cannot parse shell command {command.strip()!r}: {error}"
        ) from None
    result: list[list[str]] = []
    current: list[str] = []
    for token in tokens:
        if token in _SEPARATORS:
            if current:
                result.append(current)
            current = []
        else:
            current.append(token)
    if current:
        result.append(current)
    return result


def _pytest_arguments(tokens: list[str]) -> list[str] | None:
    """Arguments after ``pytest`` if this simple command runs pytest, else None."""
    words = [token for token in tokens if not ("=" in token and token.split("=")[0].isidentifier())]
    for index, word in enumerate(words):
        if posixpath.basename(word) in ("pytest", "py.test"):
            previous = words[index - 1] if index else ""
            if index == 0 or previous in ("-m", "run", "exec") or words[0] in _WRAPPERS:
                return words[index + 1 :]
    return None


def _expand_glob(path: str, repo_root: Path | None) -> list[str]:
    """The tree's matches of a glob, sorted (the literal when nothing matches, as in bash)."""
    file_part, separator, node = path.partition("::")
    if repo_root is None or not _GLOB_CHARACTERS & set(file_part):
        return [path]
    matches = sorted(match.relative_to(repo_root).as_posix() for match in repo_root.glob(file_part))
    return [match + separator + node for match in matches] or [path]


def _split_arguments(
    arguments: list[str], options: PytestOptions, exists: Callable[[str], bool]
) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """(positional arguments, option -> values, unknown options) of a pytest command line."""
    positional: list[str] = []
    values: dict[str, list[str]] = {}
    unknown: list[str] = []
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        index += 1
        if argument == "--":
            positional.extend(arguments[index:])
            break
        if not argument.startswith("-") or argument == "-":
            positional.append(argument)
            continue
        name, equals, attached = argument.partition("=")
        if not argument.startswith("--") and len(argument) > 2:
            name, equals, attached = argument[:2], "=", argument[2:].removeprefix("=")
            if options.arity(name) is None:
                continue  # clustered short flags: -sv, -vvv
        if equals:
            values.setdefault(name, []).append(attached)
            continue
        arity = options.arity(name)
        if arity is None:
            if not options.knows(name):
                unknown.append(name)
                follows = arguments[index] if index < len(arguments) else "-"
                if not follows.startswith("-") and not exists(follows):
                    values.setdefault(name, []).append(follows)
                    index += 1
            continue
        taken = 0
        while index < len(arguments) and (arity.greedy or taken < arity.count):
            if arity.greedy and arguments[index].startswith("-"):
                break
            values.setdefault(name, []).append(arguments[index])
            index += 1
            taken += 1
        if taken < arity.count and not arity.greedy:
            raise CommandParseError(f"option {name} needs a value")
    return positional, values, unknown


def _parse_pytest(
    command: str,
    arguments: list[str],
    cwd: str,
    workspace_root: str | None,
    repo_root: Path | None,
) -> PytestRun:
    options = repository_options(repo_root) if repo_root else installed_options()

    def relative(path: str) -> str:
        file_part, separator, node = path.partition("::")
        return map_directory(file_part, cwd, workspace_root) + separator + node

    def exists(argument: str) -> bool:
        return repo_root is None or (repo_root / relative(argument).partition("::")[0]).exists()

    try:
        positional, values, unknown = _split_arguments(arguments, options, exists)
    except CommandParseError as error:
        raise CommandParseError(f"{command!r}: {error}") from None
    keyword = " and ".join(f"({value})" for value in values.get("-k", [])) or None
    markers = " and ".join(f"({value})" for value in values.get("-m", [])) or None
    paths = [
        expanded for path in positional for expanded in _expand_glob(relative(path), repo_root)
    ]
    return PytestRun(
        command=command,
        cwd=cwd,
        paths=tuple(paths),
        keyword=keyword,
        markers=markers,
        deselect=tuple(relative(path) for path in values.get("--deselect", [])),
        ignore=tuple(relative(path) for path in values.get("--ignore", [])),
        unknown_options=tuple(dict.fromkeys(unknown)),
        arguments=tuple(arguments),
        workspace_root=workspace_root,
    )


def clear_caches() -> None:
    """Forget resolved runs and discovered options (the tree or its conftests may change)."""
    _resolved.cache_clear()
    repository_options.cache_clear()


def resolve_run(run: PytestRun, repo_root: Path) -> PytestRun:
    """``run`` parsed again knowing the repository: its own options, globs against the tree."""
    if not run.arguments:
        return run
    return _resolved(run.command, run.arguments, run.cwd, run.workspace_root, repo_root)


@functools.cache
def _resolved(
    command: str, arguments: tuple[str, ...], cwd: str, workspace_root: str | None, repo_root: Path
) -> PytestRun:
    """Cached by everything the parse reads (``PytestRun`` equality leaves ``arguments`` out)."""
    run = _parse_pytest(command, list(arguments), cwd, workspace_root, repo_root)
    return replace(run, arguments=())


def pytest_runs(
    commands: tuple[str, ...],
    working_dir: str | None,
    workspace_root: str | None,
    repo_root: Path | None = None,
) -> list[PytestRun]:
    """Every pytest invocation in a step's commands (resolved when ``repo_root`` is given).

    A directory outside the repository (vLLM's AMD mirrors run some scripts from ``/``) is an
    error only when pytest runs there.
    """
    cwd: str | None = "."
    outside = ""

    def enter(directory: str, current: str) -> str | None:
        nonlocal outside
        try:
            return map_directory(directory, current, workspace_root)
        except CommandParseError as error:
            outside = str(error)
            return None

    if working_dir:
        cwd = enter(working_dir, ".")
    runs = []
    for command in commands:
        for tokens in _simple_commands(command):
            if tokens[0] == "cd" and len(tokens) == 2:
                if cwd is not None:
                    cwd = enter(tokens[1], cwd)
                elif tokens[1].startswith("/"):  # back from outside: absolute, so "." goes unread
                    cwd = enter(tokens[1], ".")
                continue
            arguments = _pytest_arguments(tokens)
            if arguments is None:
                continue
            if cwd is None:
                raise CommandParseError(f"{outside}, and {' '.join(tokens)!r} runs there")
            run = _parse_pytest(" ".join(tokens), arguments, cwd, workspace_root, None)
            runs.append(resolve_run(run, repo_root) if repo_root else run)
    return runs
