"""The verdict timeline across vLLM trees: pairs x (releases, then checkouts), one table and
one HTML page.

``run`` judges each release in its own cached venv (``vllm_releases``) and each
``--source`` tree (a git checkout of main or of a branch) in its own venv with vLLM
installed editable (``vllm_checkout``), with ``vllm_verdicts``; it writes
``verdicts-<release>.json``, ``verdicts-checkout-<id>.json``, ``timeline.md`` and
``timeline.html`` under ``--out``; ``render`` redraws them from verdict files. Each cell
is the verdict on the runner vLLM used (or the one asked for), with its first failing
check, message and the vLLM line that makes it true; a cell whose verdict differs from
the column before is marked (a checkout's against the newest release judged), with the
upstream PR where the project knows it.

    python -m attngroup.suites.grouping.vllm_timeline run --versions 0.22.1..0.34.0
    python -m attngroup.suites.grouping.vllm_timeline run --source ~/src/vllm     # 0.34.0, then the tree
    python -m attngroup.suites.grouping.vllm_timeline render out/vllm/verdicts-*.json

Exit status: 0; 1 when a checkout fails a pair (the change breaks a model pair); 2 for bad
input; 3 when any cell is an adapter error (everything is still written, so the error can
be read in the table)."""

from __future__ import annotations

import argparse
import html
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attngroup.reports.atomic import write_text_atomic
from attngroup.suites.engines.verdict_states import (
    ADAPTER_ERROR,
    ADAPTER_ERROR_EXIT,
    FAIL,
    PASS,
    RUNNER_CHOICES,
    VERDICTS,
)
from attngroup.suites.engines.vllm_checkout import (
    CheckoutSpecError,
    SourceSpec,
    build_checkout_venv,
    materialize,
)
from attngroup.suites.engines.vllm_releases import (
    REPO_ROOT,
    ReleaseSpecError,
    build_release_venv,
    default_versions,
    parse_versions,
    version_key,
)

MESSAGE_LIMIT = 160
EXIT_STATUS = (
    "exit status: 0 ok; 1 a --source checkout fails a pair; 2 bad input (a version or tree "
    "that names nothing, a foreign verdict file); 3 an adapter error (the harness failed)"
)
#: Upstream changes the project knows, by the verdict change they cause: (check
#: before, check after) -> PR; ``None`` is a pass.
KNOWN_CHANGES: dict[tuple[str | None, str | None], tuple[str, ...]] = {
    # AttentionGroupKey gains num_heads_q (#43543) while the per-group head-count helper
    # goes (#43241): groups split, builders read the model-wide count.
    ("start-up", "builder heads"): ("#43543", "#43241"),
    ("start-up", None): ("#43543",),
    (None, "builder heads"): ("#43241",),
    ("builder heads", None): ("#47039",),  # the helper restored
}
PR_URL = "https://github.com/vllm-project/vllm/pull/{number}"


class VerdictFileError(ValueError):
    """A verdict file is missing or not one ``vllm_verdicts`` wrote."""


@dataclass(frozen=True)
class Cell:
    """One pair on one release."""

    result: dict
    changed: bool  # differs from the previous release's verdict (not on the first)
    prs: tuple[str, ...]  # the upstream PRs known to cause the change

    @property
    def verdict(self) -> str:
        return self.result["verdict"]

    @property
    def check(self) -> str | None:
        return self.result.get("check") if self.verdict == FAIL else None


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise VerdictFileError(f"{path}: not a readable verdict file ({error})") from None
    if not isinstance(data, dict) or not {"vllm", "runner", "pairs"} <= data.keys():
        raise VerdictFileError(f"{path}: expected keys vllm, runner, pairs")
    checkout = data.get("checkout")
    if checkout is not None and not (
        isinstance(checkout, dict) and isinstance(checkout.get("label"), str)
    ):
        raise VerdictFileError(f"{path}: checkout must be an object with a label")
    for pair, result in data["pairs"].items():
        if not isinstance(result, dict) or result.get("verdict") not in VERDICTS:
            raise VerdictFileError(f"{path}: pair {pair}: verdict is not one of {VERDICTS}")
    return data


def _state(result: dict) -> tuple[str, str | None]:
    return result["verdict"], result.get("check") if result["verdict"] == FAIL else None


def column(verdict_set: dict) -> str:
    """A verdict set's column heading: ``vLLM <release>``, or its checkout's label."""
    checkout = verdict_set.get("checkout")
    return checkout["label"] if checkout else f"vLLM {verdict_set['vllm']}"


def ordered(verdict_sets: Sequence[dict]) -> list[dict]:
    """Releases oldest first, then checkouts in the order given: a checkout's cells are
    marked where they differ from the newest release judged (or the checkout before)."""
    releases = sorted(
        (v for v in verdict_sets if not v.get("checkout")), key=lambda v: version_key(v["vllm"])
    )
    return releases + [v for v in verdict_sets if v.get("checkout")]


def timeline(verdict_sets: Sequence[dict]) -> tuple[list[str], list[str], dict]:
    """(columns: releases oldest first, then checkouts; pairs; {(pair, column): Cell})."""
    ordered_sets = ordered(verdict_sets)
    columns = [column(v) for v in ordered_sets]
    pairs = list(dict.fromkeys(name for v in ordered_sets for name in v["pairs"]))
    cells: dict[tuple[str, str], Cell] = {}
    for pair in pairs:
        previous: tuple[str, str | None] | None = None
        for data in ordered_sets:
            result = data["pairs"].get(pair)
            if result is None:
                continue
            state = _state(result)
            changed = previous is not None and state != previous
            prs: tuple[str, ...] = ()
            # Known PRs explain changes between releases; a checkout's change is its own.
            if (
                previous is not None
                and changed
                and not data.get("checkout")
                and {previous[0], state[0]} <= {PASS, FAIL}
            ):
                prs = KNOWN_CHANGES.get((previous[1], state[1]), ())
            cells[(pair, column(data))] = Cell(result, changed, prs)
            previous = state
    return columns, pairs, cells


def _short(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."


def markdown_cell(cell: Cell | None) -> str:
    if cell is None:
        return "n/a"
    result = cell.result
    runner = result.get("runner", "?")
    if cell.verdict == PASS:
        text = f"pass ({runner})"
    elif cell.verdict == FAIL:
        message = _short(result["message"]).replace("|", "\\|").replace("`", "'")
        text = f"**fail** ({runner}, tp{result['tp']}, {result['check']}): `{message}`"
        if result.get("source"):
            text += f" [{result['source']}]"
    elif cell.verdict == ADAPTER_ERROR:
        message = _short(result["message"]).replace("|", "\\|").replace("`", "'")
        text = f"**adapter error** ({runner}): `{message}`"
    else:
        text = f"unavailable ({runner})"
        if result.get("message"):
            message = _short(result["message"]).replace("|", "\\|").replace("`", "'")
            text += f": `{message}`"
    if cell.changed:
        text = "▶ " + text + (f" ({', '.join(cell.prs)})" if cell.prs else "")
    return text


def markdown_table(verdict_sets: Sequence[dict]) -> str:
    """Rows: pairs; columns: releases oldest first, then checkouts; ▶ marks a changed verdict."""
    columns, pairs, cells = timeline(verdict_sets)
    lines = [
        "| pair | " + " | ".join(columns) + " |",
        "|" + " --- |" * (len(columns) + 1),
    ]
    for pair in pairs:
        row = [markdown_cell(cells.get((pair, name))) for name in columns]
        lines.append(f"| {pair} | " + " | ".join(row) + " |")
    return "\n".join(lines)


_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}
th,td{border:1px solid #ccc;padding:4px 6px;vertical-align:top;max-width:16em}
td.pass{background:#e6f4ea}td.fail{background:#fce8e6}td.adapter-error{background:#fef7e0}
td.unavailable{background:#eee;color:#666}td.changed{outline:3px solid #1a73e8;outline-offset:-3px}
.detail{font-size:11px;color:#444;word-break:break-word}.legend span{margin-right:1em}
"""


def html_page(verdict_sets: Sequence[dict], title: str = "vLLM grouping verdicts") -> str:
    """A self-contained page: the same cells, coloured by state, changes outlined."""
    columns, pairs, cells = timeline(verdict_sets)
    escape = html.escape
    head = "".join(f"<th>{escape(name)}</th>" for name in columns)
    rows = []
    for pair in pairs:
        tds = []
        for name in columns:
            cell = cells.get((pair, name))
            if cell is None:
                tds.append("<td>n/a</td>")
                continue
            result = cell.result
            classes = [cell.verdict.replace(" ", "-")] + (["changed"] if cell.changed else [])
            label = cell.verdict + f" ({result.get('runner', '?')})"
            detail = ""
            if cell.verdict in (FAIL, ADAPTER_ERROR):
                where = f"tp{result.get('tp')}, {result.get('check', 'adapter')}"
                detail = f"<div class=detail>{escape(where)}: {escape(_short(result['message']))}"
                if result.get("source"):
                    detail += f"<br>at {escape(result['source'])}"
                detail += "".join(f"<br>{escape(f)}" for f in result.get("frames", ())) + "</div>"
            elif result.get("message"):  # unavailable: why the release has no runner for it
                detail = f"<div class=detail>{escape(_short(result['message']))}</div>"
            if cell.prs:
                links = ", ".join(
                    f'<a href="{escape(PR_URL.format(number=pr.lstrip("#")))}">{escape(pr)}</a>'
                    for pr in cell.prs
                )
                detail += f"<div class=detail>changed by {links}</div>"
            elif cell.changed:
                detail += "<div class=detail>changed here</div>"
            tds.append(f'<td class="{" ".join(classes)}"><b>{escape(label)}</b>{detail}</td>')
        rows.append(f"<tr><th>{escape(pair)}</th>{''.join(tds)}</tr>")
    seconds = sum(v.get("seconds", 0) for v in verdict_sets)
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
        "<p class=legend><span>pass / fail: vLLM's verdict on the runner named</span>"
        "<span>adapter error: the harness failed, no verdict</span>"
        "<span>outlined: the verdict differs from the column before</span></p>"
        f"<table><tr><th>pair</th>{head}</tr>{''.join(rows)}</table>"
        f"<p>{_judged(verdict_sets)}, judging took {seconds:.0f} s in all.</p></body></html>\n"
    )


def _judged(verdict_sets: Sequence[dict]) -> str:
    checkouts = sum(1 for v in verdict_sets if v.get("checkout"))
    counts = [(len(verdict_sets) - checkouts, "release"), (checkouts, "checkout")]
    return ", ".join(f"{n} {noun}{'s' if n != 1 else ''}" for n, noun in counts if n)


def checkout_failures(verdict_sets: Sequence[dict]) -> list[str]:
    """``<checkout label>: <pair>`` for every pair a checkout fails."""
    return [
        f"{v['checkout']['label']}: {pair}"
        for v in verdict_sets
        if v.get("checkout")
        for pair, result in v["pairs"].items()
        if result["verdict"] == FAIL
    ]


def has_adapter_errors(verdict_sets: Sequence[dict]) -> bool:
    return any(r["verdict"] == ADAPTER_ERROR for v in verdict_sets for r in v["pairs"].values())


def write_outputs(verdict_sets: Sequence[dict], out: Path) -> None:
    write_text_atomic(out / "timeline.md", markdown_table(verdict_sets) + "\n")
    write_text_atomic(out / "timeline.html", html_page(verdict_sets))


def _judge(python: Path, target: Path, runner: str, what: str, *options: str) -> Path:
    """``vllm_verdicts run`` with ``python`` (a release's or a checkout's venv)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "CUDA_VISIBLE_DEVICES": "",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    command = [str(python), "-m", "attngroup.suites.grouping.vllm_verdicts", "run", str(target)]
    result = subprocess.run([*command, "--runner", runner, *options], env=env, cwd=REPO_ROOT)
    if result.returncode not in (0, ADAPTER_ERROR_EXIT) or not target.exists():
        raise RuntimeError(f"{what}: the verdict run failed (exit {result.returncode})")
    return target


def judge_release(version: str, runner: str, out: Path) -> Path:
    """The release's verdicts, in its venv (built first unless cached)."""
    venv = build_release_venv(version)
    return _judge(venv.python, out / f"verdicts-{version}.json", runner, f"vLLM {version}")


def judge_checkout(spec: SourceSpec, tree: Path, runner: str, out: Path) -> Path:
    """A source tree's verdicts, in its venv (vLLM editable: the tree as it is now)."""
    venv = build_checkout_venv(tree)
    ref = ["--checkout-ref", spec.ref] if spec.ref else []
    target = out / f"verdicts-{venv.root.name}.json"
    return _judge(venv.python, target, runner, spec.text, "--checkout", str(tree), *ref)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attngroup.suites.grouping.vllm_timeline",
        description="The verdict timeline across vLLM releases and source trees.",
        epilog=EXIT_STATUS,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="judge releases and checkouts, then write the timeline", epilog=EXIT_STATUS
    )
    run.add_argument(
        "--versions",
        default=None,
        help=f"releases and ranges, or none (default {default_versions(False)}; "
        f"with --source {default_versions(True)})",
    )
    run.add_argument(
        "--source",
        action="append",
        default=[],
        help="a vLLM source tree to judge, or DIR@REF for one commit of it (repeatable)",
    )
    run.add_argument("--runner", choices=RUNNER_CHOICES, default="auto")
    run.add_argument("--out", type=Path, default=Path("out") / "vllm")
    render = commands.add_parser(
        "render", help="write the timeline of verdict files", epilog=EXIT_STATUS
    )
    render.add_argument("files", nargs="+", type=Path)
    render.add_argument("--out", type=Path, default=Path("out") / "vllm")
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            started = time.monotonic()
            versions = args.versions or default_versions(bool(args.source))
            releases = parse_versions(versions)
            specs = [SourceSpec.parse(text) for text in args.source]
            if not releases and not specs:
                raise ReleaseSpecError("--versions none and no --source: nothing to judge")
            trees = [materialize(spec) for spec in specs]  # bad trees and refs: before any build
            files = [judge_release(v, args.runner, args.out) for v in releases]
            files += [
                judge_checkout(spec, tree, args.runner, args.out)
                for spec, tree in zip(specs, trees, strict=True)
            ]
            print(f"judged in {time.monotonic() - started:.0f} s", file=sys.stderr)
        else:
            files = args.files
        verdict_sets = [load(path) for path in files]
    except (ReleaseSpecError, CheckoutSpecError, VerdictFileError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_outputs(verdict_sets, args.out)
    print(markdown_table(verdict_sets))
    if has_adapter_errors(verdict_sets):
        print("error: adapter errors (harness failures, not vLLM verdicts) above", file=sys.stderr)
        return ADAPTER_ERROR_EXIT
    failures = checkout_failures(verdict_sets)
    if failures:
        print("checkout fails: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
