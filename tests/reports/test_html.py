"""The HTML report: escaping, self-containment, what comes first."""

from __future__ import annotations

import re

import pytest

from attngroup.reports.compare import compare_runs
from attngroup.reports.history import History
from attngroup.reports.render.html import render_report
from attngroup.reports.selection import selection_from_json
from tests.reports.records import (
    HOSTILE_ID,
    HOSTILE_MESSAGE,
    HOSTILE_SELECTION,
    hostile_history,
    make_run,
    make_test,
)


@pytest.fixture(scope="module")
def html() -> str:
    baseline, current = hostile_history()
    selection = selection_from_json(HOSTILE_SELECTION)
    comparison = compare_runs(current, baseline, history=(baseline,), selection=selection)
    return render_report(comparison, history=History(records=(baseline,)), selection=selection)


@pytest.mark.parametrize(
    "raw",
    [
        "<script>window.injected",
        "<img src=x",
        "</pre><script>",
        "<b>bold</b>",
        "<i>CPU</i>",
        "<u>changed</u>",
        "<evil>",
    ],
)
def test_strings_from_tests_are_escaped(html, raw):
    assert raw not in html
    assert raw.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in html


def test_only_the_report_script_is_present(html):
    assert len(re.findall(r"<script\b", html)) == 1


def test_nothing_is_fetched_from_a_network(html):
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html)
    assert "default-src 'none'" in html  # the CSP forbids any fetch


def test_regressions_come_first(html):
    positions = [
        html.index(f'<section id="{name}">')
        for name in (
            "regressions",
            "changes",
            "matrix",
            "metrics",
            "trends",
            "selection",
            "tests",
            "environment",
        )
    ]
    assert positions == sorted(positions)
    regressions = html[positions[0] : positions[1]]
    assert "test_groups[&lt;script&gt;" in regressions
    assert "decode_latency" in regressions


def test_matrix_colours_cells_by_outcome(html):
    matrix = html[html.index('<section id="matrix">') : html.index('<section id="metrics">')]
    assert 'class="cell status-failed"' in matrix  # the grouping case that now fails
    assert 'class="cell status-not-selected"' in matrix  # spec decode step was not selected
    assert 'class="cell status-passed"' in matrix  # the kernel case
    for label in ("Grouping", "Kernels", "Spec decode"):
        assert f"<th>{label}</th>" in matrix


def test_metric_table_shows_delta_and_significance(html):
    metrics = html[html.index('<section id="metrics">') : html.index('<section id="trends">')]
    assert re.search(r"\+(19|20|21)\.\d %", metrics)
    assert "Mann-Whitney U" in metrics
    assert "verdict-regression" in metrics


def test_trend_plot_is_inline_svg(html):
    trends = html[html.index('<section id="trends">') : html.index('<section id="selection">')]
    assert trends.count("<svg") == 2  # outcomes and decode_latency
    assert "<polyline" in trends


def test_report_without_baseline_lists_failures():
    run = make_run(make_test("a.py::test_x", "failed", message=HOSTILE_MESSAGE))
    html = render_report(compare_runs(run, None))
    assert "Failures (no baseline to compare with)" in html
    assert HOSTILE_ID not in html
    assert "a.py::test_x" in html


def test_a_harness_error_has_its_own_change_group():
    baseline = make_run(make_test("a.py::test_x"), run_id="b")
    run = make_run(make_test("a.py::test_x", "adapter_error", message="harness error: planted"))
    html = render_report(compare_runs(run, baseline))
    changes = html[html.index('<section id="changes">') : html.index('<section id="matrix">')]
    group = changes[changes.index("Harness errors: no verdict on the engine") :]
    group = group[: group.index("</details>")]
    assert '<span class="count">1</span>' in group
    assert "a.py::test_x" in group
    assert "harness error: planted" in group
    badge = '<span class="badge outcome-adapter_error">harness error</span>'
    assert badge in group  # the outcome in words, in the list
    assert f'<li class="summary-item">{badge} 1</li>' in html  # and in the banner's counts
