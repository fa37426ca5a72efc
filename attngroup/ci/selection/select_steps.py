"""Which steps a change runs, by vLLM's current rules, with the reason for every decision.

The rules and their order follow vLLM's pipeline generator (vllm-project/ci-infra main at commit
3e4cfe4, ``buildkite/pipeline_generator/``: ``buildkite_step.py`` ``_step_should_run``,
``_source_file_dependencies_match`` and ``convert_group_step_to_buildkite_step``; ``amd.py``
``_amd_mirror_should_run``; ``global_config.py`` ``_should_run_all``; ``pipeline_generator.py``
``is_docs_only_change`` and ``select_steps_and_dependencies``):

1. a docs-only change skips every step (unless DOCS_ONLY_DISABLE, RUN_ALL or a run-all file);
2. ``image-build*`` steps and the AMD base steps always run;
3. NIGHTLY=1 runs every step; otherwise an ``optional`` step does not run;
4. an AMD mirror runs whenever the ROCm base Dockerfile changes (optional mirrors too);
5. a native (not ``dind``) AMD GPU step runs when the AMD test wrapper changes;
6. RUN_ALL=1 or a ``run_all_patterns`` match (``re.match``, minus ``run_all_exclude_patterns``)
   runs every step (``amd_run_all_patterns`` is loaded and linted, but the generator does not
   read it, so neither does selection);
7. otherwise a changed path must equal or lie below a dependency entry (path components, no
   globs; ``!entry`` excludes). A step's own YAML file is a dependency only when its file's
   group ``depends_on`` is non-empty.

A step's ``depends_on`` are pulled in only for ``ONLY_STEP_KEYS`` (``select_steps_and_dependencies``);
on a change, an unselected dependency is emitted behind its block step like any other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from attngroup.ci.areas.config import RunConfig, Step, TestAreas, suggest
from attngroup.ci.areas.entries import matching_entry
from attngroup.ci.errors import CIInputError
from attngroup.ci.selection.changes import ChangeSet

DOCS_FILES = ("mkdocs.yml", "mkdocs.yaml")
# vLLM's always-run steps (buildkite_step.py; amd.py AMD_ALWAYS_RUN_STEP_KEYS).
ALWAYS_RUN_PREFIX = "image-build"
ALWAYS_RUN_KEYS = frozenset({"ensure-ci-base-amd", "refresh-rocm-base-amd"})
# amd.py: AMD_ROCM_BASE_DOCKERFILE and AMD_NATIVE_RUNTIME_SOURCE_DEPENDENCIES.
ROCM_BASE_DOCKERFILE = "docker/Dockerfile.rocm_base"
AMD_NATIVE_RUNTIME_DEPENDENCIES = (".buildkite/scripts/hardware_ci/run-amd-test.sh",)
# amd.py AMD_DEVICE_CONFIGS: mi250/mi300/mi325/mi355 x 1/2/4/8. vLLM 0.34.0 also uses mi355_dpx,
# which the generator does not know as an AMD GPU: the native-runtime rule (5) skips it.
_AMD_GPU_DEVICE = re.compile(r"mi(?:250|300|325|355)_[1248]")


def is_amd_gpu_device(device: str | None) -> bool:
    return bool(device and _AMD_GPU_DEVICE.fullmatch(device))


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


def _run_all_trigger(
    patterns: Sequence[re.Pattern[str]], config: RunConfig, files: Sequence[str], name: str
) -> str | None:
    """vLLM's ``_should_run_all``: a file matching a pattern and no exclude pattern."""
    for path in files:
        for pattern in patterns:
            if pattern.match(path) and not any(
                exclude.match(path) for exclude in config.run_all_exclude_patterns
            ):
                return f"{path!r} matches {name} pattern {pattern.pattern!r}"
    return None


@dataclass(frozen=True)
class _ChangeFacts:
    """What the changed files mean for every step, computed once per selection."""

    run_all: str | None  # why every step runs (knob, fail-safe, run_all_patterns), or None
    docs_only: bool
    rocm_base_changed: bool
    amd_runtime_changed: bool


def dependency_closure(areas: TestAreas, roots: Iterable[str]) -> dict[str, str]:
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


def _decide(step: Step, changes: ChangeSet, knobs: Knobs, facts: _ChangeFacts) -> tuple[bool, str]:
    """One step's decision, in vLLM's order of checks."""
    if facts.docs_only:
        return False, "docs-only change"
    if step.mirror_target is None and (
        step.key.startswith(ALWAYS_RUN_PREFIX) or step.key in ALWAYS_RUN_KEYS
    ):
        return True, "always runs (image builds and AMD base steps run on every build)"
    if knobs.nightly:
        return True, "NIGHTLY=1 runs every step"
    if step.mirror_target == "amd" and facts.rocm_base_changed:
        return True, f"{ROCM_BASE_DOCKERFILE!r} changed: every AMD mirror runs"
    if step.optional:
        return False, "optional step: runs only with NIGHTLY=1"
    if is_amd_gpu_device(step.device) and not step.dind and facts.amd_runtime_changed:
        return True, "the native AMD test wrapper changed"
    if facts.run_all:
        return True, facts.run_all
    for path in changes.files or ():
        entry = matching_entry(step.dependencies, path)
        if entry is not None:
            own = entry == step.file and entry not in step.source_file_dependencies
            rule = "its own YAML file" if own else f"dependency {entry!r}"
            return True, f"{path!r} matches {rule}"
    count = len(step.dependencies)
    return False, f"no changed file matches its {count} dependency entries"


def _change_facts(config: RunConfig, changes: ChangeSet, knobs: Knobs) -> _ChangeFacts:
    files = changes.files or ()
    run_all: str | None
    if knobs.run_all:
        run_all = "RUN_ALL=1 runs every step"
    elif not changes.known:
        run_all = f"fail-safe: {changes.unavailable_reason}"
    else:
        run_all = _run_all_trigger(config.run_all_patterns, config, files, "run_all")
    return _ChangeFacts(
        run_all=run_all,
        docs_only=not (knobs.docs_only_disable or run_all) and is_docs_only(files),
        rocm_base_changed=ROCM_BASE_DOCKERFILE in files,
        amd_runtime_changed=any(path in files for path in AMD_NATIVE_RUNTIME_DEPENDENCIES),
    )


def _select_only_step_keys(
    areas: TestAreas, changes: ChangeSet, only_step_keys: tuple[str, ...]
) -> Selection:
    """``ONLY_STEP_KEYS``: those steps and every step they depend on, whatever changed."""
    steps = areas.by_key()
    unknown = [key for key in only_step_keys if key not in steps]
    if unknown:
        hints = "".join(suggest(key, sorted(steps)) for key in unknown[:1])
        raise CIInputError(f"ONLY_STEP_KEYS names unknown steps {unknown}{hints}")
    chosen = dependency_closure(areas, only_step_keys)
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
        f"ONLY_STEP_KEYS={list(only_step_keys)}",
        tuple(changes.files or ()),
        decisions,
    )


def select_steps(
    areas: TestAreas, config: RunConfig, changes: ChangeSet, knobs: Knobs = Knobs()
) -> Selection:
    """Decide every step (``ONLY_STEP_KEYS`` also takes the steps they depend on)."""
    if knobs.only_step_keys is not None:
        return _select_only_step_keys(areas, changes, knobs.only_step_keys)
    files = changes.files or ()
    facts = _change_facts(config, changes, knobs)
    decisions = []
    for step in areas.steps:
        chosen, why = _decide(step, changes, knobs, facts)
        decisions.append(StepDecision(step.key, step.label, chosen, (why,)))

    if facts.docs_only:
        run_all, reason = False, "docs-only change: every step skipped"
    elif knobs.nightly:
        run_all, reason = True, "NIGHTLY=1"
    elif facts.run_all:
        run_all, reason = True, facts.run_all.removesuffix(" runs every step")
        if not changes.known:
            reason = f"fail-safe, selecting everything: {changes.unavailable_reason}"
    else:
        run_all, reason = False, f"{len(files)} changed files matched against step dependencies"
    return Selection(changes.base, changes.head, run_all, reason, tuple(files), tuple(decisions))
