"""pytest plugin: record every test of a run into one versioned JSON run record.

Loaded through the ``pytest11`` entry point wherever this project is installed, so it is
inert unless asked: a record is written only when ``--run-record PATH`` is given (the nox
sessions give it), and never for ``--collect-only`` or a run that ended in a usage error,
so such a run cannot replace a good record. The ``record_metric`` fixture always works;
it stores metrics in the test's ``user_properties``, which pytest-xdist ships to the
controller and ``--junitxml`` writes as properties. Under xdist the controller records outcomes from the reports it receives
and merges what only workers know (parameters, markers, deselection, device) from
``workeroutput``. JUnit XML for CI views: use pytest's own ``--junitxml``.

What a test is about (its ``fields``: pair, backend, dtype, tp, k, policy) comes from
its ``@pytest.mark.case(pair=..., backend=..., dtype=...)`` marker; the suites give every
test one (``attngroup/suites/cases.py``). A test without the marker falls back to its parameters'
names and values (public ``item.callspec`` data) for everything but the pair: only a
marker makes a test a model pair's, since a parameter named ``pair`` may hold two batches
(``large-then-small``) as well as a model pair.
"""

from __future__ import annotations

import datetime
import enum
import json
import math
import numbers
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from attngroup.reports.atomic import OutputPathError, check_output_path
from attngroup.reports.environment import collect_environment, device_name
from attngroup.reports.record import (
    ADAPTER_ERROR,
    Metric,
    RunRecord,
    Scalar,
    TestResult,
    write_record,
)

RECORDER_NAME = "attention_grouping_recorder"
METRIC_PROPERTY = "attention_grouping.metric"
# Set on a failing report that is the harness's fault (``harness_error_reason``), so the test
# is an adapter error, not a verdict on the engine; its value, where not empty, is put before
# the failure's message.
ADAPTER_ERROR_PROPERTY = "attention_grouping.adapter_error"
WORKER_OUTPUT_KEY = "attention_grouping_records"
DETAILS_LIMIT = 20_000  # characters of traceback kept per failure
VALUE_LIMIT = 200  # characters kept of a parameter's text
# record field -> parameter names that mean it (first present wins), for unmarked tests
FIELD_ALIASES = {
    "backend": ("backend", "attn_backend", "attention_backend", "backend_name"),
    "dtype": ("dtype", "torch_dtype"),
    "policy": ("policy", "grouping_policy"),
    "tp": ("tp", "tp_size", "tensor_parallel_size"),
    "k": ("k", "num_speculative_tokens", "num_spec_tokens"),
    "engine": ("engine", "engine_name"),
    "heads": ("heads", "num_heads", "num_heads_q"),
    "kv_heads": ("kv_heads", "num_kv_heads"),
    "head_size": ("head_size", "head_dim"),
    "block_size": ("block_size",),
    "sliding_window": ("sliding_window", "window"),
}
DTYPE_NAMES = {
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float64": "fp64",
    "fp64": "fp64",
    "double": "fp64",
    "float8_e4m3fn": "fp8",
    "fp8": "fp8",
}
ALIAS_TO_FIELD = {alias: name for name, aliases in FIELD_ALIASES.items() for alias in aliases}
ID_TOKEN_FIELDS = (  # fields recognisable in a test id when no parameter names them
    ("tp", re.compile(r"tp(\d+)")),
    ("k", re.compile(r"k(\d+)")),
)
CASE_MARKER = "case"
CASE_FIELDS = ("pair", "backend", "dtype", "tp", "k", "policy")
PYTEST_MARKERS = {  # pytest's own and the case marker: not check areas
    "parametrize",
    "usefixtures",
    "filterwarnings",
    "skip",
    "skipif",
    "xfail",
    CASE_MARKER,
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("run records", "attention-grouping run records (reports package)")
    group.addoption(
        "--run-record",
        metavar="PATH",
        default=None,
        help="write a JSON run record of this run to PATH (folders are created; "
        "nothing is written for --collect-only or a usage error)",
    )
    group.addoption(
        "--ci-step",
        metavar="KEY",
        default=None,
        help="CI step key stored with every test (default: $BUILDKITE_STEP_KEY)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Marks the report of a harness error (runs where the test runs: the xdist workers
    ship ``user_properties`` to the controller)."""
    report = yield
    error = call.excinfo.value if call.excinfo is not None else None
    workers = xdist_workers(item.config)
    reason = harness_error_reason(error, workers) if report.failed else None
    if reason is not None:
        report.user_properties.append((ADAPTER_ERROR_PROPERTY, reason))
    return report


def xdist_workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers share the run: 1 outside xdist. An xdist worker's config
    says so (an environment variable would also reach a pytest a test starts in a subprocess)."""
    return int(getattr(config, "workerinput", {}).get("workercount", 1))


def harness_error_reason(error: BaseException | None, workers: int) -> str | None:
    """Why a failure is the harness's, not the engine's, or None where it is the engine's.

    An exception that says so (``harness_error``, as the engine adapters' ``AdapterError``
    does; its message explains itself: ""), or the GPU's memory exhausted while several
    pytest-xdist ``workers`` share it (each worker runs on the default device): the run's own
    parallelism ran out of memory, where one worker would have had the device to itself."""
    if error is None:
        return None
    if getattr(error, "harness_error", False) is True:
        return ""
    if workers <= 1 or not _is_gpu_out_of_memory(error):
        return None
    return (
        f"harness error: GPU out of memory with {workers} pytest-xdist workers sharing the "
        "GPU; rerun with fewer workers (-n)"
    )


CUDA_OUT_OF_MEMORY = re.compile(r"CUDA(?: error|\]): out of memory")
"""A CUDA allocation failure as torch (``AcceleratorError``: "CUDA error: out of memory") and
Triton's launcher ("Triton Error [CUDA]: out of memory") raise it."""


def _is_gpu_out_of_memory(error: BaseException) -> bool:
    """torch's ``OutOfMemoryError`` (its caching allocator), or a CUDA allocation failure
    raised as a ``RuntimeError`` by torch or Triton."""
    if any(
        cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch")
        for cls in type(error).__mro__
    ):
        return True
    return isinstance(error, RuntimeError) and CUDA_OUT_OF_MEMORY.search(str(error)) is not None


def record_path(config: pytest.Config) -> Path | None:
    """Where to write the record: ``--run-record``, checked now, before any test runs."""
    value = config.getoption("run_record")
    if not value or config.getoption("collectonly"):
        return None
    path = Path(value)
    path = path if path.is_absolute() else config.invocation_params.dir / path
    try:
        return check_output_path(path, create_parents=True)
    except OutputPathError as error:
        raise pytest.UsageError(f"--run-record: {error}") from None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{CASE_MARKER}(pair=None, backend=None, dtype=None, tp=None, k=None, policy=None): "
        "what the test is about, for the run record's model pair x check matrix",
    )
    path = record_path(config)
    if path is not None:
        config.pluginmanager.register(RunRecorder(config, path), RECORDER_NAME)


@pytest.fixture
def record_metric(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``record_metric(name, value, unit, samples=[...], higher_is_better=None, threshold=None)``.

    ``samples`` (raw repeated measurements) let the comparison judge noise; the median of
    the samples is what is compared. ``higher_is_better`` defaults from the unit (rates
    like ``tokens/s`` are higher-is-better, times and sizes lower-is-better). ``threshold``
    overrides the default 5 % relative change that counts as a regression.
    """
    properties = request.node.user_properties

    def record(
        name: str,
        value: float,
        unit: str,
        samples: Iterable[float] = (),
        *,
        higher_is_better: bool | None = None,
        threshold: float | None = None,
    ) -> None:
        metric = _checked_metric(name, value, unit, samples, higher_is_better, threshold)
        if any(
            key == METRIC_PROPERTY and json.loads(text)["name"] == name for key, text in properties
        ):
            raise ValueError(f"metric {name!r} was already recorded by this test")
        properties.append((METRIC_PROPERTY, json.dumps(metric, allow_nan=False)))

    return record


def higher_is_better_for(unit: str) -> bool:
    """Rates and speedups go up when things improve; times, sizes and errors go down."""
    normalized = unit.strip().lower()
    return normalized.endswith("/s") or normalized in {"x", "speedup", "flops", "tflops", "gflops"}


def _finite(value: Any, what: str) -> float:
    # numbers.Real also admits numpy scalars; a tensor needs .item() first
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _checked_metric(
    name: Any,
    value: Any,
    unit: Any,
    samples: Iterable[Any],
    higher_is_better: bool | None,
    threshold: float | None,
) -> dict[str, Any]:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"metric name must be a non-empty string, got {name!r}")
    if not isinstance(unit, str):
        raise ValueError(f"metric {name!r}: unit must be a string such as 'ms', got {unit!r}")
    if threshold is not None and not _finite(threshold, f"metric {name!r}: threshold") > 0:
        raise ValueError(f"metric {name!r}: threshold must be positive, got {threshold!r}")
    return {
        "name": name,
        "value": _finite(value, f"metric {name!r}: value"),
        "unit": unit,
        "samples": [_finite(sample, f"metric {name!r}: sample") for sample in samples],
        "higher_is_better": higher_is_better_for(unit)
        if higher_is_better is None
        else higher_is_better,
        "threshold": threshold,
    }


def _parameter_value(value: object) -> Scalar:
    """A JSON scalar that names the parameter: the value itself, its name, or its text."""
    if value is None or isinstance(value, bool | int | str):
        return value if not isinstance(value, str) else value[:VALUE_LIMIT]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return value.value if isinstance(value.value, str | int) else value.name
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return name[:VALUE_LIMIT]
    text = str(value)
    if " object at 0x" in text:  # a default repr names a memory address, not the value
        return f"<{type(value).__name__}>"
    return text[:VALUE_LIMIT]


def _normalize_field(field_name: str, value: Scalar) -> str:
    text = str(value)
    if field_name == "dtype":
        return DTYPE_NAMES.get(text.removeprefix("torch.").lower(), text)
    return text


def _with_compound_parts(params: Mapping[str, object]) -> dict[str, object]:
    """``backend_dtype=("triton", torch.float32)`` also counts as backend and dtype."""
    expanded = dict(params)
    for name, value in params.items():
        parts = name.split("_")
        if (
            isinstance(value, tuple | list)
            and len(parts) == len(value) > 1
            and all(part in ALIAS_TO_FIELD for part in parts)
        ):
            for part, part_value in zip(parts, value, strict=True):
                expanded.setdefault(part, part_value)
    return expanded


def _guessed_fields(values: Mapping[str, object], test_id: str) -> dict[str, str]:
    """For a test without a case marker: fields from parameter names first, then from
    unambiguous test-id tokens; never a pair."""
    fields: dict[str, str] = {}
    for field_name, aliases in FIELD_ALIASES.items():
        alias = next((alias for alias in aliases if alias in values), None)
        if alias is not None:
            value = _parameter_value(values[alias])
            fields[field_name] = _normalize_field(field_name, value)
    for token in test_id.split("-") if test_id else ():
        if "dtype" not in fields and token.lower() in DTYPE_NAMES:
            fields["dtype"] = DTYPE_NAMES[token.lower()]
        for field_name, pattern in ID_TOKEN_FIELDS:
            match = pattern.fullmatch(token)
            if field_name not in fields and match:
                fields[field_name] = match.group(1)
    return fields


def case_fields(item: pytest.Item) -> dict[str, str] | None:
    """The fields the test's case marker names; None when it has no marker."""
    case = item.get_closest_marker(CASE_MARKER)
    if case is None:
        return None
    unknown = sorted(set(case.kwargs) - set(CASE_FIELDS))
    if unknown or case.args:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.{CASE_MARKER} takes keywords "
            f"{', '.join(CASE_FIELDS)}; got {', '.join(unknown) or 'positional arguments'}"
        )
    return {
        name: _normalize_field(name, _parameter_value(value))
        for name, value in case.kwargs.items()
        if value is not None
    }


def describe_item(item: pytest.Item, engine: str | None) -> dict[str, Any]:
    """Parameters, the known fields (pair, backend, dtype, ...) and markers of one test."""
    callspec = getattr(item, "callspec", None)
    raw_params: dict[str, object] = dict(callspec.params) if callspec is not None else {}
    params = {name: _parameter_value(value) for name, value in raw_params.items()}
    fields = case_fields(item)
    if fields is None:
        fields = _guessed_fields(_with_compound_parts(raw_params), callspec.id if callspec else "")
    if engine and "engine" not in fields:
        fields["engine"] = engine
    markers = sorted({mark.name for mark in item.iter_markers()} - PYTEST_MARKERS)
    return {"params": params, "fields": fields, "markers": markers}


@dataclass
class _TestProgress:
    """What the reports of one test said so far (setup, call, teardown, reruns)."""

    nodeid: str
    phases: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    message: str | None = None
    details: str | None = None
    xfail_reason: str | None = None
    attempts: list[str] = field(default_factory=list)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    adapter_error: bool = False  # a phase failed by the harness's fault
    harness_reason: str | None = None  # what the harness says of it, before the message
    markers: set[str] = field(default_factory=set)  # from report keywords, if workers send nothing

    def add(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        self.duration_s += getattr(report, "duration", 0.0)
        for key, text in getattr(report, "user_properties", ()):
            if key == METRIC_PROPERTY:
                metric = json.loads(text)
                self.metrics[metric["name"]] = metric
            elif key == ADAPTER_ERROR_PROPERTY:
                self.adapter_error = True
                self.harness_reason = text or None
        if report.outcome == "rerun":  # pytest-rerunfailures: this attempt failed, another follows
            self.attempts.append(self._outcome_of({report.when: "failed"}))
            self.phases.clear()
            return
        self.phases[getattr(report, "when", "collect")] = report.outcome
        if hasattr(report, "wasxfail"):
            self.xfail_reason = report.wasxfail
        if report.failed and self.message is None:
            self.message = _failure_message(report)
            if self.harness_reason is not None:
                self.message = f"{self.harness_reason}: {self.message}"
            self.details = report.longreprtext[-DETAILS_LIMIT:] or None
        elif report.skipped and not hasattr(report, "wasxfail"):
            self.message = _skip_reason(report)

    def _outcome_of(self, phases: dict[str, str]) -> str:
        if self.adapter_error and "failed" in phases.values():
            return ADAPTER_ERROR
        if phases.get("call") == "failed":
            return "failed"
        if "failed" in phases.values():
            return "error"  # setup, teardown or collection
        if self.xfail_reason is not None:
            return "xfailed" if "skipped" in phases.values() else "xpassed"
        if "skipped" in phases.values():
            return "skipped"
        return "passed"

    @property
    def outcome(self) -> str:
        return self._outcome_of(self.phases)


def _failure_message(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if message:
        return message
    lines = [line for line in report.longreprtext.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "failed"


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


class RunRecorder:
    """Collects one run; writes the record on the controller (or the only process)."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.config = config
        self.path = path
        self.is_worker = hasattr(config, "workerinput")
        self.engine = config.getoption("engine", default=None)
        self.ci_step = config.getoption("ci_step") or os.environ.get("BUILDKITE_STEP_KEY")
        self.items: dict[str, dict[str, Any]] = {}  # nodeid -> describe_item()
        self.deselected: set[str] = set()
        self.progress: dict[str, _TestProgress] = {}
        self.worker_devices: list[str] = []
        self.project_markers = _project_markers(config)
        self.started = time.time()
        self.written = False

    # Collection: runs where items are collected (the workers under xdist).
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            self.items[item.nodeid] = describe_item(item, self.engine)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            self.items[item.nodeid] = describe_item(item, self.engine)
            self.deselected.add(item.nodeid)

    # Outcomes: the controller sees every worker's reports through these hooks.
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.is_worker:
            return
        progress = self.progress.setdefault(report.nodeid, _TestProgress(report.nodeid))
        progress.add(report)
        progress.markers.update(name for name in report.keywords if name in self.project_markers)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed and not self.is_worker:
            nodeid = report.nodeid or "<collection>"
            self.progress.setdefault(nodeid, _TestProgress(nodeid)).add(report)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
        if output is None:  # the worker crashed before finishing: its reports still count
            return
        self.items.update(output["items"])
        self.deselected.update(output["deselected"])
        self.worker_devices.append(output["device"])

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker:
            # pytest-xdist sets workeroutput on a worker's config; pytest's Config type lacks it.
            worker_output: dict[str, Any] = vars(self.config)["workeroutput"]
            worker_output[WORKER_OUTPUT_KEY] = {
                "items": self.items,
                "deselected": sorted(self.deselected),
                "device": device_name(),
            }
            return
        if exitstatus == pytest.ExitCode.USAGE_ERROR:  # e.g. --shard 3/2: no run took place
            return
        write_record(self._record(int(exitstatus)), self.path)
        self.written = True

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.written:
            terminalreporter.write_line(f"run record: {self.path}")

    def _record(self, exit_status: int) -> RunRecord:
        tests = [self._result(progress) for progress in self.progress.values()]
        tests += [
            self._result(_TestProgress(nodeid), outcome="deselected")
            for nodeid in sorted(self.deselected - self.progress.keys())
        ]
        metrics = [
            Metric(nodeid=progress.nodeid, **metric)
            for progress in self.progress.values()
            for metric in progress.metrics.values()
        ]
        environment = collect_environment(self.config.rootpath)
        environment.update(
            device=self.worker_devices[0] if self.worker_devices else environment["device"],
            engine=self.engine,
            ci_step=self.ci_step,
            pytest_args=" ".join(self.config.invocation_params.args),
        )
        return RunRecord(
            run_id=uuid.uuid4().hex,
            created_at=datetime.datetime.fromtimestamp(self.started, datetime.UTC).isoformat(),
            duration_s=time.time() - self.started,
            exit_status=exit_status,
            kind="pytest",
            environment=environment,
            tests=tuple(tests),
            metrics=tuple(metrics),
        )

    def _result(self, progress: _TestProgress, outcome: str | None = None) -> TestResult:
        described = self.items.get(progress.nodeid, {})
        return TestResult(
            nodeid=progress.nodeid,
            outcome=outcome or progress.outcome,
            duration_s=progress.duration_s,
            params=described.get("params", {}),
            fields=described.get("fields", {"engine": self.engine} if self.engine else {}),
            markers=tuple(described.get("markers", sorted(progress.markers))),
            message=progress.message
            if progress.message is not None
            else progress.xfail_reason or None,
            details=progress.details,
            attempts=tuple(progress.attempts),
            step=self.ci_step,
        )


def _project_markers(config: pytest.Config) -> set[str]:
    """Marker names registered in the ini ``markers`` list (e.g. grouping, kernels)."""
    return {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
