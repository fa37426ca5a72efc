"""check-deps baselines: today's findings recorded, so later runs fail only on new ones.

As with type checkers and linters on large codebases, a repository adopts check-deps by
recording what it finds today (``--write-baseline``) and failing only on what is new
(``--baseline``). Gaps are recorded as the entries that would fix them, per step: a gap is
known when its path lies under one of its step's recorded entries, so the file stays small
on vLLM-sized trees and a new file in an already-missing directory is not news. Problems,
undeclared paths and unrun tests are recorded verbatim.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from attngroup.ci.atomic_write import write_atomically
from attngroup.ci.deps.checker import DependencyReport, StepReport
from attngroup.ci.errors import CIInputError

FORMAT = "ci-check-deps-baseline/1"


@dataclass(frozen=True)
class StepBaseline:
    entries: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    missing_declared: tuple[str, ...] = ()

    @functools.cached_property
    def _entry_set(self) -> frozenset[str]:
        return frozenset(entry.rstrip("/") for entry in self.entries)

    @functools.cached_property
    def _directories(self) -> dict[str, bool]:
        return {}  # directory -> whether an entry covers it (memo across one step's gaps)

    def _covers_directory(self, directory: str) -> bool:
        if directory not in self._directories:
            parent = directory.rpartition("/")[0]
            self._directories[directory] = directory in self._entry_set or (
                bool(parent) and self._covers_directory(parent)
            )
        return self._directories[directory]

    def covers(self, path: str) -> bool:
        """Whether ``path`` is a recorded entry or lies below one."""
        parent = path.rpartition("/")[0]
        return path in self._entry_set or (bool(parent) and self._covers_directory(parent))


@dataclass(frozen=True)
class Baseline:
    steps: dict[str, StepBaseline]
    orphan_tests: frozenset[str] = frozenset()

    def covers_gap(self, key: str, path: str) -> bool:
        """Whether ``path`` lies under one of step ``key``'s recorded entries."""
        step = self.steps.get(key)
        return step is not None and step.covers(path)


def baseline_of(report: DependencyReport) -> dict:
    """The JSON document that ``--write-baseline`` writes for ``report``."""
    steps = {
        step.key: {
            "entries": sorted({gap.suggestion for gap in step.gaps}),
            "problems": list(step.problems),
            "missing_declared": list(step.missing_declared),
        }
        for step in report.steps
        if not step.ok
    }
    return {"format": FORMAT, "steps": steps, "orphan_tests": list(report.orphan_tests)}


def write_baseline(path: Path, report: DependencyReport) -> None:
    try:
        write_atomically(path, json.dumps(baseline_of(report), indent=1, sort_keys=True) + "\n")
    except OSError as error:
        raise CIInputError(f"cannot write baseline {path}: {error.strerror}") from None


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{where} must be a list of strings")
    return tuple(value)


def load_baseline(path: Path) -> Baseline:
    """Read a baseline; an unreadable or malformed file is bad input naming the file."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ValueError(f"not a check-deps baseline (expected format {FORMAT!r})")
        raw_steps = document.get("steps")
        if not isinstance(raw_steps, dict):
            raise ValueError("'steps' must be a mapping of step key -> findings")
        steps = {}
        for key, raw in raw_steps.items():
            if not isinstance(raw, dict):
                raise ValueError(f"steps.{key} must be a mapping")
            steps[key] = StepBaseline(
                *(
                    _strings(raw.get(name, []), f"steps.{key}.{name}")
                    for name in ("entries", "problems", "missing_declared")
                )
            )
        orphans = _strings(document.get("orphan_tests", []), "orphan_tests")
    except OSError as error:
        raise CIInputError(f"cannot read baseline {path}: {error.strerror}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise CIInputError(f"baseline {path} is corrupt: {error}") from None
    return Baseline(steps, frozenset(orphans))


def _new_in_step(step: StepReport, baseline: Baseline) -> tuple[StepReport, int]:
    known = baseline.steps.get(step.key, StepBaseline())
    gaps = tuple(gap for gap in step.gaps if not baseline.covers_gap(step.key, gap.path))
    problems = tuple(item for item in step.problems if item not in known.problems)
    missing = tuple(item for item in step.missing_declared if item not in known.missing_declared)
    dropped = (
        len(step.gaps)
        - len(gaps)
        + len(step.problems)
        - len(problems)
        + len(step.missing_declared)
        - len(missing)
    )
    new = dataclasses.replace(step, gaps=gaps, problems=problems, missing_declared=missing)
    return new, dropped


def only_new(report: DependencyReport, baseline: Baseline) -> DependencyReport:
    """``report`` without the findings ``baseline`` records (counted in ``known``)."""
    steps, known = [], 0
    for step in report.steps:
        new, dropped = _new_in_step(step, baseline)
        steps.append(new)
        known += dropped
    orphans = tuple(item for item in report.orphan_tests if item not in baseline.orphan_tests)
    known += len(report.orphan_tests) - len(orphans)
    return dataclasses.replace(report, steps=tuple(steps), orphan_tests=orphans, known=known)
