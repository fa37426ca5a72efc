"""Conformance checks on an engine's grouping outcome.

Each check returns the list of violations it found (empty = conformant), so a
failing test prints every problem at once and the same checks serve the
example-based tests, the hypothesis properties and the vLLM verdicts. The
checks use the suite's own layer descriptions, never the engine's view of
them: an engine that loses a layer's head count cannot hide it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from attngroup.reference_engine.layers import LayerDescription
from attngroup.suites.engines.base import AttentionGroupView, GroupingOutcome

MIXED_HEADS_PREFIX = "AssertionError: All layers in one attention group must share num_heads; got "


def _groups(outcome: GroupingOutcome) -> list[AttentionGroupView]:
    return [group for per_kv in outcome.attention_groups for group in per_kv]


def check_started(outcome: GroupingOutcome) -> list[str]:
    """The engine must start: any start-up error is a violation."""
    return [f"engine start-up failed: {outcome.error}"] if outcome.error else []


def check_partition(outcome: GroupingOutcome, layers: Sequence[LayerDescription]) -> list[str]:
    """Every layer in exactly one KV-cache group and exactly one attention
    group, and the attention groups of a KV-cache group cover exactly it."""
    expected = Counter(layer.name for layer in layers)
    problems = []
    for what, names in (
        ("KV-cache group", [n for g in outcome.kv_cache_groups for n in g.layer_names]),
        ("attention group", [n for g in _groups(outcome) for n in g.layer_names]),
    ):
        seen = Counter(names)
        problems += [f"{name} is in {seen[name]} {what}s" for name in expected if seen[name] != 1]
        problems += [f"{what}s hold unknown layer {name}" for name in seen if name not in expected]
    if len(outcome.attention_groups) != len(outcome.kv_cache_groups):
        problems.append(
            f"{len(outcome.attention_groups)} rows of attention groups for "
            f"{len(outcome.kv_cache_groups)} KV-cache groups"
        )
    for kv_id, (kv_group, per_kv) in enumerate(
        zip(outcome.kv_cache_groups, outcome.attention_groups, strict=False)
    ):
        covered = sorted(n for g in per_kv for n in g.layer_names)
        if covered != sorted(kv_group.layer_names):
            problems.append(
                f"attention groups of KV-cache group {kv_id} do not cover exactly its layers"
            )
        problems += [
            f"attention group {list(g.layer_names)} says KV-cache group {g.kv_cache_group_id}, sits in {kv_id}"
            for g in per_kv
            if g.kv_cache_group_id != kv_id
        ]
    return problems


def check_homogeneity(outcome: GroupingOutcome, layers: Sequence[LayerDescription]) -> list[str]:
    """Backend, KV spec and query-head count are uniform inside every
    attention group (judged from the layer descriptions themselves)."""
    by_name = {layer.name: layer for layer in layers}
    problems = []
    for group in _groups(outcome):
        members = [by_name[n] for n in group.layer_names if n in by_name]
        heads = {layer.num_heads_q for layer in members}
        if len(heads) > 1:
            problems.append(
                f"attention group mixes query-head counts {sorted(heads)}: {list(group.layer_names)}"
            )
        backends = {layer.backend for layer in members}
        if len(backends) > 1:
            problems.append(
                f"attention group mixes backends {sorted(backends)}: {list(group.layer_names)}"
            )
        shapes = {(layer.num_kv_heads, layer.head_size, layer.sliding_window) for layer in members}
        if len(shapes) > 1:
            problems.append(
                f"attention group mixes KV shapes {sorted(shapes, key=str)}: {list(group.layer_names)}"
            )
    return problems


def check_minimality(outcome: GroupingOutcome) -> list[str]:
    """No two attention groups of one KV-cache group share a key."""
    problems = []
    for kv_id, per_kv in enumerate(outcome.attention_groups):
        keys = Counter((g.backend, g.kv_cache_spec, g.num_heads_q) for g in per_kv)
        problems += [
            f"KV-cache group {kv_id} has {count} attention groups with key {key[0]} / {key[2]} heads"
            for key, count in keys.items()
            if count > 1
        ]
    return problems


def check_builder_heads(outcome: GroupingOutcome, layers: Sequence[LayerDescription]) -> list[str]:
    """Every group's builders are sized for exactly its layers' head count."""
    by_name = {layer.name: layer for layer in layers}
    problems = []
    for group in _groups(outcome):
        if group.builder_error:
            problems.append(f"builders of {list(group.layer_names)} refused: {group.builder_error}")
            continue
        for name in group.layer_names:
            layer = by_name.get(name)
            if layer is not None and layer.num_heads_q != group.builder_num_heads:
                problems.append(
                    f"{name} has {layer.num_heads_q} query heads but its builders are sized for "
                    f"{group.builder_num_heads}"
                )
    return problems


def check_kv_sharing(outcome: GroupingOutcome, layers: Sequence[LayerDescription]) -> list[str]:
    """A KV-sharing layer sits in its target's KV-cache group and attention
    group spec (it reads the target's pages)."""
    group_of = {n: i for i, g in enumerate(outcome.kv_cache_groups) for n in g.layer_names}
    problems = []
    for layer in layers:
        target = layer.kv_sharing_target
        if target is not None and group_of.get(layer.name) != group_of.get(target):
            problems.append(
                f"{layer.name} reads {target}'s KV cache but sits in KV-cache group "
                f"{group_of.get(layer.name)}, not {group_of.get(target)}"
            )
    return problems


def conformance_violations(
    outcome: GroupingOutcome, layers: Sequence[LayerDescription]
) -> list[str]:
    """All checks at once, in the order a reader wants them."""
    return (
        check_started(outcome)
        + check_partition(outcome, layers)
        + check_homogeneity(outcome, layers)
        + check_minimality(outcome)
        + check_builder_heads(outcome, layers)
        + check_kv_sharing(outcome, layers)
    )


def expected_mixed_heads_error(
    outcome: GroupingOutcome, layers: Sequence[LayerDescription]
) -> str | None:
    """The exact error vLLM's strict check raises for the first attention
    group that mixes head counts, or None when no group does."""
    by_name = {layer.name: layer for layer in layers}
    for group in _groups(outcome):
        attention = [by_name[n] for n in group.layer_names if by_name[n].is_attention]
        heads = {layer.num_heads_q for layer in attention}
        if len(heads) > 1:
            # vLLM prints the set it built in layer order; so do we.
            return f"{MIXED_HEADS_PREFIX}{heads} for {[layer.name for layer in attention]}."
    return None


Check = Callable[[GroupingOutcome, Sequence[LayerDescription]], list[str]]

#: The checks by name, in the order a reader wants the first failure.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("start-up", lambda outcome, layers: check_started(outcome)),
    ("partition", check_partition),
    ("homogeneity", check_homogeneity),
    ("minimality", lambda outcome, layers: check_minimality(outcome)),
    ("builder heads", check_builder_heads),
    ("kv sharing", check_kv_sharing),
)


def first_violation(outcome: GroupingOutcome, layers: Sequence[LayerDescription]) -> dict | None:
    """None when every check passes, else the first failing check's name and first message."""
    for name, check in CHECKS:
        problems = check(outcome, layers)
        if problems:
            return {"check": name, "message": problems[0]}
    return None
