"""Which steps a change runs, by vLLM's current rules, with the reason for every decision.

Matching is a path-component prefix (``vllm/attention`` matches ``vllm/attention/x.py`` but
not ``vllm/attention_utils.py``); ``!entry`` excludes; a step's own YAML file is one of its
dependencies; ``run_all_patterns`` are regular expressions anchored at the start.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ci.changes import ChangeSet
from ci.config import RunConfig, Step, TestAreas, suggest
from ci.errors import CIInputError

DOCS_FILES = ("mkdocs.yaml",)


def matches_dependency(entry: str, path: str) -> bool:
    """vLLM's ``_matches_source_dependency``: the path itself or anything below it."""
    normalized = entry.rstrip("/")
    if not normalized:
        return False
    return path == normalized or path.startswith(f"{normalized}/")


@functools.lru_cache(maxsize=4096)
def split_dependencies(entries: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(include entries, exclude entries without their '!'); cached, steps reuse their lists."""
    includes = tuple(entry for entry in entries if not entry.startswith("!"))
    excludes = tuple(entry[1:] for entry in entries if entry.startswith("!"))
    return includes, excludes


def matching_entry(dependencies: tuple[str, ...], path: str) -> str | None:
    """The include entry that selects ``path``, or None (also when an exclusion wins)."""
    includes, excludes = split_dependencies(tuple(dependencies))
    if any(matches_dependency(entry, path) for entry in excludes):
        return None
    return next((entry for entry in includes if matches_dependency(entry, path)), None)


def is_docs_only(files: Sequence[str]) -> bool:
    """vLLM skips the pipeline when every changed file is documentation (never for no files)."""
    return bool(files) and all(
        path.startswith("docs/") or path.endswith(".md") or path in DOCS_FILES for path in files
    )


@dataclass(frozen=True)
class Knobs:
    """Overrides from the environment (RUN_ALL, NIGHTLY, ONLY_STEP_KEYS, DOCS_ONLY_DISABLE)."""

    run_all: bool = False
    nightly: bool = False
    only_step_keys: tuple[str, ...] | None = None
    docs_only_disable: bool = False


@dataclass(frozen=True)
class StepDecision:
    key: str
    label: str
    selected: bool
    why: tuple[str, ...]


@dataclass(frozen=True)
class Selection:
    base: str
    head: str
    run_all: bool
    reason: str
    changed_files: tuple[str, ...]
    decisions: tuple[StepDecision, ...]

    def to_json(self) -> dict:
        return {
            "base": self.base,
            "head": self.head,
            "run_all": self.run_all,
            "reason": self.reason,
            "changed_files": list(self.changed_files),
            "steps": [
                {"key": d.key, "label": d.label, "selected": d.selected, "why": list(d.why)}
                for d in self.decisions
            ],
        }

    def selected_keys(self) -> set[str]:
        return {decision.key for decision in self.decisions if decision.selected}


def _run_all_trigger(config: RunConfig, files: Sequence[str]) -> str | None:
    for path in files:
        for pattern in config.run_all_patterns:
            if pattern.match(path) and not any(
                exclude.match(path) for exclude in config.run_all_exclude_patterns
            ):
                return f"{path!r} matches run_all pattern {pattern.pattern!r}"
    return None


def _dependency_closure(areas: TestAreas, roots: Iterable[str]) -> dict[str, str]:
    """Each root and every step it transitively depends on -> why it is included."""
    steps = areas.by_key()
    included: dict[str, str] = {}
    pending = [(key, "") for key in roots]
    while pending:
        key, needed_by = pending.pop()
        if key in included or key not in steps:
            continue
        included[key] = needed_by
        pending.extend((dependency, key) for dependency in steps[key].depends_on)
    return included


def _decide(
    step: Step,
    config: RunConfig,
    changes: ChangeSet,
    knobs: Knobs,
    run_all_trigger: str | None,
    docs_only: bool,
) -> tuple[bool, str]:
    """One step's decision by vLLM's order of checks."""
    if knobs.nightly:
        return True, "NIGHTLY=1 runs every step"
    if step.optional:
        return False, "optional step: runs only with NIGHTLY=1"
    if knobs.run_all:
        return True, "RUN_ALL=1 runs every step"
    if not changes.known:
        return True, f"fail-safe: {changes.unavailable_reason}"
    if run_all_trigger:
        return True, run_all_trigger
    if docs_only:
        return False, "docs-only change"
    for path in changes.files:
        entry = matching_entry(step.dependencies, path)
        if entry is not None:
            rule = "its own YAML file" if entry == step.file else f"dependency {entry!r}"
            return True, f"{path!r} matches {rule}"
    count = len(step.dependencies)
    return False, f"no changed file matches its {count} dependency entries"


def select_steps(
    areas: TestAreas, config: RunConfig, changes: ChangeSet, knobs: Knobs = Knobs()
) -> Selection:
    """Decide every step; a selected step pulls in the steps it depends on."""
    files = changes.files or ()
    steps = areas.by_key()
    if knobs.only_step_keys is not None:
        unknown = [key for key in knobs.only_step_keys if key not in steps]
        if unknown:
            hints = "".join(suggest(key, sorted(steps)) for key in unknown[:1])
            raise CIInputError(f"ONLY_STEP_KEYS names unknown steps {unknown}{hints}")
        chosen = _dependency_closure(areas, knobs.only_step_keys)
        decisions = tuple(
            StepDecision(
                step.key,
                step.label,
                step.key in chosen,
                (
                    f"needed by {chosen[step.key]!r} (depends_on)"
                    if chosen.get(step.key)
                    else "listed in ONLY_STEP_KEYS",
                )
                if step.key in chosen
                else ("not in ONLY_STEP_KEYS",),
            )
            for step in areas.steps
        )
        return Selection(
            changes.base,
            changes.head,
            False,
            f"ONLY_STEP_KEYS={list(knobs.only_step_keys)}",
            tuple(files),
            decisions,
        )

    trigger = _run_all_trigger(config, files) if changes.known else None
    docs_only = changes.known and not knobs.docs_only_disable and is_docs_only(files)
    first = {
        step.key: _decide(step, config, changes, knobs, trigger, docs_only) for step in areas.steps
    }
    pulled = _dependency_closure(areas, [key for key, (chosen, _) in first.items() if chosen])
    decisions = []
    for step in areas.steps:
        chosen, why = first[step.key]
        if not chosen and step.key in pulled:
            chosen, why = True, f"needed by {pulled[step.key]!r} (depends_on)"
        decisions.append(StepDecision(step.key, step.label, chosen, (why,)))

    if knobs.nightly:
        run_all, reason = True, "NIGHTLY=1"
    elif knobs.run_all:
        run_all, reason = True, "RUN_ALL=1"
    elif not changes.known:
        run_all, reason = True, f"fail-safe, selecting everything: {changes.unavailable_reason}"
    elif trigger:
        run_all, reason = True, trigger
    elif docs_only:
        run_all, reason = False, "docs-only change: every step skipped"
    else:
        run_all, reason = False, f"{len(files)} changed files matched against step dependencies"
    return Selection(changes.base, changes.head, run_all, reason, tuple(files), tuple(decisions))
