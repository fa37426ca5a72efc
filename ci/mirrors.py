"""Mirror steps: a ``mirror: {amd: {...}}`` block runs the same step on other hardware.

As in vLLM's generator, the mirror inherits every field it does not override, and its
dependencies are the union of its own list and the parent's (a change that runs the NVIDIA
step also runs its AMD mirror). Mirrors are added (by ``ci.areas``) only for the targets the
run configuration lists under ``mirrors``.
"""

from __future__ import annotations

import dataclasses

from ci.config import PASSTHROUGH_KEYS, Step


def mirror_step(step: Step, target: str) -> Step:
    """The ``target`` mirror of ``step`` (key ``<key>-<target>``)."""
    overrides = step.mirror[target]
    passthrough = {**step.passthrough}
    passthrough.update({name: overrides[name] for name in PASSTHROUGH_KEYS if name in overrides})
    own_dependencies = overrides.get("source_file_dependencies", ())
    return dataclasses.replace(
        step,
        key=f"{step.key}-{target}",
        label=overrides.get("label", f"{step.label} ({target})"),
        commands=tuple(overrides.get("commands", step.commands)),
        source_file_dependencies=tuple(
            dict.fromkeys((*step.source_file_dependencies, *own_dependencies))
        ),
        depends_on=tuple(overrides.get("depends_on", step.depends_on)),
        device=overrides.get("device", step.device),
        num_devices=overrides.get("num_devices", step.num_devices),
        working_dir=overrides.get("working_dir", step.working_dir),
        optional=overrides.get("optional", step.optional),
        no_gpu=overrides.get("no_gpu", step.no_gpu),
        passthrough=passthrough,
        mirror={},
    )
