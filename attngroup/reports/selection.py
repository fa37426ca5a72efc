"""The CI selection context: which steps ran and why, from ``python -m attngroup.ci select --json``.

Read as JSON (not imported from ``ci``) so the two packages stay independent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attngroup.reports.record import Fields, RecordError, read_json_file


@dataclass(frozen=True)
class StepSelection:
    key: str
    label: str
    selected: bool
    why: tuple[str, ...]


@dataclass(frozen=True)
class SelectionContext:
    base: str | None
    head: str | None
    run_all: bool
    reason: str
    changed_files: tuple[str, ...]
    steps: tuple[StepSelection, ...]

    def step(self, key: str) -> StepSelection | None:
        return next((step for step in self.steps if step.key == key), None)


def load_selection(path: str | Path) -> SelectionContext:
    return selection_from_json(read_json_file(path, "CI selection"), source=str(path))


def selection_from_json(data: Any, source: str = "<memory>") -> SelectionContext:
    top = Fields(data, f"CI selection {source!r}")
    if "steps" not in top.data:
        raise RecordError(
            f"{top.where}: required field 'steps' is missing "
            "(expected the output of `python -m attngroup.ci select --json`)"
        )
    return SelectionContext(
        base=top.get("base", str, optional=True),
        head=top.get("head", str, optional=True),
        run_all=top.get("run_all", bool),
        reason=top.get("reason", str, optional=True) or "",
        changed_files=tuple(top.get_list("changed_files", str)),
        steps=tuple(
            StepSelection(
                key=step.get("key", str),
                label=step.get("label", str, optional=True) or step.get("key", str),
                selected=step.get("selected", bool),
                why=tuple(step.get_list("why", str)),
            )
            for step in top.items("steps")
        ),
    )
