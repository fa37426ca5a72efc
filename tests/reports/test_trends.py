"""Trend plots: bars clear of the axis labels, one label per run even for one commit."""

from __future__ import annotations

import pytest

from attngroup.reports.render.trends import LEFT, RIGHT, WIDTH, outcome_trend
from tests.reports.records import make_run, make_test

SAME_COMMIT = {"git_sha": "5" * 40}


@pytest.mark.parametrize("count", [2, 3, 12])
def test_bars_stay_clear_of_the_axis_labels(count):
    runs = [
        make_run(
            *(make_test(f"a.py::t{i}") for i in range(1088)),
            run_id=f"r{index}",
            created_at=f"2026-12-03T09:{index:02d}:00+00:00",
            environment=SAME_COMMIT,
        )
        for index in range(count)
    ]
    trend = outcome_trend(runs)
    assert trend.max_total == 1088
    for bar in trend.bars:
        assert bar.x > LEFT and bar.x + bar.width < WIDTH - RIGHT + 1e-9
    assert trend.first_run != trend.last_run  # one commit, two runs: two labels
