"""vLLM's rule for a step's ``source_file_dependencies`` entries: one home, read by selection, lint
and the dependency checker alike (pipeline_generator ``buildkite_step.py``
``_source_file_dependencies_match``)."""

from __future__ import annotations

import functools


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
