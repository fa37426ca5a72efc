"""All test areas of a run configuration, with mirrors, checked as one step graph.

Step keys must be unique across files (vLLM's fixtures, copied from different commits,
define ``v1-spec-decode`` twice) and every ``depends_on`` must name a step.
"""

from __future__ import annotations

from pathlib import Path

from ci.config import (
    Problems,
    RunConfig,
    Step,
    TestAreas,
    load_test_area_file,
    suggest,
)
from ci.errors import CIInputError, CIInputErrors, Location
from ci.mirrors import mirror_step


def _check_step_graph(steps: list[Step], problems: Problems, external_keys: set[str]) -> None:
    """Unique keys across files; every depends_on names a known step."""
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
    for step in steps:
        for dependency in step.depends_on:
            if dependency not in first_seen and dependency not in external_keys:
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


def load_test_areas(config: RunConfig, repo_root: Path) -> TestAreas:
    """Every step under ``config.job_dirs``; errors from all files are reported together."""
    problems = Problems()
    steps: list[Step] = []
    display_paths = []
    for file_path in find_test_area_files(config, repo_root):
        display = file_path.relative_to(repo_root).as_posix()
        display_paths.append(display)
        try:
            file_steps, warnings = load_test_area_file(file_path, display, config.legacy_keys)
        except CIInputErrors as many:
            problems.errors.extend(many.errors)
            continue
        except CIInputError as one:
            problems.errors.append(one)
            continue
        for step in file_steps:
            steps.append(step)
            steps.extend(
                mirror_step(step, target) for target in config.mirrors if target in step.mirror
            )
        problems.warnings.extend(warnings)
    _check_step_graph(steps, problems, set(config.external_step_keys))
    problems.raise_if_any()
    return TestAreas(tuple(steps), tuple(display_paths), tuple(problems.warnings))
