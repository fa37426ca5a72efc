"""The versioned JSON run record: one pytest run's tests, metrics and environment.

The pytest plugin writes it, the comparison and the HTML report read it. Reading
validates every field and names the file and the field that is wrong, so a truncated
or foreign JSON file is a clear error rather than a half-rendered report.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attngroup.reports.atomic import write_text_atomic

SCHEMA_NAME = "attention-grouping-run-record"
SCHEMA_VERSION = (
    3  # 2 added ``kind`` (version-1 records get theirs from their tests); 3 ``adapter_error``
)
# What produced a record; only records of one kind are compared with each other.
KINDS = ("pytest", "benchmark")
BENCHMARK_MARKER = "bench"  # the marker of benchmark pseudo-tests (attngroup.benchmarks.run_record)

PASSING_OUTCOMES = frozenset({"passed", "xfailed", "xpassed"})
FAILING_OUTCOMES = frozenset({"failed", "error"})
# "adapter_error": the test failed inside an engine adapter (a harness error raised as an
# exception with ``harness_error = True``): no verdict on the engine, so neither a pass nor
# a failure. "deselected": collected but not run in this invocation (-k/-m, or CI ran
# another subset).
ADAPTER_ERROR = "adapter_error"
OUTCOMES = (
    "passed", "failed", "error", ADAPTER_ERROR, "skipped", "xfailed", "xpassed", "deselected",
)  # fmt: skip

Scalar = str | int | float | bool | None


class RecordError(ValueError):
    """An input file is not a usable run record (or CI selection); says which file and field."""


@dataclass(frozen=True)
class TestResult:
    """One test's final outcome in a run, with its parametrization split into fields."""

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: str
    duration_s: float
    params: Mapping[str, Scalar] = field(default_factory=dict)  # argname -> value, as recorded
    fields: Mapping[str, str] = field(default_factory=dict)  # pair, backend, dtype, tp, ...
    markers: tuple[str, ...] = ()
    message: str | None = None  # short failure message, skip or xfail reason
    details: str | None = None  # the failure's traceback text (tail, bounded)
    attempts: tuple[str, ...] = ()  # outcomes of earlier attempts (reruns), oldest first
    step: str | None = None  # CI step key that ran the test


@dataclass(frozen=True)
class Metric:
    """A measured value (with raw samples, when the test took several) from one test."""

    name: str
    nodeid: str
    value: float
    unit: str
    samples: tuple[float, ...] = ()
    higher_is_better: bool = False
    threshold: float | None = None  # relative change that counts as a regression; None: default

    @property
    def key(self) -> tuple[str, str]:
        return (self.nodeid, self.name)


@dataclass(frozen=True)
class RunRecord:
    """Everything one pytest invocation produced; ``source`` is where it was loaded from."""

    run_id: str
    created_at: str  # ISO 8601, UTC
    duration_s: float
    exit_status: int
    kind: str  # one of KINDS
    environment: Mapping[str, Scalar]
    tests: tuple[TestResult, ...]
    metrics: tuple[Metric, ...] = ()
    source: str = field(default="", compare=False)

    def test_by_nodeid(self) -> dict[str, TestResult]:
        return {test.nodeid: test for test in self.tests}

    @property
    def label(self) -> str:
        """Short human name that tells two runs of one commit apart: sha (or run id) and time."""
        sha = self.environment.get("git_sha")
        stamp = self.created_at[5:19].replace("T", " ")  # MM-DD hh:mm:ss (UTC)
        return f"{str(sha)[:8] if sha else self.run_id[:8]} {stamp}"


def record_to_json(record: RunRecord) -> dict[str, Any]:
    return {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "run_id": record.run_id,
        "created_at": record.created_at,
        "duration_s": record.duration_s,
        "exit_status": record.exit_status,
        "kind": record.kind,
        "environment": dict(record.environment),
        "tests": [
            {
                "nodeid": test.nodeid,
                "outcome": test.outcome,
                "duration_s": test.duration_s,
                "params": dict(test.params),
                "fields": dict(test.fields),
                "markers": list(test.markers),
                "message": test.message,
                "details": test.details,
                "attempts": list(test.attempts),
                "step": test.step,
            }
            for test in record.tests
        ],
        "metrics": [
            {
                "name": metric.name,
                "nodeid": metric.nodeid,
                "value": metric.value,
                "unit": metric.unit,
                "samples": list(metric.samples),
                "higher_is_better": metric.higher_is_better,
                "threshold": metric.threshold,
            }
            for metric in record.metrics
        ],
    }


def write_record(record: RunRecord, path: str | Path) -> Path:
    """Write the record atomically (temp file + rename), creating missing folders."""
    text = json.dumps(record_to_json(record), indent=1, sort_keys=False, allow_nan=False)
    return write_text_atomic(path, text + "\n")


def read_json_file(path: str | Path, what: str) -> Any:
    """Parse a JSON file, gzip-compressed where its name ends in ``.gz`` (a CI artifact or a
    committed record kept small), turning every way it can be unusable into a RecordError."""
    source = Path(path)
    try:
        data = source.read_bytes()
        if source.suffix == ".gz":
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise RecordError(f"{what} {str(source)!r} does not exist") from None
    except IsADirectoryError:
        raise RecordError(f"{what} {str(source)!r} is a directory, not a JSON file") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise RecordError(
            f"{what} {str(source)!r} is not valid gzip (truncated or corrupt?): {error}"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise RecordError(f"{what} {str(source)!r} cannot be read: {error}") from None
    if not text.strip():
        raise RecordError(f"{what} {str(source)!r} is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise RecordError(
            f"{what} {str(source)!r} is not valid JSON (truncated or corrupt?): {error}"
        ) from None


def load_record(path: str | Path) -> RunRecord:
    """Load and validate a run record file."""
    return record_from_json(read_json_file(path, "run record"), source=str(path))


def record_from_json(data: Any, source: str = "<memory>") -> RunRecord:
    top = Fields(data, f"run record {source!r}")
    schema = top.get("schema", str)
    if schema != SCHEMA_NAME:
        raise RecordError(f"{top.where}: 'schema' is {schema!r}, expected {SCHEMA_NAME!r}")
    version = top.get("schema_version", int)
    if version > SCHEMA_VERSION:
        raise RecordError(
            f"{top.where}: schema_version {version} is newer than this reader "
            f"(supports {SCHEMA_VERSION}); update the reports package"
        )
    if version < 1:
        raise RecordError(f"{top.where}: schema_version {version} is not valid")
    tests = tuple(_test_from_json(item) for item in top.items("tests"))
    if version >= 2:
        kind = top.get("kind", str)
        if kind not in KINDS:
            raise RecordError(f"{top.where}.kind: {kind!r} is not one of {', '.join(KINDS)}")
    else:
        kind = kind_of_tests(tests)
    return RunRecord(
        run_id=top.get("run_id", str),
        created_at=top.get("created_at", str),
        duration_s=top.get("duration_s", float),
        exit_status=top.get("exit_status", int),
        kind=kind,
        environment=top.mapping("environment", _scalar),
        tests=tests,
        metrics=tuple(_metric_from_json(item) for item in top.items("metrics")),
        source=source,
    )


def kind_of_tests(tests: tuple[TestResult, ...]) -> str:
    """The kind of a version-1 record: benchmark when every test is a benchmark case."""
    if tests and all(BENCHMARK_MARKER in test.markers for test in tests):
        return "benchmark"
    return "pytest"


def _test_from_json(item: Fields) -> TestResult:
    outcome = item.get("outcome", str)
    if outcome not in OUTCOMES:
        raise RecordError(f"{item.where}.outcome: {outcome!r} is not one of {', '.join(OUTCOMES)}")
    attempts = tuple(item.get_list("attempts", str))
    for attempt in attempts:
        if attempt not in OUTCOMES:
            raise RecordError(f"{item.where}.attempts: {attempt!r} is not an outcome")
    return TestResult(
        nodeid=item.get("nodeid", str),
        outcome=outcome,
        duration_s=item.get("duration_s", float),
        params=item.mapping("params", _scalar),
        fields=item.mapping("fields", _string),
        markers=tuple(item.get_list("markers", str)),
        message=item.get("message", str, optional=True),
        details=item.get("details", str, optional=True),
        attempts=attempts,
        step=item.get("step", str, optional=True),
    )


def _metric_from_json(item: Fields) -> Metric:
    threshold = item.get("threshold", float, optional=True)
    if threshold is not None and threshold <= 0:
        raise RecordError(f"{item.where}.threshold: must be positive, got {threshold}")
    return Metric(
        name=item.get("name", str),
        nodeid=item.get("nodeid", str),
        value=item.get("value", float),
        unit=item.get("unit", str),
        samples=tuple(item.get_list("samples", float)),
        higher_is_better=item.get("higher_is_better", bool),
        threshold=threshold,
    )


def _scalar(value: Any, where: str) -> Scalar:
    if value is None or isinstance(value, str | bool | int | float):
        return value
    raise RecordError(f"{where}: expected a string, number, boolean or null, got {_kind(value)}")


def _string(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    raise RecordError(f"{where}: expected a string, got {_kind(value)}")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _check_type(value: Any, kind: type, where: str) -> Any:
    """Check one JSON value against a Python type; ints pass as floats, bools never as numbers."""
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise RecordError(f"{where}: expected a finite number, got {value}")
        return float(value)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    expected = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}[kind]
    raise RecordError(f"{where}: expected {expected}, got {_kind(value)}")


class Fields:
    """Typed access to one JSON object, with a location path for error messages."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected a JSON object, got {_kind(data)}")
        self.data = data
        self.where = where

    def get(self, key: str, kind: type, *, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise RecordError(f"{self.where}: required field {key!r} is missing")
        value = self.data[key]
        if value is None and optional:
            return None
        return _check_type(value, kind, f"{self.where}.{key}")

    def get_list(self, key: str, kind: type) -> list[Any]:
        values = self.data.get(key, [])
        if not isinstance(values, list):
            raise RecordError(f"{self.where}.{key}: expected a list, got {_kind(values)}")
        return [
            _check_type(value, kind, f"{self.where}.{key}[{i}]") for i, value in enumerate(values)
        ]

    def items(self, key: str) -> list[Fields]:
        """A required list of objects."""
        if key not in self.data:
            raise RecordError(f"{self.where}: required field {key!r} is missing")
        values = self.data[key]
        if not isinstance(values, list):
            raise RecordError(f"{self.where}.{key}: expected a list, got {_kind(values)}")
        return [Fields(value, f"{self.where}.{key}[{i}]") for i, value in enumerate(values)]

    def mapping(self, key: str, convert: Callable[[Any, str], Any]) -> dict[str, Any]:
        values = self.data.get(key, {})
        if not isinstance(values, dict):
            raise RecordError(f"{self.where}.{key}: expected an object, got {_kind(values)}")
        return {
            name: convert(value, f"{self.where}.{key}.{name}") for name, value in values.items()
        }
