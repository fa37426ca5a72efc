"""Command line: ``python -m attngroup.reports build`` (HTML), ``compare`` (CI gate), ``archive`` (history).

Exit codes: 0 success / no regression, 1 regression (compare), 2 bad input. The output
path is checked and all inputs are loaded and validated before anything is written, and
the report is written atomically, so bad input never replaces a previous good report.
Records of different kinds (a pytest run against a benchmark baseline) are refused unless
``--force``; a history file that is no valid record is left out with a warning naming it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from attngroup.reports.atomic import OutputPathError, check_output_path, write_text_atomic
from attngroup.reports.compare import DEFAULT_THRESHOLD, Comparison, ThresholdPolicy, compare_runs
from attngroup.reports.history import (
    DEFAULT_KEEP,
    History,
    archive_run,
    latest_baseline,
    load_history,
)
from attngroup.reports.record import RecordError, RunRecord, load_record
from attngroup.reports.render.html import render_report
from attngroup.reports.render.summary import format_summary
from attngroup.reports.selection import SelectionContext, load_selection

EXIT_OK, EXIT_REGRESSION, EXIT_BAD_INPUT = 0, 1, 2


@dataclass(frozen=True)
class Inputs:
    run: RunRecord
    baseline: RunRecord | None
    history: History
    selection: SelectionContext | None
    comparison: Comparison


def _fraction(text: str) -> float:
    """'0.05' or '5%' -> 0.05; must be positive."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 0.05 or 5%)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"threshold must be positive, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _threshold_override(text: str) -> tuple[str, float]:
    pattern, separator, fraction = text.rpartition("=")
    if not separator or not pattern:
        raise argparse.ArgumentTypeError(
            f"expected REGEX=FRACTION (e.g. 'latency=10%'), got {text!r}"
        )
    try:
        re.compile(pattern)
    except re.error as error:
        raise argparse.ArgumentTypeError(f"bad regular expression {pattern!r}: {error}") from None
    return pattern, _fraction(fraction)


def _add_common(parser: argparse.ArgumentParser, baseline_required: bool) -> None:
    parser.add_argument(
        "--run", required=True, metavar="RECORD", help="run record JSON of this run"
    )
    source = parser.add_mutually_exclusive_group(required=baseline_required)
    source.add_argument("--baseline", metavar="RECORD", help="run record JSON to compare against")
    source.add_argument(
        "--history",
        metavar="DIR",
        help="folder of earlier run records: the latest is the baseline; all feed flaky "
        "detection and trends (a missing folder is an empty history)",
    )
    parser.add_argument(
        "--selection",
        metavar="JSON",
        help="output of `python -m attngroup.ci select --json` for this run",
    )
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        type=_threshold_override,
        metavar="REGEX=FRACTION",
        help="regression threshold for metrics whose name matches REGEX (first match wins)",
    )
    parser.add_argument(
        "--default-threshold",
        type=_fraction,
        default=DEFAULT_THRESHOLD,
        metavar="FRACTION",
        help=f"threshold for other metrics without their own (default {DEFAULT_THRESHOLD:.0%}%)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="compare records of different kinds (a pytest run with a benchmark baseline), "
        "which is refused otherwise",
    )


EXIT_STATUS = (
    "exit status: 0 ok; 1 the check found a problem (compare: a regression); "
    "2 bad input or environment (a missing or invalid record, an unwritable output)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attngroup.reports", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="write the self-contained HTML report")
    _add_common(build, baseline_required=False)
    build.add_argument("-o", "--output", required=True, metavar="HTML", help="report file to write")
    build.set_defaults(handler=_build)
    compare = commands.add_parser("compare", help="summarize changes; exit 1 on a regression")
    _add_common(compare, baseline_required=True)
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")
    compare.set_defaults(handler=_compare)
    archive = commands.add_parser("archive", help="add a run record to a history folder")
    archive.add_argument("--run", required=True, metavar="RECORD", help="run record JSON to add")
    archive.add_argument("--history", required=True, metavar="DIR", help="history folder")
    archive.add_argument(
        "--keep",
        type=_positive_int,
        default=DEFAULT_KEEP,
        help=f"archived runs to keep, oldest dropped first (default {DEFAULT_KEEP})",
    )
    archive.set_defaults(handler=_archive)
    for command in (parser, *commands.choices.values()):
        command.epilog = EXIT_STATUS
    return parser


def _load_inputs(args: argparse.Namespace) -> Inputs:
    run = load_record(args.run)
    history = History()
    if args.history is not None:
        history = load_history(args.history)
        if not args.force:
            history = history.of_kind(run.kind)
        baseline = latest_baseline(history.records, run)
        if baseline is None:
            print(
                f"note: no earlier run in {args.history!r}; nothing to compare with",
                file=sys.stderr,
            )
    else:
        baseline = load_record(args.baseline) if args.baseline else None
    kinds_differ = baseline is not None and baseline.kind != run.kind
    if baseline is not None and kinds_differ and not args.force:
        raise RecordError(
            f"run {args.run!r} is a {run.kind} record but baseline {baseline.source!r} is a "
            f"{baseline.kind} record: their tests and metrics are not comparable "
            "(pass --force to compare them anyway)"
        )
    selection = load_selection(args.selection) if args.selection else None
    thresholds = ThresholdPolicy(default=args.default_threshold, overrides=tuple(args.threshold))
    comparison = compare_runs(run, baseline, history.records, selection, thresholds)
    warnings = [f"history file left out: {line}" for line in history.skipped]
    if baseline is not None and kinds_differ:
        warnings.append(f"a {run.kind} run compared with a {baseline.kind} baseline (--force)")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    comparison = dataclasses.replace(comparison, warnings=(*warnings, *comparison.warnings))
    return Inputs(run, baseline, history, selection, comparison)


def _build(args: argparse.Namespace) -> int:
    check_output_path(args.output)  # before any work: a bad path is refused at once
    inputs = _load_inputs(args)
    html = render_report(inputs.comparison, inputs.history, inputs.selection)
    path = write_text_atomic(args.output, html)
    comparison = inputs.comparison
    print(
        f"wrote {path}: {len(comparison.new_failures)} new failures, "
        f"{len(comparison.metric_regressions)} metric regressions, "
        f"{len(comparison.harness_errors)} harness errors"
    )
    return EXIT_OK


def _compare(args: argparse.Namespace) -> int:
    comparison = _load_inputs(args).comparison
    if args.json:
        print(json.dumps(comparison.to_json(), indent=1))
    else:
        print(format_summary(comparison))
    return EXIT_REGRESSION if comparison.has_regression else EXIT_OK


def _archive(args: argparse.Namespace) -> int:
    path = archive_run(load_record(args.run), args.history, keep=args.keep)
    print(f"archived {args.run} as {path}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (RecordError, OutputPathError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
