"""The JSON contracts between packages (``schemas/*.schema.json``), for the tests that
check every writer's real output against them.

The schemas are data in a neutral top-level folder: ``ci``, ``reports`` and
``benchmarks`` import nothing of each other, and no package loads them at run time;
the readers keep their own checks with file-and-field messages.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
SCHEMAS = (
    "run-record",
    "ci-select",
    "ci-check-deps",
    "ci-check-deps-baseline",
    "benchmark-metrics",
    "benchmark-tune-attention",
    "benchmark-ab-attention",
    "reports-comparison",
    "reference-engine-inspect",
    "reference-engine-generate",
    "bugzoo-results",
)
MISSING = object()  # a planted fault that deletes the key


def schema_path(name: str) -> Path:
    return SCHEMA_DIR / f"{name}.schema.json"


@functools.cache
def validator(name: str) -> Draft202012Validator:
    schema = json.loads(schema_path(name).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def schema_errors(instance: Any, name: str) -> list[str]:
    """Every way ``instance`` breaks schema ``name``, each as ``path: message``."""
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '<top>'}: {error.message}"
        for error in validator(name).iter_errors(instance)
    ]


def assert_matches_schema(instance: Any, name: str) -> None:
    errors = schema_errors(instance, name)
    assert not errors, f"{len(errors)} errors against schemas/{name}.schema.json: {errors[:5]}"


def assert_file_matches_schema(path: Path, name: str) -> None:
    assert_matches_schema(json.loads(path.read_text(encoding="utf-8")), name)


def planted(instance: Any, path: tuple, value: object) -> Any:
    """A copy of ``instance`` with the key or index at ``path`` set to ``value``, or deleted
    when ``value`` is ``MISSING``; the key must exist, so a fault never lands beside the data."""
    broken = copy.deepcopy(instance)
    parent = broken
    for key in path[:-1]:
        parent = parent[key]
    assert path[-1] in parent if isinstance(parent, dict) else path[-1] < len(parent)
    if value is MISSING:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return broken


def assert_refuses_planted_fault(instance: Any, name: str, path: tuple, value: object) -> None:
    """``instance`` (a writer's real output) matches schema ``name``, and the same output
    with one planted fault does not."""
    assert_matches_schema(instance, name)
    errors = schema_errors(planted(instance, path, value), name)
    assert errors, f"{name} accepted {path} = {'<missing>' if value is MISSING else value!r}"


def fault_id(path: tuple, value: object) -> str:
    """A readable test id: the path and what was planted there."""
    numbers = value if isinstance(value, list) else [value]
    negative = any(
        isinstance(n, (int, float)) and not isinstance(n, bool) and n < 0 for n in numbers
    )
    what = "missing" if value is MISSING else "negative" if negative else type(value).__name__
    return f"{'.'.join(map(str, path))}-{what}"
