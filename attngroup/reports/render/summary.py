"""Plain-text summary of a comparison, for CI logs (``python -m attngroup.reports compare``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from attngroup.reports.compare import Comparison, MetricChange, TestChange
from attngroup.reports.render.formatting import format_change, format_p_value, format_value

MESSAGE_WIDTH = 160
Item = TypeVar("Item")  # what one summary section lists: a test or a metric change


def _test_line(change: TestChange) -> str:
    before = change.baseline_outcome or "absent"
    line = f"  {change.nodeid} ({before} -> {change.current_outcome or 'absent'})"
    if change.message:
        first_line = change.message.strip().splitlines()[0] if change.message.strip() else ""
        line += f"\n      {first_line[:MESSAGE_WIDTH]}"
    if change.flaky_reason:
        line += f"\n      flaky: {change.flaky_reason}"
    return line


def _metric_line(change: MetricChange) -> str:
    significance = (
        "no samples"
        if change.significant is None
        else f"{'significant' if change.significant else 'not significant'}, {change.method}"
        + (f", p={format_p_value(change.p_value)}" if change.p_value is not None else "")
    )
    return (
        f"  {change.name} [{change.nodeid}]: {format_value(change.baseline, change.unit)} -> "
        f"{format_value(change.current, change.unit)} ({format_change(change.change)}, "
        f"threshold {change.threshold * 100:.1f} %, {significance})"
    )


def _section(title: str, items: Sequence[Item], describe: Callable[[Item], str]) -> list[str]:
    """A titled list with one line per item; nothing at all when there are no items."""
    if not items:
        return []
    return [f"{title} ({len(items)}):", *(describe(item) for item in items)]


def format_summary(comparison: Comparison) -> str:
    run, baseline = comparison.run, comparison.baseline
    lines = [
        f"Run {run.label} ({run.created_at})"
        + (
            f" vs baseline {baseline.label} ({baseline.created_at})"
            if baseline
            else " (no baseline)"
        )
    ]
    lines += [f"warning: {warning}" for warning in comparison.warnings]
    lines += _section(
        "New failures" if baseline else "Failures", comparison.new_failures, _test_line
    )
    lines += _section("Metric regressions", comparison.metric_regressions, _metric_line)
    lines += _section(
        "Harness errors, no verdict on the engine", comparison.harness_errors, _test_line
    )
    lines += _section("Fixed", comparison.fixed, _test_line)
    lines += _section("Still failing", comparison.still_failing, _test_line)
    lines += _section("Flaky", comparison.flaky, _test_line)
    lines += _section("Metric improvements", comparison.metric_improvements, _metric_line)
    lines += _section("New tests", comparison.new_tests, _test_line)
    lines += _section("Removed tests", comparison.removed_tests, _test_line)
    lines += _section("Not run: not selected", comparison.not_selected, _test_line)
    lines.append("Verdict: " + ("REGRESSION" if comparison.has_regression else "OK"))
    return "\n".join(lines)
