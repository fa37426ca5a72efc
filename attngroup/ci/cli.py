"""``python -m attngroup.ci``: select, pipeline, check-deps and lint.

Exit codes: 0 success, 1 dependency gaps found (``check-deps``), 2 bad input of any kind
(configuration, arguments, environment knobs). Nothing is written when the exit code is 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from attngroup.ci.areas.config import RunConfig, TestAreas, load_run_config
from attngroup.ci.areas.lint import lint_warnings
from attngroup.ci.areas.load import load_test_areas
from attngroup.ci.atomic_write import check_writable_target, write_atomically
from attngroup.ci.deps.baseline import load_baseline, only_new, write_baseline
from attngroup.ci.deps.checker import DependencyChecker, suggested_entries
from attngroup.ci.deps.fix import add_dependencies
from attngroup.ci.deps.parse_cache import default_cache_dir
from attngroup.ci.deps.report import (
    format_missed,
    format_ran_this_code,
    format_report,
    missed_json,
    ran_this_code_json,
    report_json,
    unparsed_json,
    unparsed_warnings,
)
from attngroup.ci.deps.runtime_coverage import LineTests
from attngroup.ci.errors import CIInputError
from attngroup.ci.selection.changes import ChangeSet, changed_lines, compute_changes
from attngroup.ci.selection.pipeline import build_pipeline, checked_uploads
from attngroup.ci.selection.select_steps import Knobs, Selection, select_steps

DEFAULT_CONFIG = ".buildkite/ci_config.yaml"
EXIT_OK = 0
EXIT_GAPS = 1
EXIT_BAD_INPUT = 2


def _flag(name: str) -> bool:
    value = os.environ.get(name, "")
    if value not in ("", "0", "1"):
        raise CIInputError(f"environment variable {name} must be 0 or 1, got {value!r}")
    return value == "1"


def knobs_from_environment() -> Knobs:
    """RUN_ALL, NIGHTLY, DOCS_ONLY_DISABLE (0/1) and ONLY_STEP_KEYS (JSON list or a,b,c)."""
    only = os.environ.get("ONLY_STEP_KEYS", "").strip()
    only_keys = None
    if only:
        if only.startswith("["):
            try:
                only_keys = json.loads(only)
            except json.JSONDecodeError as error:
                raise CIInputError(f"ONLY_STEP_KEYS is not a JSON list: {error}") from None
            if not all(isinstance(key, str) for key in only_keys):
                raise CIInputError("ONLY_STEP_KEYS must list step keys (strings)")
        else:
            only_keys = [key.strip() for key in only.split(",") if key.strip()]
        only_keys = tuple(only_keys)
    return Knobs(
        run_all=_flag("RUN_ALL"),
        nightly=_flag("NIGHTLY"),
        only_step_keys=only_keys,
        docs_only_disable=_flag("DOCS_ONLY_DISABLE"),
    )


def _git_top_level() -> Path:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        return Path.cwd()
    return Path(found.stdout.strip()) if found.returncode == 0 else Path.cwd()


def _config_path(given: str | None, repo: Path | None) -> Path:
    """``--config`` as given (relative to the cwd, else to ``--repo``), or the default."""
    if given is None:
        return (repo or _git_top_level()) / DEFAULT_CONFIG
    path = Path(given)
    if not path.is_absolute() and not path.exists() and repo is not None:
        path = repo / path
    if path.is_dir():
        raise CIInputError(f"run configuration {given} is a directory; pass its ci_config.yaml")
    if not path.is_file():
        raise CIInputError(f"run configuration {path} does not exist (use --config)")
    return path.resolve()


def _root_for(config_path: Path, config: RunConfig) -> Path:
    """The nearest directory above the configuration that holds every job_dirs entry.

    vLLM and this project both keep ``.buildkite/ci_config.yaml`` with
    ``job_dirs: [.buildkite/test_areas]``: the root is the folder above ``.buildkite/``.
    """
    for directory in config_path.parents:
        if all((directory / job_dir).is_dir() for job_dir in config.job_dirs):
            return directory
    return _git_top_level()


def _load(args: argparse.Namespace) -> tuple[Path, RunConfig, TestAreas]:
    repo = None
    if args.repo:
        repo = Path(args.repo)
        if not repo.is_dir():
            raise CIInputError(f"--repo {args.repo!r} is not a directory")
        repo = repo.resolve()
    config_path = _config_path(args.config, repo)
    try:
        display = config_path.relative_to(repo or Path.cwd().resolve()).as_posix()
    except ValueError:
        display = str(config_path)
    config = load_run_config(config_path, display)
    root = repo or _root_for(config_path, config)
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    areas = load_test_areas(config, root)
    for warning in areas.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return root, config, areas


def _changes(args: argparse.Namespace, root: Path) -> ChangeSet:
    return compute_changes(
        root,
        args.base,
        args.head,
        args.include_untracked,
        os.environ.get("MERGE_BASE_COMMIT") or None,
    )


def _selection(
    args: argparse.Namespace, root: Path, config: RunConfig, areas: TestAreas
) -> Selection:
    knobs = knobs_from_environment()
    if getattr(args, "all", False):
        knobs = dataclasses.replace(knobs, run_all=True)
    if args.base is None:
        if not knobs.run_all:
            raise CIInputError("missing base ref: pass --base REF (or --all to select every step)")
        return select_steps(areas, config, ChangeSet("-", "-", None, ()), knobs)
    changes = _changes(args, root)
    if not changes.known:
        print(f"warning: selecting every step: {changes.unavailable_reason}", file=sys.stderr)
    return select_steps(areas, config, changes, knobs)


def _explain(selection: Selection) -> str:
    lines = [
        f"base: {selection.base}  head: {selection.head}",
        f"decision: {selection.reason}",
        f"changed files ({len(selection.changed_files)}):",
    ]
    lines.extend(f"  {path}" for path in selection.changed_files)
    for decision in selection.decisions:
        lines.append(f"[{'run' if decision.selected else 'skip'}] {decision.key}: {decision.label}")
        lines.extend(f"      {why}" for why in decision.why)
    selected = sum(decision.selected for decision in selection.decisions)
    lines.append(f"{selected} of {len(selection.decisions)} steps selected")
    return "\n".join(lines)


def command_select(args: argparse.Namespace) -> int:
    root, config, areas = _load(args)
    selection = _selection(args, root, config, areas)
    if args.json:
        print(json.dumps(selection.to_json(), indent=2))
    elif args.explain:
        print(_explain(selection))
    else:
        for decision in selection.decisions:
            if decision.selected:
                print(decision.key)
    return 0


def _render(document: dict, output_format: str) -> str:
    if output_format == "json":
        return json.dumps(document, indent=2) + "\n"
    return yaml.safe_dump(document, sort_keys=False, width=4096)


def command_pipeline(args: argparse.Namespace) -> int:
    if args.output is not None:
        check_writable_target(Path(args.output))
    root, config, areas = _load(args)
    selection = _selection(args, root, config, areas)
    uploads = checked_uploads(build_pipeline(areas, selection, config, args.unselected))
    texts = [_render(upload, args.format) for upload in uploads]
    if args.output is None:
        if len(texts) > 1:
            raise CIInputError(
                f"the pipeline needs {len(texts)} uploads of at most 500 steps; "
                "pass --output PATH to write one file each"
            )
        sys.stdout.write(texts[0])
        return 0
    output = Path(args.output)
    names = [output] + [
        output.with_name(f"{output.stem}.{index}{output.suffix}")
        for index in range(2, len(texts) + 1)
    ]
    for name, text in zip(names, texts, strict=True):
        write_atomically(name, text)
        print(f"wrote {name}", file=sys.stderr)
    return 0


def _warn_unparsed(checker: DependencyChecker) -> None:
    for warning in unparsed_warnings(checker.graph):
        print(f"warning: {warning}", file=sys.stderr)


def command_check_deps(args: argparse.Namespace) -> int:
    if args.coverage and args.base is None:
        raise CIInputError("--coverage needs --base REF: it maps the changed lines to tests")
    root, config, areas = _load(args)
    baseline = load_baseline(Path(args.baseline)) if args.baseline else None
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir(root)
    checker = DependencyChecker(areas, config, root, cache_dir=cache)
    if args.base is not None:
        selection = _selection(args, root, config, areas)
        missed = checker.missed_triggers(selection)
        if baseline is not None:
            missed = [
                dataclasses.replace(item, known=baseline.covers_gap(item.key, item.path))
                for item in missed
            ]
        _warn_unparsed(checker)
        document = missed_json(missed, selection, checker.graph) | {
            "unparsed_files": unparsed_json(checker.graph)
        }
        text = [format_missed(missed, selection, checker.graph, args.verbose)]
        if args.coverage:
            line_tests = LineTests(Path(args.coverage), root)
            ran = checker.ran_this_code(
                selection, line_tests, changed_lines(root, _changes(args, root))
            )
            document["ran_this_code"] = ran_this_code_json(ran)
            document["ok"] = document["ok"] and all(item.selected for item in ran)
            text.insert(0, "\n".join(format_ran_this_code(ran, args.coverage, args.verbose)))
        print(json.dumps(document, indent=1) if args.json else "\n".join(text))
        return 0 if document["ok"] else EXIT_GAPS
    report = checker.check_all()
    if args.fix:
        additions: dict[str, dict[str, list[str]]] = defaultdict(dict)
        steps = areas.by_key()
        for step_report in report.steps:
            entries = suggested_entries(step_report)
            if entries:
                additions[steps[step_report.key].file][step_report.key] = entries
        for file, per_step in additions.items():
            for added in add_dependencies(root / file, per_step):
                print(f"fixed {file}: {added}")
        if additions:
            _, config, areas = _load(args)
            checker = DependencyChecker(areas, config, root, checker.graph, cache)
            report = checker.check_all()
    if args.write_baseline:
        write_baseline(Path(args.write_baseline), report)
        print(f"wrote {args.write_baseline}", file=sys.stderr)
        return 0
    if baseline is not None:
        report = only_new(report, baseline)
    _warn_unparsed(checker)
    if args.json:
        print(json.dumps(report_json(report, checker.graph), indent=1))
    else:
        print(format_report(report, checker.graph, args.verbose))
    return 0 if report.ok else EXIT_GAPS


def command_lint(args: argparse.Namespace) -> int:
    _, config, areas = _load(args)
    warnings = lint_warnings(config, areas)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    count = len(warnings) + len(areas.warnings)
    if args.strict and count:
        raise CIInputError(f"{count} warnings with --strict (see above)")
    everything = ChangeSet(base="HEAD", head="HEAD", merge_base=None, files=())
    selection = select_steps(areas, config, everything, Knobs(run_all=True))
    uploads = checked_uploads(build_pipeline(areas, selection, config, "block"))
    print(
        f"{len(areas.steps)} steps in {len(areas.files)} files: valid; "
        f"pipeline passes Buildkite's schema in {len(uploads)} upload(s)"
    )
    return 0


EXIT_STATUS = (
    "exit status: 0 ok; 1 the check found a problem (lint errors, missing dependencies); "
    "2 bad input or environment (a missing or invalid file, an unknown git ref)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attngroup.ci", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--config", help=f"run configuration (default: {DEFAULT_CONFIG})")
        sub.add_argument("--repo", help="repository root (default: git top level of the cwd)")

    def diff_options(sub: argparse.ArgumentParser, base_required: bool) -> None:
        sub.add_argument("--base", required=base_required, help="base ref; the merge base is used")
        sub.add_argument("--head", help="head ref (default: the working tree)")
        sub.add_argument(
            "--include-untracked", action="store_true", help="count untracked files as changed"
        )

    select = commands.add_parser("select", help="which steps a change runs, and why")
    common(select)
    diff_options(select, base_required=True)
    select.add_argument("--explain", action="store_true", help="the rule behind each decision")
    select.add_argument("--json", action="store_true", help="machine-readable selection")
    select.set_defaults(handler=command_select)

    pipeline = commands.add_parser("pipeline", help="the Buildkite pipeline for a change")
    common(pipeline)
    diff_options(pipeline, base_required=False)
    pipeline.add_argument("--all", action="store_true", help="select every step (no diff)")
    pipeline.add_argument("--format", choices=("yaml", "json"), default="yaml")
    pipeline.add_argument(
        "--unselected",
        choices=("block", "omit"),
        default="block",
        help="unselected steps behind a block step, or left out",
    )
    pipeline.add_argument("--output", help="write here instead of stdout")
    pipeline.set_defaults(handler=command_pipeline)

    check = commands.add_parser("check-deps", help="find undeclared step dependencies")
    common(check)
    check.add_argument("--fix", action="store_true", help="add the missing entries to the YAML")
    check.add_argument("--json", action="store_true")
    check.add_argument("--base", help="change mode: unselected steps that import a changed file")
    check.add_argument("--head", help="head ref for --base (default: the working tree)")
    check.add_argument(
        "--include-untracked", action="store_true", help="count untracked files as changed"
    )
    check.add_argument(
        "--coverage",
        metavar="FILE",
        help="with --base: coverage.py data with per-test contexts "
        "(pytest --cov --cov-context=test); steps whose tests ran a changed line come first",
    )
    check.add_argument("--baseline", help="fail only on findings this baseline does not record")
    check.add_argument("--write-baseline", metavar="FILE", help="record today's findings")
    check.add_argument("--cache-dir", help="parse cache (default: ~/.cache/attention-grouping-ci)")
    check.add_argument("-v", "--verbose", action="store_true", help="also list ignored paths")
    check.set_defaults(handler=command_check_deps)

    lint = commands.add_parser("lint", help="validate test areas and the emitted pipeline")
    common(lint)
    lint.add_argument("--strict", action="store_true", help="warnings are errors")
    lint.set_defaults(handler=command_lint)
    for command in (parser, *commands.choices.values()):
        command.epilog = EXIT_STATUS
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except CIInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader (``| head``) has what it wanted: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return EXIT_OK
