"""The bug zoo's runner: plant each bug in a scratch copy and check the suite catches it.

An entry (``attngroup/bugzoo/entries.yaml``) names a unified diff under ``attngroup/bugzoo/patches/``,
the bug it reproduces and its source, and the tests that must catch it. The runner
copies the repository's files (tracked and untracked-but-not-ignored, as git lists
them) into a scratch directory, runs every entry's tests on the unpatched copy
(they must pass), then for each entry applies its patch, runs its tests (they
must fail), and reverts the patch. An entry is *caught* when some named test fails
(pytest exits 1, or 2 where xdist stops at the first failure; failures are counted
from the JUnit XML) within the time budget; any other outcome (tests passed, a
collection or usage error, a patch that does not apply, a timeout) fails the zoo.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from xml.etree import ElementTree

import yaml

from attngroup import atomic_write

ENTRY_FIELDS = ("id", "bug", "source", "affected", "kind", "patch", "tests")
KINDS = ("historical", "mutation")
STOPPED_ON_FAILURE = (1, 2)  # tests failed; interrupted by --maxfail under xdist


class ZooError(ValueError):
    """The zoo's own input is wrong (entries file, patch); the message says where."""


@dataclass(frozen=True)
class Entry:
    id: str
    bug: str
    source: str  # e.g. "vLLM PR #43543"
    affected: str  # the affected release(s)
    kind: str  # historical | mutation
    patch: str  # path under the zoo folder
    tests: tuple[str, ...]  # pytest node ids or paths that must catch it


@dataclass(frozen=True)
class Outcome:
    id: str
    caught: bool
    seconds: float
    verdict: str  # "caught", or why not
    output_tail: str = ""


def load_entries(path: Path) -> list[Entry]:
    """The entries of ``path``; raises ``ZooError`` naming the file, entry and field."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ZooError(f"{path}: cannot read the entries: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
        raise ZooError(f"{path}: expected a mapping with an 'entries' list")
    entries, seen = [], set()
    for index, raw in enumerate(document["entries"]):
        where = f"{path}: entry {index + 1}"
        if not isinstance(raw, dict):
            raise ZooError(f"{where}: expected a mapping")
        missing = [name for name in ENTRY_FIELDS if not raw.get(name)]
        unknown = sorted(set(raw) - set(ENTRY_FIELDS))
        if missing or unknown:
            raise ZooError(f"{where} ({raw.get('id')}): missing {missing}, unknown {unknown}")
        if raw["kind"] not in KINDS:
            raise ZooError(f"{where} ({raw['id']}): kind must be one of {KINDS}")
        if raw["id"] in seen:
            raise ZooError(f"{where}: duplicate id {raw['id']!r}")
        seen.add(raw["id"])
        tests = raw["tests"]
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise ZooError(f"{where} ({raw['id']}): tests must be a list of pytest node ids")
        if not (path.parent / raw["patch"]).is_file():
            raise ZooError(f"{where} ({raw['id']}): no patch file {raw['patch']}")
        entries.append(Entry(**{**raw, "tests": tuple(tests)}))
    return entries


def copy_tree(root: Path, destination: Path) -> None:
    """The files git would commit (tracked, and untracked ones it does not ignore)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = root / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def git_apply(tree: Path, patch: Path, *, reverse: bool = False, check: bool = False) -> str | None:
    """Apply (or revert; with ``check`` only try) ``patch`` in ``tree``; None when it applied,
    else git's message."""
    options = [*(["-R"] if reverse else []), *(["--check"] if check else [])]
    command = ["git", "apply", "--whitespace=nowarn", *options, str(patch)]
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    return None if result.returncode == 0 else result.stderr.strip()


def run_tests(
    tree: Path, tests: Sequence[str], workers: int, budget: float
) -> tuple[int | None, int, float, str]:
    """(pytest's exit status or None on timeout, failed tests, seconds, the output's tail).

    pytest stops at the first failure; under xdist that stop exits 2 (interrupted), so
    failures are counted from the JUnit XML rather than read off the exit status.
    """
    junit = tree / "out" / "bugzoo-junit.xml"
    junit.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--maxfail=1"]
    command += [f"--junitxml={junit}"]
    if workers:
        command += ["-n", str(workers)]
    started = time.perf_counter()
    try:
        result = subprocess.run(
            [*command, *tests],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=budget * 2,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, 0, time.perf_counter() - started, ""
    output = (result.stdout + result.stderr)[-3000:]
    return result.returncode, _failed_tests(junit), time.perf_counter() - started, output


def _skipped_tests(junit: Path) -> int:
    """Test cases skipped in a JUnit XML file (0 when there is none)."""
    if not junit.is_file():
        return 0
    root = ElementTree.parse(junit).getroot()
    return sum(1 for case in root.iter("testcase") if case.find("skipped") is not None)


def _failed_tests(junit: Path) -> int:
    """Test cases that failed or errored in a JUnit XML file (0 when there is none)."""
    if not junit.is_file():
        return 0
    root = ElementTree.parse(junit).getroot()
    return sum(
        1
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    )


def judge(entry: Entry, tree: Path, zoo: Path, workers: int, budget: float) -> Outcome:
    """Plant ``entry``'s bug, run its tests, revert."""
    patch = (zoo / entry.patch).resolve()
    problem = git_apply(tree, patch)
    if problem:
        return Outcome(entry.id, False, 0.0, f"the patch does not apply: {problem}")
    try:
        status, failed, seconds, output = run_tests(tree, entry.tests, workers, budget)
    finally:
        reverted = git_apply(tree, patch, reverse=True)
        if reverted:
            raise ZooError(f"{entry.id}: the patch does not revert cleanly: {reverted}")
    if status is None:
        verdict = f"timed out after {seconds:.0f} s"
    elif status == 0:
        verdict = "NOT CAUGHT: the named tests pass with the bug planted"
    elif status not in STOPPED_ON_FAILURE or not failed or "ERROR collecting" in output:
        verdict = f"pytest exited {status} without a failing test: the bug broke the run itself"
    elif seconds > budget:
        verdict = f"caught, but in {seconds:.0f} s, over the {budget:.0f} s budget"
    else:
        verdict = "caught"
    return Outcome(entry.id, verdict == "caught", round(seconds, 1), verdict, output)


def run_zoo(
    root: Path,
    zoo: Path,
    *,
    only: Sequence[str] = (),
    workers: int = 2,
    budget: float = 120.0,
    log=print,
) -> tuple[list[Outcome], Outcome]:
    """(every entry's outcome, the unpatched baseline's); nothing is modified under ``root``."""
    entries = load_entries(zoo / "entries.yaml")
    if only:
        unknown = sorted(set(only) - {entry.id for entry in entries})
        if unknown:
            raise ZooError(f"unknown entries {unknown}; known: {[e.id for e in entries]}")
        entries = [entry for entry in entries if entry.id in only]
    with tempfile.TemporaryDirectory(prefix="bugzoo-") as scratch:
        tree = Path(scratch)
        copy_tree(root, tree)
        tests = list(dict.fromkeys(test for entry in entries for test in entry.tests))
        log(f"baseline: {len(tests)} test selections on the unpatched tree")
        status, _, seconds, output = run_tests(tree, tests, workers, budget * len(entries))
        skipped = _skipped_tests(tree / "out" / "bugzoo-junit.xml")
        if status != 0:
            verdict = f"FAILS unpatched (pytest exit {status})"
        elif skipped:  # a test that does not run unpatched cannot catch the patch either
            verdict = f"FAILS unpatched: {skipped} named tests skipped"
        else:
            verdict = "passes"
        baseline = Outcome("baseline", verdict == "passes", round(seconds, 1), verdict, output)
        log(f"baseline: {baseline.verdict} in {baseline.seconds} s")
        outcomes = []
        for entry in entries:
            outcome = judge(entry, tree, zoo, workers, budget)
            log(f"{entry.id}: {outcome.verdict} ({outcome.seconds} s)")
            outcomes.append(outcome)
    return outcomes, baseline


def markdown_table(entries: Sequence[Entry]) -> str:
    """The docs' table (docs/bugzoo.md), from the entries alone: a count line, then bug,
    source, affected release and the tests that catch it. Timings go to the results file."""
    historical = sum(entry.kind == "historical" for entry in entries)
    lines = [
        f"{len(entries)} entries: {historical} historical, {len(entries) - historical} mutations.",
        "",
        "| bug | source | affected | caught by |",
        "| --- | --- | --- | --- |",
    ]
    for entry in entries:
        tests = "<br>".join(f"`{test}`" for test in entry.tests)
        lines.append(f"| `{entry.id}`: {entry.bug} | {entry.source} | {entry.affected} | {tests} |")
    return "\n".join(lines)


def write_results(path: Path, outcomes: Sequence[Outcome], baseline: Outcome, load: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "load_average": load,
        "baseline": asdict(baseline),
        "entries": [asdict(outcome) for outcome in outcomes],
    }
    atomic_write.write_text(path, json.dumps(document, indent=2) + "\n")
