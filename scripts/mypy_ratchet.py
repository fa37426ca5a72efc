"""mypy with a per-module baseline that may only shrink.

The package has type errors that predate its type checker; a committed baseline
(scripts/mypy-baseline.json: module path -> error count) lets CI hold every module to its
count without fixing them all first. A module with more errors than its count fails (a module
the baseline does not name is allowed none); a module with fewer passes, with a note that the
baseline can shrink. ``--update`` writes the counts as they are, and refuses while any module
has grown: growth is fixed, not recorded. After a merge that moved or renamed modules,
``--update --allow-growth`` records the counts anyway (say why in the commit).

Errors on the lines of a ``@triton.jit`` function are left out: a Triton kernel body is
written in Triton's language, not Python's. The counts are those of the mypy version
requirements/lock.txt pins; another version is refused, since versions differ in what they
find. mypy's settings are pyproject.toml's ``[tool.mypy]``.

Exit status: 0 within the baseline, 1 a module has grown, 2 bad input or environment (an
unreadable baseline, another mypy version, mypy itself failing).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from attngroup.atomic_write import write_text

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "scripts" / "mypy-baseline.json"
LOCK = REPO / "requirements" / "lock.txt"


class RatchetError(Exception):
    """Bad input or environment: the message names the file or the fix (exit 2)."""


@dataclass(frozen=True)
class MypyError:
    """One error mypy reported: ``path:line: message [code]``."""

    path: str
    line: int
    message: str
    code: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: error: {self.message}  [{self.code}]"


@dataclass(frozen=True)
class Comparison:
    """The current counts against the baseline, module by module."""

    grown: dict[str, tuple[int, int]]  # module -> (baseline, now)
    shrunk: dict[str, tuple[int, int]]

    @property
    def passed(self) -> bool:
        return not self.grown


def parse_mypy_json(output: str) -> list[MypyError]:
    """The errors of ``mypy -O json`` output (one JSON object a line; notes dropped)."""
    errors = []
    for number, line in enumerate(output.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            severity, path, row = record["severity"], record["file"], record["line"]
            message, code = record["message"], record["code"] or "misc"
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise RatchetError(
                f"mypy's output line {number} is not a mypy JSON record ({error}): {line[:200]}"
            ) from None
        if severity == "error":
            errors.append(MypyError(path, row, message, code))
    return errors


def _is_triton_jit(decorator: ast.expr) -> bool:
    """``@triton.jit`` or ``@triton.jit(...)``."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) == "triton.jit"


def triton_kernel_lines(source: str) -> set[int]:
    """The line numbers of every ``@triton.jit`` function, decorators included."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any(map(_is_triton_jit, node.decorator_list)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines.update(range(first, (node.end_lineno or node.lineno) + 1))
    return lines


def outside_triton_kernels(errors: Sequence[MypyError], root: Path) -> list[MypyError]:
    """The errors that are not on a line of a Triton kernel body."""
    kernel_lines: dict[str, set[int]] = {}
    for path in {error.path for error in errors}:
        source = (root / path).read_text(encoding="utf-8")
        kernel_lines[path] = triton_kernel_lines(source) if "triton.jit" in source else set()
    return [error for error in errors if error.line not in kernel_lines[error.path]]


def count_by_module(errors: Sequence[MypyError]) -> dict[str, int]:
    return dict(sorted(Counter(error.path for error in errors).items()))


def compare(baseline: Mapping[str, int], counts: Mapping[str, int]) -> Comparison:
    grown, shrunk = {}, {}
    for module in sorted(baseline.keys() | counts.keys()):
        allowed, now = baseline.get(module, 0), counts.get(module, 0)
        if now > allowed:
            grown[module] = (allowed, now)
        elif now < allowed:
            shrunk[module] = (allowed, now)
    return Comparison(grown=grown, shrunk=shrunk)


def load_baseline(path: Path) -> dict[str, int]:
    """The committed counts; a missing or malformed file is a RatchetError naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RatchetError(f"{path}: no baseline (write one with --update)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RatchetError(f"{path}: not a readable JSON file ({error})") from None
    if not isinstance(data, dict):
        raise RatchetError(f"{path}: expected an object of module path -> error count")
    for module, count in data.items():
        if type(count) is not int or count < 0:
            raise RatchetError(
                f"{path}: {module!r} has count {count!r}; expected a whole number >= 0"
            )
    return data


def write_baseline(path: Path, counts: Mapping[str, int]) -> None:
    text = json.dumps(dict(sorted(counts.items())), indent=2) + "\n"
    write_text(path, text)


def pinned_mypy_version(lock: Path) -> str:
    match = re.search(r"^mypy==(\S+)", lock.read_text(encoding="utf-8"), flags=re.M)
    if match is None:
        raise RatchetError(f"{lock} pins no mypy")
    return match.group(1)


def check_mypy_version(installed: str | None, pinned: str) -> None:
    if installed is None:
        raise RatchetError(
            f"mypy is not installed here; install the lock's (mypy=={pinned}: `nox -s dev`), "
            "or run `nox -s lint`"
        )
    if installed != pinned:
        raise RatchetError(
            f"mypy {installed} runs here, the lock pins {pinned}: the baseline holds that "
            "version's counts; install the lock's (`nox -s dev`) or run `nox -s lint`"
        )


def run_mypy() -> str:
    """mypy over the package with pyproject.toml's settings, as JSON lines."""
    try:
        installed: str | None = metadata.version("mypy")
    except metadata.PackageNotFoundError:
        installed = None
    check_mypy_version(installed, pinned_mypy_version(LOCK))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--output", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode not in (0, 1):  # 1: type errors found; anything else: mypy failed
        raise RatchetError(f"mypy failed (exit {result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _report(comparison: Comparison, errors: Sequence[MypyError], baseline: Path) -> None:
    for module, (allowed, now) in comparison.grown.items():
        print(f"{module}: {now} mypy errors, the baseline allows {allowed} (+{now - allowed}):")
        for error in errors:
            if error.path == module:
                print(f"  {error}")
    if comparison.shrunk:
        print(f"fewer mypy errors than {baseline.name} allows; shrink it with --update:")
        for module, (allowed, now) in comparison.shrunk.items():
            print(f"  {module}: {allowed} -> {now}")


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python scripts/mypy_ratchet.py",
        description="mypy over the package, each module held to its count in the baseline.",
        epilog="Exit status: 0 within the baseline (or baseline written), 1 a module has more "
        "errors than its count, 2 bad input or environment (unreadable baseline, another mypy "
        "version than the lock's, mypy failing).",
    )
    parser.add_argument(
        "--baseline", type=Path, default=BASELINE, help="the counts (default: %(default)s)"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="write the counts as they are to the baseline; refused while a module has grown",
    )
    parser.add_argument(
        "--allow-growth",
        action="store_true",
        help="with --update: write grown counts too (after a merge that moved modules)",
    )
    arguments = parser.parse_args(argv)
    if arguments.allow_growth and not arguments.update:
        parser.error("--allow-growth only goes with --update")
    return arguments


def main(argv: Sequence[str] | None = None, mypy: Callable[[], str] = run_mypy) -> int:
    arguments = _arguments(argv)
    first_baseline = arguments.update and not arguments.baseline.exists()
    try:
        baseline = {} if first_baseline else load_baseline(arguments.baseline)
        errors = outside_triton_kernels(parse_mypy_json(mypy()), REPO)
    except RatchetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    counts = count_by_module(errors)
    comparison = compare(baseline, counts)
    total = f"{sum(counts.values())} mypy errors in {len(counts)} modules"
    if arguments.update:
        if comparison.grown and not (first_baseline or arguments.allow_growth):
            _report(Comparison(grown=comparison.grown, shrunk={}), errors, arguments.baseline)
            print(f"refused: the baseline never grows; fix the errors above ({total})")
            return 1
        write_baseline(arguments.baseline, counts)
        print(f"{arguments.baseline.name} written: {total}")
        return 0
    _report(comparison, errors, arguments.baseline)
    if not comparison.passed:
        print(f"failed: {len(comparison.grown)} modules over their baseline ({total})")
        return 1
    print(f"mypy within the baseline: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
