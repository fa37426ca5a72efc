"""Test-area YAML (vLLM's format) and the run configuration, loaded strictly.

vLLM's generator builds a pydantic model without ``extra="forbid"``, so a misspelt key such as
``num_gpus`` is silently dropped and the step runs on the wrong hardware or never. Here every
key is known, every value is type-checked, and each problem is reported with file and line.
Keys that only vLLM's retired Jinja pipeline read (``gpu``, ``num_gpus``, ...) load with a
warning by default so vLLM's own files load; ``legacy_keys: error`` makes them errors. A key
nobody knows yet (the next vLLM release's) follows ``unknown_keys``: ``warn`` (the default, so
an upstream addition never stops a load) names file, line and key and ignores it; ``error``
(this project's own configuration) refuses it. Wrong types are errors under either policy.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attngroup.ci.areas.yaml_source import item_lines, line_of, load_yaml, to_plain
from attngroup.ci.errors import CIInputError, CIInputErrors, Location

# A checker returns None for a good value, else what the value should have been.
Checker = Callable[[Any], str | None]


def _is_str(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def _is_bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _is_positive_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return None if ok else "an integer >= 1"


def _is_str_list(value: Any) -> str | None:
    ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
    return None if ok else "a list of strings"


def _is_optional_str_list(value: Any) -> str | None:
    return None if value is None else _is_str_list(value)


def _is_env(value: Any) -> str | None:
    scalar = (str, int, float, bool)
    ok = isinstance(value, Mapping) and all(
        isinstance(name, str) and isinstance(item, scalar) for name, item in value.items()
    )
    return None if ok else "a mapping of variable names to strings"


def _is_str_map(value: Any) -> str | None:
    ok = isinstance(value, Mapping) and all(
        isinstance(name, str) and isinstance(item, str) for name, item in value.items()
    )
    return None if ok else "a mapping of strings to strings"


def _is_mapping(value: Any) -> str | None:
    return None if isinstance(value, Mapping) else "a mapping"


def _is_soft_fail(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    ok = isinstance(value, list) and all(
        isinstance(item, Mapping) and set(item) == {"exit_status"} for item in value
    )
    return None if ok else "true, false or a list of {exit_status: N}"


def _is_any(value: Any) -> str | None:
    return None


# Step keys this harness understands, with their value checks (every key vLLM 0.34.0 uses).
STEP_FIELDS: dict[str, Checker] = {
    "label": _is_str,
    "key": _is_str,
    "commands": _is_str_list,
    "source_file_dependencies": _is_str_list,
    "depends_on": _is_optional_str_list,
    "device": _is_str,
    "num_devices": _is_positive_int,
    "num_nodes": _is_positive_int,
    "agent_tags": _is_str_map,
    # Buildkite agent tags given verbatim; they win over device_agents and agent_tags.
    "agents": _is_str_map,
    # vLLM's runtime sharding by test durations (ci-infra runtime_shard.py); read, not emitted.
    "automatic_shard": _is_bool,
    # Kubernetes resource claim of vLLM's Intel jobs (.buildkite/intel_jobs); read, not emitted.
    "resource_claim_template": _is_str,
    "timeout_in_minutes": _is_positive_int,
    "optional": _is_bool,
    "soft_fail": _is_soft_fail,
    "retry": _is_mapping,
    "parallelism": _is_positive_int,
    "env": _is_env,
    "working_dir": _is_str,
    "mirror": _is_mapping,
    "concurrency": _is_positive_int,
    "concurrency_group": _is_str,
    "priority": _is_any,
    "if": _is_str,
    "allow_dependency_failure": _is_bool,
    "no_gpu": _is_bool,
    "no_plugin": _is_bool,
    "dind": _is_bool,
    "mount_buildkite_agent": _is_bool,
}

# Keys of a ``mirror: {amd: {...}}`` block: overrides of the parent step for other hardware.
MIRROR_FIELDS: dict[str, Checker] = {
    name: STEP_FIELDS[name]
    for name in (
        "label",
        "device",
        "depends_on",
        "source_file_dependencies",
        "commands",
        "working_dir",
        "env",
        "timeout_in_minutes",
        "dind",
        "soft_fail",
        "num_devices",
        "parallelism",
        "no_gpu",
        "optional",
        "automatic_shard",
        "agent_tags",
        "num_nodes",
        "concurrency",
        "concurrency_group",
    )
}
MIRROR_TARGETS = ("amd",)

FILE_FIELDS: dict[str, Checker] = {
    "group": _is_str,
    "depends_on": _is_optional_str_list,
    "steps": lambda value: None if isinstance(value, list) else "a list of steps",
}

# Keys only vLLM's retired Jinja templates read; the current generator drops them silently.
# Value: the key that does the job now (or None), used for the suggestion.
LEGACY_STEP_KEYS: dict[str, str | None] = {
    "gpu": "device",
    "num_gpus": "num_devices",
    "mirror_hardwares": "mirror",
    "fast_check": None,
    "torch_nightly": None,
    "autorun_on_main": None,
}
LEGACY_MIRROR_TARGETS: dict[str, str | None] = {"torch_nightly": None}

# Common misspellings that difflib would not find on its own.
ALIASES: dict[str, str] = {
    **{name: modern for name, modern in LEGACY_STEP_KEYS.items() if modern},
    "timeout": "timeout_in_minutes",
    "command": "commands",
    "deps": "source_file_dependencies",
    "source_dependencies": "source_file_dependencies",
    "name": "label",
    "agents": "agent_tags",
    "queue": "device",
}

_KEY_DROPPED = str.maketrans("", "", "()%")
_KEY_DASHED = str.maketrans(",+:./", "-----")


def derive_step_key(label: str) -> str:
    """vLLM's key for a step without one (ci-infra ``_generate_step_key``).

    Spaces become '-', the label is lowercased, ``(``, ``)`` and ``%`` are dropped and each of
    ``,+:./`` becomes '-': "CPU-Distributed Tests (PP+TP)" -> "cpu-distributed-tests-pp-tp".
    Other characters stay, exactly as vLLM keeps them (lint reports keys Buildkite rejects).
    """
    return label.replace(" ", "-").lower().translate(_KEY_DROPPED).translate(_KEY_DASHED)


def suggest(name: str, known: list[str]) -> str:
    """' (did you mean X?)' for a near-miss key, else ''."""
    if name in ALIASES and ALIASES[name] in known:
        return f" (did you mean {ALIASES[name]!r}?)"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True, eq=False)
class Step:
    """One test-area step after validation; ``file`` is its YAML path relative to the repo."""

    key: str
    label: str
    group: str
    file: str
    line: int
    commands: tuple[str, ...]
    source_file_dependencies: tuple[str, ...]
    depends_on: tuple[str, ...]
    device: str | None = None
    num_devices: int | None = None
    num_nodes: int | None = None
    agent_tags: Mapping[str, str] = field(default_factory=dict)
    agents: Mapping[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    optional: bool = False
    no_gpu: bool = False
    # AMD runs in a Docker-in-Docker container (True) or natively (False/None), as in vLLM.
    dind: bool | None = None
    # vLLM adds a step's own YAML file to its dependencies only when the file's group
    # ``depends_on`` is non-empty (ci-infra step.py ``read_steps_from_job_dir``).
    own_file_is_dependency: bool = True
    # The mirror target (``amd``) this step was generated for, None for a step of a file.
    mirror_target: str | None = None
    # Keys handed to Buildkite unchanged (timeout_in_minutes, retry, env, parallelism, ...).
    passthrough: Mapping[str, Any] = field(default_factory=dict)
    mirror: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Line of each declared dependency entry in ``file`` (the step's own and its mirrors').
    declared_lines: Mapping[str, int] = field(default_factory=dict)

    @property
    def dependencies(self) -> tuple[str, ...]:
        """Declared path entries, plus the step's own YAML file where vLLM adds it."""
        own = (self.file,) if self.own_file_is_dependency else ()
        return (*self.source_file_dependencies, *own)


PASSTHROUGH_KEYS = (
    "timeout_in_minutes",
    "soft_fail",
    "retry",
    "parallelism",
    "env",
    "concurrency",
    "concurrency_group",
    "priority",
    "if",
    "allow_dependency_failure",
)


@dataclass(frozen=True)
class KeyPolicy:
    """How keys outside the known tables are treated: ``warn`` (load, say so) or ``error``."""

    legacy_keys: str = "warn"
    unknown_keys: str = "warn"


POLICY_VALUES = ("warn", "error")


@dataclass(frozen=True)
class DependencyCheckConfig:
    """Settings of ``ci check-deps``; ``ignore`` maps step key -> path -> reason."""

    test_roots: tuple[str, ...] = ()
    import_roots: tuple[str, ...] = (".",)
    registries: tuple[str, ...] = ()  # files whose dotted-path strings are import edges
    # Platform module -> the step devices (fnmatch patterns; "default" = no device) it runs on:
    # on other devices the module is never imported, so no chain passes through it.
    platforms: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    ignore: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class RunConfig:
    """``ci_config.yaml``: where the test areas are and which changes run everything."""

    path: str
    job_dirs: tuple[str, ...]
    run_all_patterns: tuple[re.Pattern[str], ...] = ()
    run_all_exclude_patterns: tuple[re.Pattern[str], ...] = ()
    # A change matching one of these (and no exclude pattern) runs every AMD step.
    amd_run_all_patterns: tuple[re.Pattern[str], ...] = ()
    name: str = "ci"
    legacy_keys: str = "warn"
    unknown_keys: str = "warn"
    default_working_dir: str | None = None
    workspace_root: str | None = None
    device_agents: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    default_agents: Mapping[str, str] = field(default_factory=dict)
    dependency_check: DependencyCheckConfig = field(default_factory=DependencyCheckConfig)
    # Step keys another pipeline provides (vLLM's AMD image build), valid as depends_on targets.
    external_step_keys: tuple[str, ...] = ()
    # Mirror targets (``amd``) whose steps are emitted next to their parents; vLLM emits all.
    mirrors: tuple[str, ...] = MIRROR_TARGETS
    # Problems that did not stop the load (unknown keys under ``unknown_keys: warn``).
    warnings: tuple[str, ...] = ()

    @property
    def key_policy(self) -> KeyPolicy:
        return KeyPolicy(legacy_keys=self.legacy_keys, unknown_keys=self.unknown_keys)


@dataclass(frozen=True)
class TestAreas:
    """Every step of every test-area file, in file order, plus load warnings."""

    __test__ = False  # not a pytest test class

    steps: tuple[Step, ...]
    files: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    def by_key(self) -> dict[str, Step]:
        return {step.key: step for step in self.steps}


class Problems:
    """Collects errors and warnings of one load so all are reported together."""

    def __init__(self) -> None:
        self.errors: list[CIInputError] = []
        self.warnings: list[str] = []

    def error(self, message: str, path: str, line: int) -> None:
        self.errors.append(CIInputError(message, Location(path, line)))

    def raise_if_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise CIInputErrors(self.errors)


def _check_keys(
    mapping: Mapping[str, Any],
    fields: Mapping[str, Checker],
    where: str,
    path: str,
    problems: Problems,
    policy: KeyPolicy,
    legacy: Mapping[str, str | None] | None = None,
) -> None:
    """Unknown keys, legacy keys and value types of one mapping."""
    known = sorted(fields)
    legacy = legacy or {}
    for name, value in mapping.items():
        line = line_of(mapping, name)
        if name in fields:
            expected = fields[name](value)
            if expected:
                problems.error(f"{where}: {name!r} must be {expected}, got {value!r}", path, line)
        elif isinstance(name, str) and name in legacy and policy.legacy_keys == "warn":
            modern = legacy[name]
            hint = f"; use {modern!r}" if modern else ""
            problems.warnings.append(
                f"{Location(path, line)}: {where}: legacy key {name!r} is ignored by vLLM's "
                f"current generator and by this harness{hint}"
            )
        elif name not in legacy and policy.unknown_keys == "warn":
            problems.warnings.append(
                f"{Location(path, line)}: {where}: unknown key {name!r} is ignored "
                f"(unknown_keys: warn){suggest(str(name), known)}"
            )
        else:
            problems.error(f"{where}: unknown key {name!r}{suggest(str(name), known)}", path, line)


def _load_mirror(
    step_raw: Mapping[str, Any], where: str, path: str, problems: Problems, policy: KeyPolicy
) -> dict[str, Mapping[str, Any]]:
    mirror = step_raw.get("mirror") or {}
    if not isinstance(mirror, Mapping):
        return {}
    result = {}
    for target, body in mirror.items():
        line = line_of(mirror, target)
        if target in LEGACY_MIRROR_TARGETS and policy.legacy_keys == "warn":
            problems.warnings.append(
                f"{Location(path, line)}: {where}: legacy mirror {target!r} is ignored"
            )
            continue
        if target not in MIRROR_TARGETS:
            problems.error(
                f"{where}: unknown mirror {target!r}{suggest(str(target), list(MIRROR_TARGETS))}",
                path,
                line,
            )
            continue
        if not isinstance(body, Mapping):
            problems.error(f"{where}: mirror {target!r} must be a mapping", path, line)
            continue
        _check_keys(body, MIRROR_FIELDS, f"{where} mirror {target}", path, problems, policy)
        result[target] = to_plain(body)
    return result


def _load_step(
    raw: Any,
    group: str,
    file_depends_on: tuple[str, ...],
    path: str,
    index: int,
    problems: Problems,
    policy: KeyPolicy,
) -> Step | None:
    if not isinstance(raw, Mapping):
        problems.error(f"step {index + 1} must be a mapping, got {raw!r}", path, 0)
        return None
    line = getattr(raw, "line", 0)
    label = raw.get("label")
    where = f"step {label!r}" if isinstance(label, str) else f"step {index + 1}"
    errors_before = len(problems.errors)
    _check_keys(raw, STEP_FIELDS, where, path, problems, policy, LEGACY_STEP_KEYS)
    for required in ("label", "commands"):
        if required not in raw:
            problems.error(f"{where}: missing required key {required!r}", path, line)
    if raw.get("num_nodes") and not raw.get("num_devices"):
        problems.error(f"{where}: 'num_nodes' needs 'num_devices'", path, line_of(raw, "num_nodes"))
    if ("concurrency" in raw) != ("concurrency_group" in raw):
        problems.error(
            f"{where}: 'concurrency' and 'concurrency_group' must be set together", path, line
        )
    mirror = _load_mirror(raw, where, path, problems, policy)
    if len(problems.errors) > errors_before:
        return None
    assert isinstance(label, str)  # required and checked to be a string above
    key = raw.get("key") or derive_step_key(label)
    if not key:
        problems.error(f"{where}: cannot derive a key from label {label!r}; add 'key'", path, line)
        return None
    return Step(
        key=key,
        label=label,
        group=group,
        file=path,
        line=line,
        commands=tuple(raw["commands"]),
        source_file_dependencies=tuple(raw.get("source_file_dependencies") or ()),
        depends_on=tuple(raw.get("depends_on") or file_depends_on),
        own_file_is_dependency=bool(file_depends_on),
        device=raw.get("device"),
        num_devices=raw.get("num_devices"),
        num_nodes=raw.get("num_nodes"),
        agent_tags=dict(raw.get("agent_tags") or {}),
        agents=dict(raw.get("agents") or {}),
        working_dir=raw.get("working_dir"),
        optional=raw.get("optional", False),
        no_gpu=raw.get("no_gpu", False),
        dind=raw.get("dind"),
        passthrough={name: to_plain(raw[name]) for name in PASSTHROUGH_KEYS if name in raw},
        mirror=mirror,
        declared_lines=_declared_lines(raw),
    )


def _declared_lines(raw: Mapping[str, Any]) -> dict[str, int]:
    """Entry -> line for the step's ``source_file_dependencies`` and its mirrors' lists."""
    lines = item_lines(raw.get("source_file_dependencies"))
    mirror = raw.get("mirror")
    for body in mirror.values() if isinstance(mirror, Mapping) else ():
        if isinstance(body, Mapping):
            for entry, line in item_lines(body.get("source_file_dependencies")).items():
                lines.setdefault(entry, line)
    return lines


def load_test_area_file(
    file_path: Path, display_path: str, policy: KeyPolicy = KeyPolicy()
) -> tuple[list[Step], list[str]]:
    """Steps of one test-area file and its warnings; all errors raised together."""
    problems = Problems()
    data = load_yaml(file_path, display_path)
    if not isinstance(data, Mapping):
        raise CIInputError(
            "a test-area file must be a mapping with 'steps'", Location(display_path)
        )
    _check_keys(data, FILE_FIELDS, "file", display_path, problems, policy)
    if "steps" not in data:
        problems.error("missing required key 'steps'", display_path, getattr(data, "line", 0))
    problems.raise_if_any()
    group = data.get("group") or ""
    file_depends_on = tuple(data.get("depends_on") or ())
    steps = [
        _load_step(raw, group, file_depends_on, display_path, index, problems, policy)
        for index, raw in enumerate(data["steps"])
    ]
    problems.raise_if_any()
    return [step for step in steps if step is not None], problems.warnings


RUN_CONFIG_FIELDS: dict[str, Checker] = {
    "name": _is_str,
    "job_dirs": _is_str_list,
    "run_all_patterns": _is_str_list,
    "run_all_exclude_patterns": _is_str_list,
    "registries": _is_any,
    "repositories": _is_any,
    "github_repo_name": _is_str,
    "legacy_keys": lambda value: None if value in POLICY_VALUES else "'warn' or 'error'",
    "unknown_keys": lambda value: None if value in POLICY_VALUES else "'warn' or 'error'",
    "amd_run_all_patterns": _is_str_list,
    "default_working_dir": _is_str,
    "workspace_root": _is_str,
    "device_agents": lambda value: (
        None
        if isinstance(value, Mapping) and all(_is_str_map(item) is None for item in value.values())
        else "a mapping of device -> {agent tag: value}"
    ),
    "default_agents": _is_str_map,
    "dependency_check": _is_mapping,
    "external_step_keys": _is_str_list,
    "mirrors": lambda value: (
        None
        if isinstance(value, list) and set(value) <= set(MIRROR_TARGETS)
        else f"a list of mirror targets from {list(MIRROR_TARGETS)}"
    ),
}
DEPENDENCY_CHECK_FIELDS: dict[str, Checker] = {
    "test_roots": _is_str_list,
    "import_roots": _is_str_list,
    "registries": _is_str_list,
    "platforms": lambda value: (
        None
        if isinstance(value, Mapping) and all(_is_str_list(item) is None for item in value.values())
        else "a mapping of platform module path -> list of step devices"
    ),
    "ignore": lambda value: (
        None
        if isinstance(value, Mapping) and all(_is_str_map(item) is None for item in value.values())
        else "a mapping of step key -> {path: reason}"
    ),
}


def _compile_patterns(
    raw: Mapping[str, Any], name: str, path: str, problems: Problems
) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for pattern in raw.get(name) or ():
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            problems.error(
                f"{name}: invalid regular expression {pattern!r}: {error}", path, line_of(raw, name)
            )
    return tuple(compiled)


def load_run_config(config_path: Path, display_path: str | None = None) -> RunConfig:
    """Parse ``ci_config.yaml`` strictly."""
    display = display_path or str(config_path)
    data = load_yaml(config_path, display)
    if not isinstance(data, Mapping):
        raise CIInputError("the run configuration must be a mapping", Location(display))
    problems = Problems()
    unknown_keys = data.get("unknown_keys")  # _check_keys reports a bad value
    policy = KeyPolicy(
        legacy_keys="error",
        unknown_keys=unknown_keys if unknown_keys in POLICY_VALUES else "warn",
    )
    _check_keys(data, RUN_CONFIG_FIELDS, "ci_config", display, problems, policy)
    if "job_dirs" not in data:
        problems.error("missing required key 'job_dirs'", display, getattr(data, "line", 0))
    check_raw = data.get("dependency_check") or {}
    if isinstance(check_raw, Mapping):
        _check_keys(
            check_raw, DEPENDENCY_CHECK_FIELDS, "dependency_check", display, problems, policy
        )
    run_all = _compile_patterns(data, "run_all_patterns", display, problems)
    run_all_exclude = _compile_patterns(data, "run_all_exclude_patterns", display, problems)
    amd_run_all = _compile_patterns(data, "amd_run_all_patterns", display, problems)
    problems.raise_if_any()
    return RunConfig(
        path=display,
        job_dirs=tuple(data["job_dirs"]),
        run_all_patterns=run_all,
        run_all_exclude_patterns=run_all_exclude,
        amd_run_all_patterns=amd_run_all,
        name=data.get("name", "ci"),
        legacy_keys=data.get("legacy_keys", "warn"),
        unknown_keys=policy.unknown_keys,
        default_working_dir=data.get("default_working_dir"),
        workspace_root=data.get("workspace_root"),
        device_agents={
            name: dict(tags) for name, tags in (data.get("device_agents") or {}).items()
        },
        default_agents=dict(data.get("default_agents") or {}),
        dependency_check=DependencyCheckConfig(
            test_roots=tuple(check_raw.get("test_roots") or ()),
            import_roots=tuple(check_raw.get("import_roots") or (".",)),
            registries=tuple(check_raw.get("registries") or ()),
            platforms={
                path: tuple(devices) for path, devices in (check_raw.get("platforms") or {}).items()
            },
            ignore={key: dict(paths) for key, paths in (check_raw.get("ignore") or {}).items()},
        ),
        external_step_keys=tuple(data.get("external_step_keys") or ()),
        mirrors=tuple(data["mirrors"]) if "mirrors" in data else MIRROR_TARGETS,
        warnings=tuple(problems.warnings),
    )
