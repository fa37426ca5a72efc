"""Buildkite pipeline emission from a selection, ready for ``buildkite-agent pipeline upload``.

Only Buildkite keys are emitted (a leaked ``source_file_dependencies`` makes Buildkite reject
the upload), every step is validated against the official schema, and unselected steps either
sit behind a block step (one click runs them) or are left out (all but those a selected step
depends on).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attngroup.ci.areas.config import RunConfig, Step, TestAreas
from attngroup.ci.errors import CIInputError
from attngroup.ci.selection.buildkite_schema import load_schema, validate_pipeline
from attngroup.ci.selection.select_steps import Selection, dependency_closure

MAX_STEPS_PER_UPLOAD = 500


def agents_for(step: Step, config: RunConfig) -> dict[str, str]:
    """Agent tags for a step: ``device_agents[device:num_devices]``, then ``[device]``.

    ``agent_tags`` are added to those, and a step's own Buildkite ``agents`` win over both.

    With no ``device_agents`` configured a device name is taken as the queue name. A device the
    mapping does not know is an error: it would otherwise wait forever for a missing queue.
    """
    device = step.device or ("cpu" if step.no_gpu else None)
    if device is None:
        tags = dict(config.default_agents)
    elif not config.device_agents:
        tags = {**config.default_agents, "queue": device}
    else:
        sized_tags = (
            config.device_agents.get(f"{device}:{step.num_devices}") if step.num_devices else None
        )
        mapped = sized_tags or config.device_agents.get(device)
        if mapped is None:
            known = ", ".join(sorted(config.device_agents))
            raise CIInputError(
                f"step {step.key!r} ({step.file}:{step.line}): device {device!r} has no entry in "
                f"device_agents of {config.path} (known: {known})"
            )
        tags = dict(mapped)
    return {**tags, **step.agent_tags, **step.agents}


def _commands(step: Step, config: RunConfig) -> list[str]:
    working_dir = step.working_dir or config.default_working_dir
    prefix = [f"cd {working_dir}"] if working_dir else []
    return [*prefix, *step.commands]


def command_step(step: Step, config: RunConfig, extra_depends_on: tuple[str, ...] = ()) -> dict:
    """The Buildkite command step for ``step`` (Buildkite keys only)."""
    emitted: dict[str, Any] = {"label": step.label, "key": step.key}
    emitted["commands"] = _commands(step, config)
    agents = agents_for(step, config)
    if agents:
        emitted["agents"] = agents
    depends_on = [*extra_depends_on, *step.depends_on]
    if depends_on:
        emitted["depends_on"] = depends_on
    for name, value in step.passthrough.items():
        if name == "env":
            value = {variable: str(item) for variable, item in value.items()}
        emitted[name] = value
    allowed = set(load_schema()["definitions"]["commandStep"]["properties"])
    leaked = sorted(set(emitted) - allowed)
    if leaked:
        raise CIInputError(f"step {step.key!r}: internal keys would leak into Buildkite: {leaked}")
    return emitted


def _block_step(step: Step, why: str) -> dict:
    block: dict[str, Any] = {
        "block": f"Run {step.label}",
        "key": f"block-{step.key}",
        "prompt": f"Not selected: {why}",
    }
    if step.depends_on:
        block["depends_on"] = list(step.depends_on)
    return block


def build_pipeline(
    areas: TestAreas, selection: Selection, config: RunConfig, unselected: str = "block"
) -> dict[str, Any]:
    """The pipeline document: one Buildkite group per test-area group, in file order."""
    if unselected not in ("block", "omit"):
        raise CIInputError(f"unselected must be 'block' or 'omit', got {unselected!r}")
    decisions = {decision.key: decision for decision in selection.decisions}
    # Unselected steps a selected one depends on stay behind their block step even with
    # "omit": leaving them out would leave a depends_on that names no step.
    needed = dependency_closure(areas, selection.selected_keys())
    groups: dict[str, list[dict]] = {}
    for step in areas.steps:
        decision = decisions[step.key]
        emitted = groups.setdefault(step.group or "Ungrouped", [])
        if decision.selected:
            emitted.append(command_step(step, config))
        elif unselected == "block" or step.key in needed:
            emitted.append(_block_step(step, "; ".join(decision.why)))
            emitted.append(command_step(step, config, (f"block-{step.key}",)))
    steps = [{"group": name, "steps": children} for name, children in groups.items() if children]
    return {"steps": steps}


def count_steps(pipeline: Mapping[str, Any]) -> int:
    """Steps as Buildkite counts them against the upload limit (a group and its children)."""
    return sum(
        1 + len(step.get("steps", [])) if isinstance(step, Mapping) else 1
        for step in pipeline["steps"]
    )


def split_uploads(
    pipeline: Mapping[str, Any], limit: int = MAX_STEPS_PER_UPLOAD
) -> list[dict[str, Any]]:
    """Pipelines of at most ``limit`` steps each, never splitting a group."""
    uploads: list[dict[str, Any]] = []
    current: list[Any] = []
    size = 0
    for step in pipeline["steps"]:
        step_size = count_steps({"steps": [step]})
        if step_size > limit:
            name = step.get("group") if isinstance(step, Mapping) else step
            raise CIInputError(f"group {name!r} has {step_size} steps; one upload takes {limit}")
        if current and size + step_size > limit:
            uploads.append({**pipeline, "steps": current})
            current, size = [], 0
        current.append(step)
        size += step_size
    uploads.append({**pipeline, "steps": current})
    return uploads


def checked_uploads(pipeline: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Schema-valid uploads of at most 500 steps each, or an error listing every violation."""
    errors = validate_pipeline(pipeline)
    if errors:
        raise CIInputError("pipeline fails Buildkite's schema:\n  " + "\n  ".join(errors))
    return split_uploads(pipeline)
