"""Mirror steps: a ``mirror: {amd: {...}}`` block runs the same step on other hardware.

Built as vLLM's generator builds them (ci-infra ``buildkite_step.py``,
``convert_group_step_to_buildkite_step`` and ``_get_amd_mirror_effective_step``; ``amd.py``,
``build_amd_step_options`` and ``normalize_amd_depends_on``): the key is ``amd-<parent key>``,
the label is the mirror's own or ``AMD: <label> (<device>)``, the dependencies are the union of
the mirror's list and the parent's (a change that runs the NVIDIA step also runs its mirror),
``depends_on`` is the mirror's own with ``image-build`` read as ``image-build-amd`` and
``image-build-amd`` always first, and ``dind`` defaults to true. Other fields the mirror does
not override are inherited. Mirrors are added (by ``attngroup.ci.areas.load``) for the targets the run
configuration lists under ``mirrors`` (all of them unless it says otherwise, as in vLLM).
"""

from __future__ import annotations

import dataclasses

from attngroup.ci.areas.config import PASSTHROUGH_KEYS, Step

AMD_IMAGE_BUILD = "image-build-amd"


def mirror_key(key: str, target: str) -> str:
    return f"{target}-{key}"


def _amd_depends_on(declared: list[str]) -> tuple[str, ...]:
    """vLLM's ``normalize_amd_depends_on``: the AMD image build, then the declared steps."""
    renamed = [AMD_IMAGE_BUILD if key == "image-build" else key for key in declared]
    return tuple(dict.fromkeys([AMD_IMAGE_BUILD, *renamed]))


def mirror_step(step: Step, target: str) -> Step:
    """The ``target`` mirror of ``step`` (key ``<target>-<key>``)."""
    overrides = step.mirror[target]
    passthrough = {**step.passthrough}
    passthrough.update({name: overrides[name] for name in PASSTHROUGH_KEYS if name in overrides})
    own_dependencies = overrides.get("source_file_dependencies", ())
    device = overrides.get("device", step.device)
    return dataclasses.replace(
        step,
        key=mirror_key(step.key, target),
        label=overrides.get("label", f"{target.upper()}: {step.label} ({device or ''})"),
        commands=tuple(overrides.get("commands", step.commands)),
        source_file_dependencies=tuple(
            dict.fromkeys((*own_dependencies, *step.source_file_dependencies))
        ),
        depends_on=_amd_depends_on(overrides.get("depends_on") or []),
        device=device,
        num_devices=overrides.get("num_devices", step.num_devices),
        num_nodes=overrides.get("num_nodes", step.num_nodes),
        agent_tags=dict(overrides.get("agent_tags") or {}),
        agents={},
        working_dir=overrides.get("working_dir", step.working_dir),
        optional=overrides.get("optional", step.optional),
        no_gpu=overrides.get("no_gpu", step.no_gpu),
        dind=overrides.get("dind", True),
        passthrough=passthrough,
        mirror={},
        mirror_target=target,
    )
