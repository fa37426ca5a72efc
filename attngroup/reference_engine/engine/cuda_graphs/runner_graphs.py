"""The model runner's attention groups, described for ``capture_plan`` and served by ``graph_steps``.

Every attention group becomes a ``CaptureGroup`` with its own geometry (head count, KV
heads, head size, window; a state group is marked as such), the step kinds name the
groups whose layers they run (target decode and verify: groups with a target layer; the
draft's decode steps: groups with a draft layer), and the runner's ``ModelRunner`` hands
the resulting ``GraphSteps`` every uniform pass.
"""

from __future__ import annotations

from typing import Any

from attngroup.kernels.backends.cuda_graph_support import STATE_GROUP, GroupGeometry
from attngroup.kernels.metadata import cdiv
from attngroup.reference_engine.engine.cuda_graphs.capture_plan import (
    CaptureGroup,
    StepKind,
    plan_capture,
)
from attngroup.reference_engine.engine.cuda_graphs.graph_steps import (
    GraphContext,
    GraphGroup,
    GraphSteps,
)


def runner_graph_steps(runner: Any, max_num_seqs: int, capacity: int) -> GraphSteps:
    """``GraphSteps`` for a ``ModelRunner`` holding up to ``capacity`` context tokens per
    request in its captured steps."""
    capture_groups, graph_groups, roles = [], {}, {}
    for kv_group, row in enumerate(runner.attention_groups):
        info = runner.kv_cache_group_infos[kv_group]
        for index, group in enumerate(row):
            drafts = {runner.layers[name].is_draft for name in group.layer_names}
            role = "shared" if len(drafts) == 2 else ("draft" if drafts == {True} else "target")
            name = f"{role}-g{kv_group}-a{index}"
            builder = group.get_metadata_builder(0)
            scratch = getattr(builder, "scratch", None)
            capture_groups.append(
                CaptureGroup(
                    name=name,
                    kv_cache_group=kv_group,
                    geometry=GroupGeometry(
                        backend=STATE_GROUP if info.is_state else group.backend.name,
                        num_heads_q=group.num_heads_q,
                        num_kv_heads=getattr(builder, "num_heads_kv", 0),
                        head_size=getattr(builder, "head_size", 0),
                        sliding_window=info.sliding_window,
                    ),
                    scratch_rows=scratch.rows if scratch is not None else None,
                )
            )
            graph_groups[name] = GraphGroup(name, kv_group, builder, tuple(group.layer_names))
            roles[name] = role
    k = runner.num_spec_tokens
    target = [name for name, role in roles.items() if role != "draft"]
    draft = [name for name, role in roles.items() if role != "target"]
    step_groups = {StepKind.TARGET_DECODE: target}
    if k:
        step_groups[StepKind.VERIFY] = target
        step_groups[StepKind.DRAFT] = draft
    block_sizes = tuple(info.block_size for info in runner.kv_cache_group_infos)
    plan = plan_capture(
        capture_groups,
        step_groups,
        num_spec_tokens=k,
        max_num_seqs=max_num_seqs,
        block_table_widths={g: cdiv(capacity, size) for g, size in enumerate(block_sizes)},
    )
    context = GraphContext(
        device=runner.device,
        block_sizes=block_sizes,
        capacity=capacity,
        kv_caches=runner.kv_caches,
        state_caches=runner.state_caches,
        block_tables=runner._metadata.block_tables,
    )
    return GraphSteps(
        plan,
        context,
        {kind: [graph_groups[name] for name in names] for kind, names in step_groups.items()},
    )
