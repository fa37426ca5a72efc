"""Trend plots over the run history, as geometry for inline SVG (no plotting library).

Only numbers are computed here; the template draws them and escapes every label.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from attngroup.reports.compare import typical_value
from attngroup.reports.record import FAILING_OUTCOMES, PASSING_OUTCOMES, Metric, RunRecord
from attngroup.reports.render.formatting import format_number

WIDTH, HEIGHT = 360, 150
LEFT, RIGHT, TOP, BOTTOM = 64, 10, 12, 28  # plot margins, room for axis labels


@dataclass(frozen=True)
class TrendPoint:
    x: float
    y: float
    whisker_low: float  # y of the first quartile (same as y without samples)
    whisker_high: float
    label: str  # tooltip: run and value


@dataclass(frozen=True)
class TrendPlot:
    name: str
    nodeid: str
    unit: str
    points: tuple[TrendPoint, ...]
    y_top_label: str
    y_bottom_label: str
    first_run: str
    last_run: str

    @property
    def polyline(self) -> str:
        return " ".join(f"{point.x:.1f},{point.y:.1f}" for point in self.points)


@dataclass(frozen=True)
class OutcomeBar:
    x: float
    width: float
    segments: tuple[tuple[float, float, str, str], ...]  # (y, height, outcome class, tooltip)


@dataclass(frozen=True)
class OutcomeTrend:
    bars: tuple[OutcomeBar, ...]
    max_total: int
    first_run: str
    last_run: str


def _x_positions(count: int, inset: float = 0.0) -> list[float]:
    """Evenly spread x positions; ``inset`` keeps wide marks (bars) off the axis labels."""
    left, span = LEFT + inset, WIDTH - LEFT - RIGHT - 2 * inset
    if count == 1:
        return [left + span / 2]
    return [left + span * index / (count - 1) for index in range(count)]


def metric_trends(runs: Sequence[RunRecord]) -> tuple[TrendPlot, ...]:
    """One plot per metric seen in at least two of ``runs`` (oldest first)."""
    series: dict[tuple[str, str], list[tuple[RunRecord, Metric]]] = {}
    for run in runs:
        for metric in run.metrics:
            series.setdefault(metric.key, []).append((run, metric))
    return tuple(_metric_plot(points) for _, points in sorted(series.items()) if len(points) >= 2)


def _metric_plot(points: list[tuple[RunRecord, Metric]]) -> TrendPlot:
    spreads = [_quartiles(metric) for _, metric in points]
    low = min(q1 for q1, _ in spreads)
    high = max(q3 for _, q3 in spreads)
    values = [typical_value(metric) for _, metric in points]
    low, high = min(low, *values), max(high, *values)
    padding = (high - low) * 0.1 or abs(high) * 0.05 or 1.0
    low, high = low - padding, high + padding

    def to_y(value: float) -> float:
        return TOP + (HEIGHT - TOP - BOTTOM) * (high - value) / (high - low)

    first = points[0][1]
    return TrendPlot(
        name=first.name,
        nodeid=first.nodeid,
        unit=first.unit,
        points=tuple(
            TrendPoint(
                x=x,
                y=to_y(value),
                whisker_low=to_y(q1),
                whisker_high=to_y(q3),
                label=f"{run.label} {run.created_at}: {format_number(value)} {metric.unit}",
            )
            for x, value, (q1, q3), (run, metric) in zip(
                _x_positions(len(points)), values, spreads, points, strict=True
            )
        ),
        y_top_label=format_number(high),
        y_bottom_label=format_number(low),
        first_run=points[0][0].label,
        last_run=points[-1][0].label,
    )


def _quartiles(metric: Metric) -> tuple[float, float]:
    if len(metric.samples) < 2:
        value = typical_value(metric)
        return value, value
    q1, _, q3 = statistics.quantiles(metric.samples, n=4, method="inclusive")
    return q1, q3


def outcome_trend(runs: Sequence[RunRecord]) -> OutcomeTrend | None:
    """Stacked bars of passed / failed / other outcomes per run; None for a single run."""
    if len(runs) < 2:
        return None
    tallies = []
    for run in runs:
        outcomes = [test.outcome for test in run.tests if test.outcome != "deselected"]
        passed = sum(outcome in PASSING_OUTCOMES for outcome in outcomes)
        failed = sum(outcome in FAILING_OUTCOMES for outcome in outcomes)
        tallies.append((run, passed, failed, len(outcomes) - passed - failed))
    max_total = max(1, *(passed + failed + other for _, passed, failed, other in tallies))
    bar_width = max(2.0, min(24.0, (WIDTH - LEFT - RIGHT) / len(runs) * 0.7))
    xs = _x_positions(len(runs), inset=bar_width / 2 + 2)
    scale = (HEIGHT - TOP - BOTTOM) / max_total
    bars = []
    for x, (run, passed, failed, other) in zip(xs, tallies, strict=True):
        segments = []
        bottom = float(HEIGHT - BOTTOM)
        for count, kind, meaning in (
            (passed, "passed", "passed"),
            (failed, "failed", "failed or errored"),
            (other, "skipped", "skipped"),
        ):
            if count:
                height = count * scale
                bottom -= height
                segments.append((bottom, height, kind, f"{run.label}: {count} {meaning}"))
        bars.append(OutcomeBar(x=x - bar_width / 2, width=bar_width, segments=tuple(segments)))
    return OutcomeTrend(tuple(bars), max_total, runs[0].label, runs[-1].label)
