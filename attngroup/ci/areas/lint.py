"""Semantic checks beyond the schema: rules that load fine but cannot mean what they say."""

from __future__ import annotations

import re

from attngroup.ci.areas.config import RunConfig, TestAreas
from attngroup.ci.areas.entries import matches_dependency, split_dependencies

# A '.' not preceded by a backslash and not part of '.*' / '.+' / '.?'.
_BARE_DOT = re.compile(r"(?<!\\)\.(?![*+?{])")


def lint_warnings(config: RunConfig, areas: TestAreas) -> list[str]:
    """Warnings for dead exclusions and regex wildcards that were meant as literal dots."""
    warnings: list[str] = []
    for patterns, name in (
        (config.run_all_patterns, "run_all_patterns"),
        (config.run_all_exclude_patterns, "run_all_exclude_patterns"),
        (config.amd_run_all_patterns, "amd_run_all_patterns"),
    ):
        warnings.extend(
            f"{config.path}: {name}: {pattern.pattern!r} has an unescaped '.', which matches "
            "any character (write '\\.')"
            for pattern in patterns
            if _BARE_DOT.search(pattern.pattern)
        )
    for step in areas.steps:
        includes, excludes = split_dependencies(step.source_file_dependencies)
        warnings.extend(
            f"{step.file}:{step.line}: step {step.key!r}: exclusion '!{exclude}' lies under no "
            "included entry, so it excludes nothing"
            for exclude in excludes
            if not any(matches_dependency(include, exclude.rstrip("/")) for include in includes)
        )
    return warnings
