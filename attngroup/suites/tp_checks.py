"""Per-rank checks of tensor parallelism, shared by the runner and spec-decode suites.

Each rank describes its attention groups (``rank_groups``: plain data, so it
travels back from the rank process); the test compares every rank's with the
unsharded engine's (``rank_group_problems``): the same groups, each carrying
tp = 1's query heads divided by the TP size, its layers and every builder's
head-sized state (Triton's split-KV scratch, FlashInfer's plan) sized for
exactly that, and on FlashInfer builders the head guard refusing a query with
another head count on every rank (e.g. Gemma 4 e2b at tp = 2: target 4 per
rank, draft 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attngroup.kernels.backends.common import HeadCountMismatchError


def _sized_heads(description: dict) -> set[int]:
    """The head counts a builder's state was sized for, from its ``describe()``."""
    heads = {description["num_heads_q"]}
    if "plan" in description:
        heads.add(description["plan"]["num_qo_heads"])
    if "scratch_shapes" in description:
        heads.update(shape[1] for shape in description["scratch_shapes"].values())
    return heads


def flashinfer_guard_active(builder: Any) -> bool:
    """A FlashInfer plan serves a query with its heads and refuses one with twice as many."""
    layer = builder.layers[0]
    plan = builder.plan
    query = torch.empty(
        1, plan.num_qo_heads, plan.head_dim, device=builder.device, dtype=plan.dtype
    )
    plan.check_serves(query, layer)
    try:
        plan.check_serves(query.repeat(1, 2, 1), layer)
    except HeadCountMismatchError:
        return True
    return False


def rank_groups(runner: Any) -> list[dict]:
    """One entry per attention group with query heads (state groups have none)."""
    groups = []
    for row in runner.attention_groups:
        for group in row:
            if group.num_heads_q == 0:
                continue
            builders = group.metadata_builders
            groups.append(
                {
                    "layers": list(group.layer_names),
                    "num_heads_q": group.num_heads_q,
                    "layer_heads": sorted(
                        {runner.layers[name].num_heads_q for name in group.layer_names}
                    ),
                    "builder_heads": sorted(
                        set().union(*(_sized_heads(builder.describe()) for builder in builders))
                    ),
                    "flashinfer_guard": [
                        flashinfer_guard_active(builder)
                        for builder in builders
                        if hasattr(builder, "plan")
                    ],
                }
            )
    return groups


def rank_group_problems(
    rank: int, groups: Sequence[dict], unsharded: Sequence[dict], tp_size: int
) -> list[str]:
    """What is wrong with one rank's groups, given tp = 1's (empty when all is right)."""
    if not unsharded:
        return [f"rank {rank}: tp=1 has no attention group to compare with"]
    expected = {tuple(group["layers"]): group["num_heads_q"] // tp_size for group in unsharded}
    seen = {tuple(group["layers"]) for group in groups}
    problems = [
        f"rank {rank}: no attention group {list(layers)} (tp=1 has it)"
        for layers in expected
        if layers not in seen
    ]
    for group in groups:
        layers = tuple(group["layers"])
        heads = expected.get(layers)
        if heads is None:
            problems.append(f"rank {rank}: attention group {list(layers)} does not exist at tp=1")
            continue
        sizes = {
            "group": [group["num_heads_q"]],
            "layers": group["layer_heads"],
            "builders": group["builder_heads"],
        }
        for what, found in sizes.items():
            if found != [heads]:
                problems.append(
                    f"rank {rank}: {what} of {layers[0]}.. carry {found} query heads, "
                    f"expected tp=1's / {tp_size} = {heads}"
                )
        if not all(group["flashinfer_guard"]):
            problems.append(
                f"rank {rank}: a FlashInfer plan of {layers[0]}.. accepted a query with other heads"
            )
    return problems
