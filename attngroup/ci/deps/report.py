"""check-deps output: short, ranked text for people and bounded JSON for tools.

A whole-repository run on vLLM finds thousands of gaps; listing them all (the old report: 105
to 210 MB) buries the finding. The report leads with what a maintainer can act on as it stands,
declared entries that match no file (at their YAML line) and tests no step runs; then it ranks
steps by gap count and, per step, the entries to add by how many gaps each covers, with one
import chain as evidence; JSON carries counts and entries, never one record per gap, so it
stays small.
"""

from __future__ import annotations

import itertools
from collections import Counter

from attngroup.ci.deps.checker import (
    COVERED,
    TIER_NAMED,
    TIER_STATIC,
    TIER_WEAK,
    TIERS,
    DependencyReport,
    MissedTrigger,
    StepReport,
    example_chain,
)
from attngroup.ci.deps.imports import REGISTRY, STATIC, ImportGraph
from attngroup.ci.deps.runtime_coverage import RanThisCode
from attngroup.ci.selection.select_steps import Selection

TOP_STEPS = 10  # steps shown in detail without --verbose
TOP_ENTRIES = 3  # entries to add shown per step without --verbose
JSON_ENTRIES = 25  # entries to add per step in --json (the rest are counted)
TOP_DEAD = 8  # declared entries that match no file shown without --verbose
GROUP_KEYS = 3  # step keys named per chain group or dead entry without -v


def _kinds(step: StepReport) -> str:
    static = sum(gap.kind == STATIC for gap in step.gaps)
    return f"{static} static, {len(step.gaps) - static} registry"


def _ranked(report: DependencyReport) -> list[StepReport]:
    """Failing steps, most tier-(a) gaps first, then most gaps."""
    failing = [step for step in report.steps if not step.ok]
    return sorted(failing, key=lambda step: (-step.tier_a_gaps, -len(step.gaps), step.key))


def dead_entries(report: DependencyReport) -> list[tuple[str, str, list[str]]]:
    """(YAML ``file:line``, entry, step keys) for each declared entry that matches no file,
    in file and line order: a step with one never runs for the change its author meant
    (mirrors repeat their parent's entries at the same line, so they group there)."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for step in report.steps:
        for entry in step.missing_declared:
            grouped.setdefault((step.where_declared(entry), entry), []).append(step.key)

    def order(item: tuple[tuple[str, str], list[str]]) -> tuple[str, int, str]:
        (location, entry), _ = item
        file, _, line = location.rpartition(":")
        return (file, int(line) if line.isdigit() else 0, entry)

    return [
        (location, entry, keys) for (location, entry), keys in sorted(grouped.items(), key=order)
    ]


def _dead_entry_lines(report: DependencyReport, verbose: bool) -> list[str]:
    dead = dead_entries(report)
    steps = len({key for _, _, keys in dead for key in keys})
    lines = [f"declared paths that match no file: {len(dead)} entries in {steps} steps"]
    for location, entry, keys in dead if verbose else dead[:TOP_DEAD]:
        shown = keys if verbose else keys[:GROUP_KEYS]
        more = f" and {len(keys) - len(shown)} more" if len(keys) > len(shown) else ""
        lines.append(f"  {location}: {entry} ({', '.join(shown)}{more})")
    if len(dead) > TOP_DEAD and not verbose:
        lines.append(f"  ... {len(dead) - TOP_DEAD} more entries (-v or --json lists all)")
    return lines


def _orphan_lines(report: DependencyReport, verbose: bool) -> list[str]:
    orphans = report.orphan_tests if verbose else report.orphan_tests[:TOP_STEPS]
    lines = [f"tests run by no step: {len(report.orphan_tests)}"]
    lines.extend(f"  {orphan}" for orphan in orphans)
    if len(report.orphan_tests) > len(orphans):
        lines.append(
            f"  ... {len(report.orphan_tests) - len(orphans)} more (-v or --json lists all)"
        )
    return lines


def format_report(report: DependencyReport, graph: ImportGraph, verbose: bool = False) -> str:
    """Summary line, then what is actionable as it stands: declared entries that match no file
    (at their YAML line), tests no step runs; only then the failing steps ranked by gap count
    with the entries that would cover the most gaps."""
    ranked = _ranked(report)
    gaps = [gap for step in report.steps for gap in step.gaps]
    static = sum(gap.kind == STATIC for gap in gaps)
    lines = [
        f"check-deps: {len(report.steps)} steps, {len(ranked)} failing; {len(gaps)} gaps "
        f"({static} static, {len(gaps) - static} registry); {len(report.orphan_tests)} tests "
        f"run by no step; {report.modules_indexed} modules indexed"
        + (f"; {report.known} known findings in the baseline" if report.known else "")
    ]
    lines.extend(_dead_entry_lines(report, verbose))
    lines.extend(_orphan_lines(report, verbose))
    with_gaps = [step for step in ranked if step.gaps or step.problems]
    lines.append(
        f"steps with gaps, most tier-(a) gaps (imported on the step's device) first: {len(with_gaps)}"
    )
    shown = with_gaps if verbose else with_gaps[:TOP_STEPS]
    for step in shown:
        lines.append(
            f"[FAIL] {step.key} ({step.location}): {len(step.gaps)} gaps ({_kinds(step)}; "
            f"{step.tier_a_gaps} tier a)"
        )
        entries = step.entries_to_add()
        for position, (entry, count, kind, tier_a, direct) in enumerate(
            entries if verbose else entries[:TOP_ENTRIES]
        ):
            lines.append(
                f"    add {entry!r}: covers {count} {kind} gaps ({tier_a} tier a, "
                f"{direct} imported by its tests)"
            )
            if position == 0:
                lines.append(f"        {graph.format_chain(example_chain(graph, step, entry))}")
        if len(entries) > TOP_ENTRIES and not verbose:
            transitive = sum(not item.direct for item in entries[TOP_ENTRIES:])
            lines.append(
                f"    ... {len(entries) - TOP_ENTRIES} more entries, {transitive} of them reached "
                "only through other modules (-v lists all)"
            )
        lines.extend(f"    problem: {problem}" for problem in step.problems)
        if verbose:
            lines.extend(f"    ignored: {path} ({reason})" for path, reason in step.ignored)
    if len(with_gaps) > len(shown):
        rest = with_gaps[len(shown) :]
        lines.append(
            f"... {len(rest)} more steps with {sum(len(s.gaps) for s in rest)} gaps "
            "(-v or --json lists them)"
        )
    lines.extend(f"warning: ignore entry matches nothing: {item}" for item in report.stale_ignores)
    lines.append("no dependency gaps" if report.ok else "dependency check FAILED")
    return "\n".join(lines)


def report_json(report: DependencyReport, graph: ImportGraph) -> dict:
    """Counts and the top ranked entries per step (an example chain for the first), never one
    record per gap: about 1 MB for vLLM's 316 steps and 400,000 gaps."""
    steps = []
    for step in sorted(
        report.steps, key=lambda step: (-step.tier_a_gaps, -len(step.gaps), step.key)
    ):
        static = sum(gap.kind == STATIC for gap in step.gaps)
        entries = step.entries_to_add()
        steps.append(
            {
                "key": step.key,
                "location": step.location,
                "ok": step.ok,
                "test_files": len(step.test_files),
                "reachable": step.reachable,
                "gaps": {STATIC: static, REGISTRY: len(step.gaps) - static},
                "add": [
                    {
                        "entry": entry,
                        "gaps": count,
                        "kind": kind,
                        "tier_a": tier_a,
                        "imported_by_tests": direct,
                    }
                    | ({"example": list(example_chain(graph, step, entry))} if not index else {})
                    for index, (entry, count, kind, tier_a, direct) in enumerate(
                        entries[:JSON_ENTRIES]
                    )
                ],
                "more_entries": max(len(entries) - JSON_ENTRIES, 0),
                "missing_declared": list(step.missing_declared),
                "problems": list(step.problems),
                "ignored": [{"path": path, "reason": reason} for path, reason in step.ignored],
            }
        )
    gaps = [gap for step in report.steps for gap in step.gaps]
    return {
        "ok": report.ok,
        "summary": {
            "steps": len(report.steps),
            "failing_steps": len(_ranked(report)),
            "gaps": {
                STATIC: sum(gap.kind == STATIC for gap in gaps),
                REGISTRY: sum(gap.kind == REGISTRY for gap in gaps),
            },
            "modules_indexed": report.modules_indexed,
            "known_in_baseline": report.known,
        },
        "missing_declared": [
            {"location": location, "entry": entry, "steps": keys}
            for location, entry, keys in dead_entries(report)
        ],
        "steps": steps,
        "orphan_tests": list(report.orphan_tests),
        "stale_ignores": list(report.stale_ignores),
        "unparsed_files": unparsed_json(graph),
    }


def unparsed_warnings(graph: ImportGraph) -> list[str]:
    """One named warning per file check-deps could not parse: a syntax error or an unreadable file
    contributes no imports, so a gap through it would otherwise go unseen without a word."""
    return [
        f"unparsed-file: {path}: {error} (check-deps sees no imports in it)"
        for path, error in sorted(graph.parse_errors.items())
    ]


def unparsed_json(graph: ImportGraph) -> list[dict[str, str]]:
    return [{"path": path, "error": error} for path, error in sorted(graph.parse_errors.items())]


def format_ran_this_code(ran: list[RanThisCode], source: str, verbose: bool = False) -> list[str]:
    """The runtime tier, first: steps whose tests executed a changed line, one line each with
    the first test and changed line as evidence."""
    unselected = sum(not item.selected for item in ran)
    lines = [f"ran this code ({source}): {len(ran)} steps, {unselected} not selected"]
    for item in ran if verbose else ran[:TOP_STEPS]:
        tag = "selected" if item.selected else "MISSED"
        more = f" (+{len(item.tests) - 1} tests)" if len(item.tests) > 1 else ""
        lines.append(
            f"  [{tag}] {item.key} ({item.location}): {len(item.lines)} changed lines, "
            f"e.g. {item.lines[0]}, by {item.tests[0]}{more}"
        )
    if len(ran) > TOP_STEPS and not verbose:
        lines.append(f"  ... {len(ran) - TOP_STEPS} more steps (-v or --json lists all)")
    return lines


def ran_this_code_json(ran: list[RanThisCode]) -> list[dict]:
    return [
        {
            "step": item.key,
            "location": item.location,
            "selected": item.selected,
            "tests": list(item.tests),
            "lines": list(item.lines),
        }
        for item in ran
    ]


TIER_HEADINGS = {
    TIER_STATIC: "(a) its tests import it, on the step's device",
    TIER_NAMED: "(b) its tests or their helpers name the module, a class of it or its registry key",
    TIER_WEAK: "(c) only registry strings or function-local imports reach it",
}
TIER_GROUPS = {TIER_STATIC: 8, TIER_NAMED: 4, TIER_WEAK: 2}  # chain groups shown without -v


def _groups(items: list[MissedTrigger]) -> list[list[MissedTrigger]]:
    """Items with the same chain after the test file and the same entry to add, together;
    largest groups first."""
    grouped: dict[tuple, list[MissedTrigger]] = {}
    for item in sorted(items, key=lambda item: (len(item.chain), item.key)):
        grouped.setdefault((item.chain[1:], item.suggestion), []).append(item)
    return sorted(grouped.values(), key=lambda group: (-len(group), len(group[0].chain)))


def _group_lines(group: list[MissedTrigger], graph: ImportGraph, verbose: bool) -> list[str]:
    shown = group if verbose else group[:GROUP_KEYS]
    keys = ", ".join(f"{item.key} ({item.location})" for item in shown)
    more = f" and {len(group) - len(shown)} more" if len(group) > len(shown) else ""
    tag = "known" if all(item.known for item in group) else "MISSED"
    count = f"{len(group)} steps: " if len(group) > 1 else ""
    return [
        f"  [{tag}] {count}{keys}{more}: add {group[0].suggestion!r}",
        f"      {graph.format_chain(group[0].chain)}",
    ]


def format_missed(
    missed: list[MissedTrigger], selection: Selection, graph: ImportGraph, verbose: bool = False
) -> str:
    """The pull-request question, per changed file and tier: which unselected steps reach it,
    identical chains once with the number of steps behind them (-v lists every step); steps
    that already cover the file are counted as covered, never as missed."""
    new = [item for item in missed if not item.known and item.tier != COVERED]
    counts = Counter(item.tier for item in missed)
    lines = [
        f"check-deps --base {selection.base}: {len(selection.changed_files)} changed files; "
        f"{len({item.key for item in new})} unselected steps reach them ("
        + ", ".join(f"{tier}: {counts[tier]}" for tier in TIERS)
        + f"); {counts[COVERED]} already cover them"
    ]
    by_path: dict[str, list[MissedTrigger]] = {}
    for item in missed:
        by_path.setdefault(item.path, []).append(item)
    for path, items in by_path.items():
        lines.append(f"{path}:")
        for tier in TIERS:
            tier_items = [item for item in items if item.tier == tier]
            if not tier_items:
                continue
            lines.append(f" {TIER_HEADINGS[tier]}: {len(tier_items)} steps")
            groups = _groups(tier_items)
            for group in groups if verbose else groups[: TIER_GROUPS[tier]]:
                lines.extend(_group_lines(group, graph, verbose))
            if len(groups) > TIER_GROUPS[tier] and not verbose:
                hidden = sum(len(group) for group in groups[TIER_GROUPS[tier] :])
                lines.append(f"  ... {hidden} more steps by other chains (-v or --json lists all)")
        covered = [item for item in items if item.tier == COVERED]
        if covered:
            nightly = sum(item.nightly for item in covered)
            lines.append(
                f" covered: {len(covered)} steps already list an entry for it"
                + (f" ({nightly} covered, runs nightly)" if nightly else "")
            )
            if verbose:
                lines.extend(
                    f"  {item.key} ({item.location})"
                    + (": covered, runs nightly" if item.nightly else "")
                    for item in covered
                )
    lines.append("missed triggers FOUND" if new else "no missed triggers")
    return "\n".join(lines)


def missed_json(missed: list[MissedTrigger], selection: Selection, graph: ImportGraph) -> dict:
    return {
        "ok": not any(not item.known and item.tier != COVERED for item in missed),
        "base": selection.base,
        "changed_files": list(selection.changed_files),
        "missed": [
            {
                "step": item.key,
                "location": item.location,
                "path": item.path,
                "kind": item.kind,
                "chain": list(item.chain),
                "edges": [graph.edge_symbol(a, b) for a, b in itertools.pairwise(item.chain)],
                "tier": item.tier,
                "nightly": item.nightly,
                "add": item.suggestion,
                "known": item.known,
            }
            for item in missed
        ],
    }
