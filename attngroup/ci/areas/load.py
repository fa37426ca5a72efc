"""All test areas of a run configuration, with mirrors, checked as one step graph.

Step keys must be unique across files (vLLM's fixtures, copied from different commits,
define ``v1-spec-decode`` twice) and every ``depends_on`` must name a step. A file that fails
to load still contributes the keys it declares, so references into it are not reported as
dangling on top of its own error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from attngroup.ci.areas.config import (
    Problems,
    RunConfig,
    Step,
    TestAreas,
    derive_step_key,
    load_test_area_file,
    suggest,
)
from attngroup.ci.areas.mirrors import mirror_key, mirror_step
from attngroup.ci.errors import CIInputError, CIInputErrors, Location


def _check_unique_keys(steps: list[Step], problems: Problems) -> dict[str, Step]:
    """Step keys are unique across files; returns the first step of each key."""
    first_seen: dict[str, Step] = {}
    for step in steps:
        if step.key in first_seen:
            other = first_seen[step.key]
            problems.error(
                f"duplicate step key {step.key!r}: "
                f"also defined at {Location(other.file, other.line)}",
                step.file,
                step.line,
            )
        else:
            first_seen[step.key] = step
    return first_seen


def _check_step_graph(steps: list[Step], problems: Problems, other_keys: set[str]) -> None:
    """Unique keys; every depends_on names a step (or one of ``other_keys``)."""
    first_seen = _check_unique_keys(steps, problems)
    for step in steps:
        for dependency in step.depends_on:
            if dependency not in first_seen and dependency not in other_keys:
                problems.error(
                    f"step {step.key!r}: depends_on {dependency!r} names no step"
                    f"{suggest(dependency, sorted(first_seen))}",
                    step.file,
                    step.line,
                )


def find_test_area_files(config: RunConfig, repo_root: Path) -> list[Path]:
    files: list[Path] = []
    for job_dir in config.job_dirs:
        directory = repo_root / job_dir
        if not directory.is_dir():
            raise CIInputError(
                f"job_dirs entry {job_dir!r} is not a directory", Location(config.path)
            )
        files.extend(sorted(directory.rglob("*.yaml")))
    return files


def _declared_keys(file_path: Path, mirrors: Iterable[str]) -> set[str] | None:
    """Step keys a file that failed validation declares (None when it is not even YAML)."""
    try:
        data = yaml.safe_load(file_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    raw_steps = data.get("steps") if isinstance(data, Mapping) else None
    keys = set()
    for raw in raw_steps if isinstance(raw_steps, list) else ():
        if not isinstance(raw, Mapping):
            continue
        key = raw.get("key")
        if not isinstance(key, str):
            label = raw.get("label")
            key = derive_step_key(label) if isinstance(label, str) else None
        if key:
            keys.add(key)
            mirror = raw.get("mirror")
            keys.update(
                mirror_key(key, target)
                for target in mirrors
                if isinstance(mirror, Mapping) and target in mirror
            )
    return keys


def load_test_areas(config: RunConfig, repo_root: Path) -> TestAreas:
    """Every step under ``config.job_dirs``; errors from all files are reported together."""
    problems = Problems()
    steps: list[Step] = []
    display_paths = []
    failed_keys: set[str] | None = set()  # keys of files that failed; None: unknowable
    for file_path in find_test_area_files(config, repo_root):
        display = file_path.relative_to(repo_root).as_posix()
        display_paths.append(display)
        try:
            file_steps, warnings = load_test_area_file(file_path, display, config.key_policy)
        except CIInputError as failed:
            problems.errors.extend(failed.errors if isinstance(failed, CIInputErrors) else [failed])
            declared = _declared_keys(file_path, config.mirrors)
            failed_keys = (
                None if declared is None or failed_keys is None else failed_keys | declared
            )
            continue
        for step in file_steps:
            steps.append(step)
            steps.extend(
                mirror_step(step, target) for target in config.mirrors if target in step.mirror
            )
        problems.warnings.extend(warnings)
    if failed_keys is None:
        problems.errors.append(
            CIInputError("depends_on references were not checked: a test-area file is not YAML")
        )
        _check_unique_keys(steps, problems)
    else:
        _check_step_graph(steps, problems, {*config.external_step_keys, *failed_keys})
    problems.raise_if_any()
    return TestAreas(tuple(steps), tuple(display_paths), tuple(problems.warnings))
