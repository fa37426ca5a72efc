"""Rendering of one self-contained HTML report (jinja2, inline CSS/JS/SVG, no network).

Autoescaping is on for the whole template: every string that comes from a test (ids,
messages, parameters, environment) is shown as text, never interpreted as markup.
"""

from __future__ import annotations

import datetime
from collections import Counter
from pathlib import Path

import jinja2
from markupsafe import Markup

from attngroup.reports.compare import Comparison
from attngroup.reports.history import History, previous_runs
from attngroup.reports.record import ADAPTER_ERROR, OUTCOMES
from attngroup.reports.render.formatting import (
    format_change,
    format_duration,
    format_p_value,
    format_value,
)
from attngroup.reports.render.matrix import SHORT_OUTCOMES, build_matrix
from attngroup.reports.render.trends import HEIGHT, WIDTH, metric_trends, outcome_trend
from attngroup.reports.selection import SelectionContext

TEMPLATES = Path(__file__).parent / "templates"
FIELD_COLUMNS = ("pair", "backend", "dtype", "policy", "tp", "k")
# A badge's words where they are not the outcome's name.
OUTCOME_LABELS = {ADAPTER_ERROR: SHORT_OUTCOMES[ADAPTER_ERROR]}
CHANGE_LABELS = (  # comparison list -> label in the all-tests table; first match wins
    ("new_failures", "new failure"),
    ("harness_errors", "harness error"),
    ("fixed", "fixed"),
    ("still_failing", "still failing"),
    ("flaky", "flaky"),
    ("new_tests", "new test"),
)


def _jinja_environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every value, including from .j2 files, is escaped unless marked safe
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(
        value=format_value, change=format_change, p_value=format_p_value, duration=format_duration
    )
    return environment


def render_report(
    comparison: Comparison,
    history: History | None = None,
    selection: SelectionContext | None = None,
) -> str:
    """The full HTML document for ``comparison`` (history feeds trends; selection the CI box)."""
    run, baseline = comparison.run, comparison.baseline
    history = history or History()
    earlier = list(previous_runs(history.records, run))
    if baseline is not None and baseline not in earlier:
        earlier.append(baseline)
    timeline = [*earlier, run]
    change_of = {}
    for list_name, label in reversed(CHANGE_LABELS):
        change_of.update({change.nodeid: label for change in getattr(comparison, list_name)})
    counts = Counter(test.outcome for test in run.tests)
    return (
        _jinja_environment()
        .get_template("report.html.j2")
        .render(
            comparison=comparison,
            run=run,
            run_tests=run.test_by_nodeid(),
            baseline=baseline,
            selection=selection,
            matrix=build_matrix(comparison),
            short_outcomes=SHORT_OUTCOMES,
            outcome_labels=OUTCOME_LABELS,
            history=history,
            metric_trends=metric_trends(timeline),
            outcome_trend=outcome_trend(timeline),
            history_size=len(timeline),
            plot_width=WIDTH,
            plot_height=HEIGHT,
            counts=[(outcome, counts[outcome]) for outcome in OUTCOMES if counts[outcome]],
            change_of=change_of,
            field_columns=FIELD_COLUMNS,
            environment_keys=sorted(
                set(run.environment) | set(baseline.environment if baseline else ())
            ),
            generated_at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            stylesheet=Markup((TEMPLATES / "report.css").read_text(encoding="utf-8")),
            script=Markup((TEMPLATES / "report.js").read_text(encoding="utf-8")),
        )
    )
