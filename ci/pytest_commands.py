"""From a step's shell commands to the pytest invocations they run, in repository terms.

Buildkite runs a step's commands as one script, so ``cd`` carries over; ``working_dir``
(absolute under ``workspace_root``, or repository-relative) is where it starts.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

# pytest options whose value is the next argument (so it is no test path).
_VALUE_OPTIONS = frozenset(
    (
        "-k",
        "-m",
        "-p",
        "-c",
        "-o",
        "-n",
        "-W",
        "-r",
        "--deselect",
        "--ignore",
        "--ignore-glob",
        "--rootdir",
        "--maxfail",
        "--durations",
        "--durations-min",
        "--tb",
        "--junitxml",
        "--junit-xml",
        "--log-level",
        "--log-cli-level",
        "--log-file",
        "--timeout",
        "--dist",
        "--basetemp",
        "--confcutdir",
        "--import-mode",
        "--cov",
        "--cov-report",
        "--count",
        "--reruns",
        "--reruns-delay",
        "--override-ini",
        "--capture",
        "--color",
        "--engine",
        "--device",
        "--splits",
        "--group",
        "--shard-id",
        "--num-shards",
        "--random-order-seed",
        "--maxprocesses",
        "--hypothesis-seed",
    )
)
_WRAPPERS = frozenset({"timeout", "env", "time", "nohup", "xvfb-run", "uv", "poetry", "pdm"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;"})


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


def _simple_commands(command: str) -> list[list[str]]:
    """Tokens of each simple command in a shell snippet (newlines and ;, &&, | split)."""
    result: list[list[str]] = []
    for line in command.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError as error:
            raise CommandParseError(
                f"cannot parse shell command {line.strip()!r}: {error}"
            ) from None
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


def _parse_pytest(
    command: str, arguments: list[str], cwd: str, workspace_root: str | None
) -> PytestRun:
    paths: list[str] = []
    options: dict[str, list[str]] = {}
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        if argument.startswith("--") and "=" in argument:
            name, _, value = argument.partition("=")
            options.setdefault(name, []).append(value)
        elif argument in _VALUE_OPTIONS:
            if index + 1 >= len(arguments):
                raise CommandParseError(f"{command!r}: option {argument} needs a value")
            options.setdefault(argument, []).append(arguments[index + 1])
            index += 1
        elif len(argument) > 2 and argument[:2] in ("-k", "-m") and argument[1] in "km":
            options.setdefault(argument[:2], []).append(argument[2:])
        elif not argument.startswith("-"):
            paths.append(argument)
        index += 1

    def relative(path: str) -> str:
        file_part, separator, node = path.partition("::")
        return map_directory(file_part, cwd, workspace_root) + separator + node

    keyword = " and ".join(f"({value})" for value in options.get("-k", [])) or None
    markers = " and ".join(f"({value})" for value in options.get("-m", [])) or None
    return PytestRun(
        command=command,
        cwd=cwd,
        paths=tuple(relative(path) for path in paths),
        keyword=keyword,
        markers=markers,
        deselect=tuple(relative(path) for path in options.get("--deselect", [])),
        ignore=tuple(relative(path) for path in options.get("--ignore", [])),
    )


def pytest_runs(
    commands: tuple[str, ...], working_dir: str | None, workspace_root: str | None
) -> list[PytestRun]:
    """Every pytest invocation in a step's commands."""
    cwd = map_directory(working_dir, ".", workspace_root) if working_dir else "."
    runs = []
    for command in commands:
        for tokens in _simple_commands(command):
            if tokens[0] == "cd" and len(tokens) == 2:
                cwd = map_directory(tokens[1], cwd, workspace_root)
                continue
            arguments = _pytest_arguments(tokens)
            if arguments is not None:
                runs.append(_parse_pytest(" ".join(tokens), arguments, cwd, workspace_root))
    return runs
