"""Comparison of a run against a baseline run: test status changes and metric changes.

A test status change answers "what broke since the last good run"; a metric change is a
regression only when it exceeds its threshold AND (when raw samples exist on both sides)
is statistically significant, so noise alone never fails CI.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from attngroup.reports.history import flaky_reasons
from attngroup.reports.record import (
    ADAPTER_ERROR,
    FAILING_OUTCOMES,
    PASSING_OUTCOMES,
    Metric,
    RunRecord,
    TestResult,
)
from attngroup.reports.selection import SelectionContext
from attngroup.reports.stats import bootstrap_median_ratio_interval, mann_whitney_u

DEFAULT_THRESHOLD = 0.05
SIGNIFICANCE_LEVEL = 0.01  # Mann-Whitney p-value; the bootstrap interval is 1 - this
COMPARABILITY_KEYS = ("engine", "device")  # environment keys that should match the baseline
# Comparison's lists of TestChange; all but flaky come from classifying each test alone.
TEST_LISTS = (
    "new_failures",
    "harness_errors",
    "fixed",
    "still_failing",
    "new_tests",
    "removed_tests",
    "flaky",
    "not_selected",
    "skipped",
)


@dataclass(frozen=True)
class ThresholdPolicy:
    """Relative change that counts as a regression, per metric.

    First matching ``(regex on metric name, threshold)`` override wins, then the threshold
    the test recorded with the metric, then ``default``.
    """

    default: float = DEFAULT_THRESHOLD
    overrides: tuple[tuple[str, float], ...] = ()

    def threshold_for(self, metric: Metric) -> float:
        for pattern, threshold in self.overrides:
            if re.search(pattern, metric.name):
                return threshold
        return metric.threshold if metric.threshold is not None else self.default


@dataclass(frozen=True)
class TestChange:
    """One test whose status differs from (or is notable against) the baseline."""

    __test__ = False  # not a pytest test class

    nodeid: str
    baseline_outcome: str | None
    current_outcome: str | None
    message: str | None = None
    fields: Mapping[str, str] = field(default_factory=dict)
    markers: tuple[str, ...] = ()
    flaky_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "baseline": self.baseline_outcome,
            "current": self.current_outcome,
            "message": self.message,
            "fields": dict(self.fields),
            "flaky": self.flaky_reason,
        }


@dataclass(frozen=True)
class MetricChange:
    name: str
    nodeid: str
    unit: str
    higher_is_better: bool
    baseline: float | None  # median of samples (or the value when there are none)
    current: float | None
    baseline_samples: tuple[float, ...]
    current_samples: tuple[float, ...]
    change: float | None  # (current - baseline) / |baseline|
    threshold: float
    significant: bool | None  # None: no samples to judge noise by
    p_value: float | None
    interval: tuple[float, float] | None  # bootstrap interval of the median ratio
    method: str
    verdict: str  # regression, improvement, within noise, unchanged, new, removed, not comparable

    @property
    def is_regression(self) -> bool:
        return self.verdict == "regression"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "test": self.nodeid,
            "unit": self.unit,
            "baseline": self.baseline,
            "current": self.current,
            "change": self.change,
            "threshold": self.threshold,
            "significant": self.significant,
            "p_value": self.p_value,
            "interval": list(self.interval) if self.interval else None,
            "method": self.method,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Comparison:
    run: RunRecord
    baseline: RunRecord | None
    new_failures: tuple[TestChange, ...]
    harness_errors: tuple[TestChange, ...]  # no verdict on the engine: neither failed nor passed
    fixed: tuple[TestChange, ...]
    still_failing: tuple[TestChange, ...]
    new_tests: tuple[TestChange, ...]
    removed_tests: tuple[TestChange, ...]
    flaky: tuple[TestChange, ...]
    not_selected: tuple[TestChange, ...]
    skipped: tuple[TestChange, ...]
    metrics: tuple[MetricChange, ...]
    warnings: tuple[str, ...]

    @property
    def metric_regressions(self) -> tuple[MetricChange, ...]:
        return tuple(change for change in self.metrics if change.is_regression)

    @property
    def metric_improvements(self) -> tuple[MetricChange, ...]:
        return tuple(change for change in self.metrics if change.verdict == "improvement")

    @property
    def has_regression(self) -> bool:
        return bool(self.new_failures or self.metric_regressions)

    def to_json(self) -> dict[str, Any]:
        def run_summary(record: RunRecord | None) -> dict[str, Any] | None:
            if record is None:
                return None
            return {
                "run_id": record.run_id,
                "label": record.label,
                "created_at": record.created_at,
                "source": record.source,
            }

        return {
            "run": run_summary(self.run),
            "baseline": run_summary(self.baseline),
            "regression": self.has_regression,
            **{name: [change.to_json() for change in getattr(self, name)] for name in TEST_LISTS},
            "metric_regressions": [change.to_json() for change in self.metric_regressions],
            "metric_improvements": [change.to_json() for change in self.metric_improvements],
            "metrics": [change.to_json() for change in self.metrics],
            "warnings": list(self.warnings),
        }


def compare_runs(
    run: RunRecord,
    baseline: RunRecord | None,
    history: Sequence[RunRecord] = (),
    selection: SelectionContext | None = None,
    thresholds: ThresholdPolicy = ThresholdPolicy(),
) -> Comparison:
    """Classify every test and metric of ``run`` against ``baseline`` (None: no baseline yet)."""
    flaky = flaky_reasons(run, history)
    current = run.test_by_nodeid()
    previous = baseline.test_by_nodeid() if baseline else {}
    lists: dict[str, list[TestChange]] = {name: [] for name in TEST_LISTS if name != "flaky"}
    for nodeid in sorted(current.keys() | previous.keys()):
        now, before = current.get(nodeid), previous.get(nodeid)
        change = _change(nodeid, before, now, flaky.get(nodeid))
        for name in _classify(before, now, baseline is not None, selection):
            lists[name].append(change)
    return Comparison(
        run=run,
        baseline=baseline,
        flaky=tuple(
            _change(n, previous.get(n), current[n], reason) for n, reason in sorted(flaky.items())
        ),
        metrics=_compare_metrics(run, baseline, thresholds),
        warnings=_warnings(run, baseline),
        **{name: tuple(changes) for name, changes in lists.items()},
    )


def _change(
    nodeid: str, before: TestResult | None, now: TestResult | None, flaky_reason: str | None
) -> TestChange:
    described = now if now is not None and now.outcome != "deselected" else before or now
    assert described is not None
    return TestChange(
        nodeid=nodeid,
        baseline_outcome=before.outcome if before else None,
        current_outcome=now.outcome if now else None,
        message=now.message if now else None,
        fields=described.fields,
        markers=described.markers,
        flaky_reason=flaky_reason,
    )


def _classify(
    before: TestResult | None,
    now: TestResult | None,
    has_baseline: bool,
    selection: SelectionContext | None,
) -> list[str]:
    """Lists a test belongs to; a failing new test is both a new test and a new failure."""
    ran_before, ran_now = _ran(before), _ran(now)
    names = []
    if ran_now is not None:
        if ran_now.outcome == "skipped":
            names.append("skipped")
        if has_baseline and before is None:
            names.append("new_tests")
        if ran_now.outcome in FAILING_OUTCOMES:
            failed_before = ran_before is not None and ran_before.outcome in FAILING_OUTCOMES
            names.append("still_failing" if failed_before else "new_failures")
        if ran_now.outcome == ADAPTER_ERROR:
            names.append("harness_errors")
        if (
            ran_now.outcome in PASSING_OUTCOMES
            and ran_before is not None
            and ran_before.outcome in FAILING_OUTCOMES
        ):
            names.append("fixed")
    elif ran_before is not None:
        names.append(
            "not_selected" if _not_selected(ran_before, now, selection) else "removed_tests"
        )
    return names


def _ran(result: TestResult | None) -> TestResult | None:
    """The result when the test ran in that run: present and not deselected."""
    return result if result is not None and result.outcome != "deselected" else None


def _not_selected(
    before: TestResult, now: TestResult | None, selection: SelectionContext | None
) -> bool:
    """Collected but deselected now, or its CI step was not selected for this change."""
    if now is not None:  # present, so deselected in this run
        return True
    if selection is None or before.step is None:
        return False
    step = selection.step(before.step)
    return step is not None and not step.selected and not selection.run_all


def _compare_metrics(
    run: RunRecord, baseline: RunRecord | None, thresholds: ThresholdPolicy
) -> tuple[MetricChange, ...]:
    current = {metric.key: metric for metric in run.metrics}
    previous = {metric.key: metric for metric in baseline.metrics} if baseline else {}
    changes = [
        _compare_metric(
            previous.get(key), current.get(key), thresholds, has_baseline=baseline is not None
        )
        for key in sorted(current.keys() | previous.keys())
    ]
    order = {"regression": 0, "within noise": 1, "improvement": 2}
    return tuple(
        sorted(
            changes, key=lambda change: (order.get(change.verdict, 3), change.name, change.nodeid)
        )
    )


def typical_value(metric: Metric) -> float:
    """The median of the samples (robust to outliers), or the value when there are none."""
    return statistics.median(metric.samples) if metric.samples else metric.value


class _MetricSides(TypedDict):
    """The fields of a ``MetricChange`` that come before its verdict: both sides as measured."""

    name: str
    nodeid: str
    unit: str
    higher_is_better: bool
    threshold: float
    baseline: float | None
    current: float | None
    baseline_samples: tuple[float, ...]
    current_samples: tuple[float, ...]


def _compare_metric(
    before: Metric | None, now: Metric | None, thresholds: ThresholdPolicy, has_baseline: bool
) -> MetricChange:
    described = now or before
    assert described is not None
    baseline = typical_value(before) if before else None
    current = typical_value(now) if now else None
    common = _MetricSides(
        name=described.name,
        nodeid=described.nodeid,
        unit=described.unit,
        higher_is_better=described.higher_is_better,
        threshold=thresholds.threshold_for(described),
        baseline=baseline,
        current=current,
        baseline_samples=before.samples if before else (),
        current_samples=now.samples if now else (),
    )
    if baseline is None or current is None or baseline == 0:
        if before is None:
            verdict = "new" if has_baseline else "no baseline"
        else:
            verdict = "removed" if now is None else "not comparable"
        return MetricChange(
            **common,
            change=None,
            significant=None,
            p_value=None,
            interval=None,
            method="",
            verdict=verdict,
        )
    change = (current - baseline) / abs(baseline)
    significant, p_value, interval, method = _significance(
        common["baseline_samples"], common["current_samples"]
    )
    worse_by = -change if described.higher_is_better else change
    if abs(worse_by) <= common["threshold"]:
        verdict = "unchanged"
    elif significant is False:
        verdict = "within noise"
    else:
        verdict = "regression" if worse_by > 0 else "improvement"
    return MetricChange(
        **common,
        change=change,
        significant=significant,
        p_value=p_value,
        interval=interval,
        method=method,
        verdict=verdict,
    )


def _significance(
    baseline: Sequence[float], current: Sequence[float]
) -> tuple[bool | None, float | None, tuple[float, float] | None, str]:
    """Mann-Whitney U when the sample sizes can reach the level, else a bootstrap interval."""
    if not baseline or not current:
        return None, None, None, "threshold only (no samples)"
    test = mann_whitney_u(current, baseline)
    if test.min_p_value < SIGNIFICANCE_LEVEL:
        return test.p_value < SIGNIFICANCE_LEVEL, test.p_value, None, "Mann-Whitney U"
    interval = bootstrap_median_ratio_interval(baseline, current, confidence=1 - SIGNIFICANCE_LEVEL)
    if interval is None:
        return None, test.p_value, None, "threshold only (zero baseline samples)"
    return not interval[0] <= 1.0 <= interval[1], test.p_value, interval, "bootstrap median ratio"


def _warnings(run: RunRecord, baseline: RunRecord | None) -> tuple[str, ...]:
    if baseline is None:
        return ()
    warnings = []
    if baseline.run_id == run.run_id:
        warnings.append("the baseline is this run itself")
    for key in COMPARABILITY_KEYS:
        before, now = baseline.environment.get(key), run.environment.get(key)
        if before != now and before is not None and now is not None:
            warnings.append(f"{key} differs from the baseline: {before!r} -> {now!r}")
    return tuple(warnings)
