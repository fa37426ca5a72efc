"""A benchmark's metric list as a run record, so ``python -m attngroup.reports`` compares benchmark runs.

``bench_attention`` and ``bench_metadata`` measure a list of metrics
``{name, value, unit, samples, higher_is_better}``; the reports tool reads run records
(``attngroup.reports.record.RunRecord``). A metric list becomes a record so:

- one pseudo-test per benchmark case, ``TOOL::CASE``: a metric named
  ``CASE.BACKEND.MEASURE`` (BACKEND one of ``backend_names.BACKENDS``) or
  ``CASE.MEASURE`` belongs to CASE, e.g. ``decode.gemma4-e2b-sliding-d256.b64x8k``,
  ``device`` (the copy bandwidth), ``metadata.gemma4-e2b-mtp.b64``;
- a case fails when one of its ``relative_error`` metrics (``graph_relative_error`` too) is not below
  ``backend_names.MAX_RELATIVE_ERROR`` (a non-finite error fails too, as in the
  benchmark), with a message naming the backend and error; else it passes. The error is
  judged against the bound, never compared with the baseline's as a timed metric: it
  depends on the random inputs and the kernel's summation order, not on speed;
- the case's other metrics are attached as ``MEASURE`` or ``BACKEND.MEASURE`` (e.g.
  ``triton.latency``, ``flashinfer.kv_read_bandwidth``) with their samples, so the
  comparison can tell a change from noise.

Ratios (unit ``ratio``: ``fraction_of_copy_bandwidth``, ``triton_over_flashinfer``) are
left out. Each is a quotient of two medians that the record already holds with their
samples (a backend's ``kv_read_bandwidth`` and ``device``'s ``copy_bandwidth``; the two
backends' latencies), so it has no samples of its own and could only be judged by a bare
threshold; and it moves when the other side moves (FlashInfer getting faster, the copy
measuring differently) while this project's kernel stays as it was. The metric list
(``--json``) and ``attngroup.benchmarks.table`` keep them.

The environment is ``attngroup.reports.environment.collect_environment`` with the benchmark's
device, then any overrides. Convert a list measured elsewhere with only what is known of
that machine (how the committed H200 baseline was made)::

    python -m attngroup.benchmarks.run_record attngroup/benchmarks/results/h200-2026-12-02-full-matrix.json \\
        -o attngroup/benchmarks/results/h200-2026-12-02-full-matrix.record.json --no-local-env \\
        --env "device=NVIDIA H200" --env flashinfer=0.6.13 \\
        --env git_sha=$(git log -1 --format=%H -- attngroup/benchmarks/results/h200-2026-12-02-full-matrix.json) \\
        --created-at 2026-12-02T17:51:36+00:00

Exit status: 0 written; 2 bad input (corrupt JSON, wrong shape, missing fields,
non-finite values), with the file and the problem named and nothing written.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attngroup.benchmarks.backend_names import BACKENDS, MAX_RELATIVE_ERROR
from attngroup.benchmarks.cli import argument_parser
from attngroup.reports.environment import collect_environment, cpu_name
from attngroup.reports.record import (
    Metric,
    RecordError,
    RunRecord,
    Scalar,
    TestResult,
    read_json_file,
)
from attngroup.reports.record import write_record as write_record_file

if TYPE_CHECKING:  # torch loads only when a benchmark names its device
    import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TOOL = "attngroup/benchmarks/bench_attention.py"
JUDGED_MEASURE = "relative_error"
DERIVED_UNIT = "ratio"
FIELDS = ("name", "value", "unit", "samples", "higher_is_better")
EXIT_OK, EXIT_BAD_INPUT = 0, 2


class MetricListError(RecordError):
    """A metric list is not usable: says which list, which metric and what is wrong."""


@dataclass(frozen=True)
class BenchMetric:
    """One entry of a benchmark's metric list, validated."""

    name: str
    value: float
    unit: str
    samples: tuple[float, ...]
    higher_is_better: bool

    @property
    def case(self) -> str:
        return split_name(self.name)[0]

    @property
    def measure(self) -> str:
        """The name within the case: ``latency``, ``triton.latency``, ``relative_error`` ..."""
        return split_name(self.name)[1]

    @property
    def is_judged(self) -> bool:
        return self.measure.rsplit(".", 1)[-1].endswith(JUDGED_MEASURE)  # graph_relative_error too


def split_name(name: str) -> tuple[str, str]:
    """``CASE.BACKEND.MEASURE`` or ``CASE.MEASURE`` -> (CASE, the rest); ValueError if neither."""
    parts = name.split(".")
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"metric name {name!r} is not CASE.MEASURE")
    cut = -2 if len(parts) > 2 and parts[-2] in BACKENDS else -1
    return ".".join(parts[:cut]), ".".join(parts[cut:])


def parse_metric_list(data: Any, source: str) -> list[BenchMetric]:
    """Validate a metric list (parsed JSON); raises MetricListError naming ``source``."""
    where = f"metric list {source}"
    if not isinstance(data, list):
        raise MetricListError(f"{where}: expected a JSON list of metrics, got {_kind(data)}")
    metrics = [_parse_metric(item, f"{where}[{index}]") for index, item in enumerate(data)]
    seen: set[str] = set()
    for index, metric in enumerate(metrics):
        if metric.name in seen:
            raise MetricListError(f"{where}[{index}]: metric {metric.name!r} appears twice")
        seen.add(metric.name)
    return metrics


def _parse_metric(item: Any, where: str) -> BenchMetric:
    if not isinstance(item, dict):
        raise MetricListError(f"{where}: expected a metric object, got {_kind(item)}")
    missing = [key for key in FIELDS if key not in item]
    if missing:
        raise MetricListError(f"{where}: required field(s) {', '.join(map(repr, missing))} missing")
    name, unit, samples = item["name"], item["unit"], item["samples"]
    if not isinstance(name, str):
        raise MetricListError(f"{where}.name: expected a string, got {_kind(name)}")
    where = f"{where} ({name!r})"
    try:
        split_name(name)
    except ValueError as error:
        raise MetricListError(f"{where}: {error}") from None
    if not isinstance(unit, str):
        raise MetricListError(f"{where}.unit: expected a string, got {_kind(unit)}")
    if not isinstance(item["higher_is_better"], bool):
        raise MetricListError(
            f"{where}.higher_is_better: expected a boolean, got {_kind(item['higher_is_better'])}"
        )
    if not isinstance(samples, list):
        raise MetricListError(f"{where}.samples: expected a list, got {_kind(samples)}")
    # A non-finite relative error is a verdict (the output disagrees), anything else bad input.
    judged = name.rsplit(".", 1)[-1] == JUDGED_MEASURE
    return BenchMetric(
        name=name,
        value=_number(item["value"], f"{where}.value", finite=not judged),
        unit=unit,
        samples=tuple(_number(s, f"{where}.samples[{i}]") for i, s in enumerate(samples)),
        higher_is_better=item["higher_is_better"],
    )


def _number(value: Any, where: str, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MetricListError(f"{where}: expected a number, got {_kind(value)}")
    if finite and not math.isfinite(value):
        raise MetricListError(f"{where}: expected a finite number, got {value}")
    return float(value)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def load_metric_list(path: str | Path) -> list[BenchMetric]:
    """A metric list file; an empty list is an error too (it would compare as all removed)."""
    metrics = parse_metric_list(read_json_file(path, "metric list"), repr(str(path)))
    if not metrics:
        raise MetricListError(f"metric list {str(path)!r}: the list holds no metrics")
    return metrics


def case_result(nodeid: str, metrics: Sequence[BenchMetric], bound: float) -> TestResult:
    """Failed when a relative error is not below ``bound`` (NaN included), else passed."""
    failures = [
        f"{metric.measure.removesuffix(JUDGED_MEASURE).rstrip('._') or 'output'} relative error "
        f"{metric.value:.2e} not below {bound:.0e}"
        for metric in metrics
        if metric.is_judged and not metric.value < bound
    ]
    return TestResult(
        nodeid=nodeid,
        outcome="failed" if failures else "passed",
        duration_s=0.0,
        markers=("bench",),
        message="; ".join(failures) or None,
    )


def to_run_record(
    metrics: Sequence[BenchMetric],
    *,
    tool: str = DEFAULT_TOOL,
    environment: Mapping[str, Scalar],
    duration_s: float = 0.0,
    created_at: str | None = None,
    run_id: str | None = None,
    bound: float = MAX_RELATIVE_ERROR,
) -> RunRecord:
    """One pseudo-test per case, in the order the cases first appear in ``metrics``."""
    by_case: dict[str, list[BenchMetric]] = {}
    for metric in metrics:
        by_case.setdefault(metric.case, []).append(metric)
    tests = tuple(case_result(f"{tool}::{case}", group, bound) for case, group in by_case.items())
    exit_status = int(any(test.outcome == "failed" for test in tests))
    return RunRecord(
        run_id=run_id or uuid.uuid4().hex,
        created_at=created_at or datetime.datetime.now(datetime.UTC).isoformat(),
        duration_s=duration_s,
        exit_status=exit_status,
        kind="benchmark",
        environment=dict(environment),
        tests=tests,
        metrics=tuple(
            Metric(
                name=metric.measure,
                nodeid=f"{tool}::{metric.case}",
                value=metric.value,
                unit=metric.unit,
                samples=metric.samples,
                higher_is_better=metric.higher_is_better,
            )
            for metric in metrics
            if not metric.is_judged and metric.unit != DERIVED_UNIT
        ),
    )


def run_environment(
    device: str | None = None, overrides: Mapping[str, Scalar] | None = None, local: bool = True
) -> dict[str, Scalar]:
    """This checkout and machine (unless ``local`` is false), the device, then ``overrides``."""
    environment = collect_environment(REPO_ROOT) if local else {}
    if device is not None:
        environment["device"] = device
    environment.update(overrides or {})
    return environment


def device_label(device: torch.device) -> str:
    """The device a benchmark ran on, as records name it: the GPU, or the CPU even on a
    machine that has a GPU (a CPU run there must not be compared as a GPU run)."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


class RecordWriter:
    """Writes a benchmark's run record (atomically) as its metrics accumulate.

    The environment is collected once, when the benchmark starts.
    """

    def __init__(self, path: Path, tool: str, device: torch.device) -> None:
        self.path = path
        self.tool = tool
        self.environment = run_environment(device_label(device))
        self.run_id = uuid.uuid4().hex
        self.started = datetime.datetime.now(datetime.UTC)

    def write(self, metrics: Sequence[Mapping[str, Any]]) -> RunRecord:
        """``metrics`` as the benchmark writes them to ``--json``."""
        elapsed = datetime.datetime.now(datetime.UTC) - self.started
        record = to_run_record(
            parse_metric_list(list(metrics), f"of {self.tool}"),
            tool=self.tool,
            environment=self.environment,
            duration_s=elapsed.total_seconds(),
            created_at=self.started.isoformat(),
            run_id=self.run_id,
        )
        write_record_file(record, self.path)
        return record


def _environment_override(text: str) -> tuple[str, Scalar]:
    key, separator, value = text.partition("=")
    if not separator or not key.strip():
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE (e.g. 'device=NVIDIA H200'), got {text!r}"
        )
    return key.strip(), value or None


def _timestamp(text: str) -> str:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 time, got {text!r}") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone (add +00:00 for UTC)")
    return moment.astimezone(datetime.UTC).isoformat()


def build_parser() -> argparse.ArgumentParser:
    parser = argument_parser("attngroup.benchmarks.run_record", __doc__.split("\n\n")[0])
    parser.add_argument("metrics", type=Path, help="metric list JSON (a benchmark's --json)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="run record to write")
    parser.add_argument(
        "--tool",
        default=DEFAULT_TOOL,
        help=f"the benchmark that measured the list: the pseudo-tests' file (default {DEFAULT_TOOL})",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        type=_environment_override,
        metavar="KEY=VALUE",
        help="set an environment field (e.g. device, git_sha); an empty VALUE records it as unknown",
    )
    parser.add_argument(
        "--no-local-env",
        action="store_true",
        help="record only the --env fields, nothing of this machine and checkout "
        "(for a list measured elsewhere)",
    )
    parser.add_argument(
        "--created-at",
        type=_timestamp,
        default=None,
        metavar="ISO_TIME",
        help="when the list was measured (default: now)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        metrics = load_metric_list(args.metrics)
        record = to_run_record(
            metrics,
            tool=args.tool,
            environment=run_environment(overrides=dict(args.env), local=not args.no_local_env),
            created_at=args.created_at,
        )
        write_record_file(record, args.output)
    except (RecordError, OSError) as error:  # OSError: the output cannot be written
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    failed = sum(test.outcome == "failed" for test in record.tests)
    print(
        f"wrote {args.output}: {len(record.tests)} cases ({failed} failed), "
        f"{len(record.metrics)} metrics"
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
