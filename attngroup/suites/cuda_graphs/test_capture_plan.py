"""The planning half of CUDA graphs, on the CPU: buckets, padding, buffer sizes and the
per-group support decision (each group on its own heads; vLLM #56289 decided FlashInfer's
support from the target's head count for every group)."""

from __future__ import annotations

import logging

import pytest

from attngroup.kernels.backends.cuda_graph_support import GroupGeometry, graph_support
from attngroup.reference_engine.engine.cuda_graphs.capture_plan import (
    CaptureGroup,
    CapturePlan,
    StepKind,
    StepPlan,
    buckets_up_to,
    plan_capture,
)
from attngroup.reference_engine.engine.model_runner import ModelRunner
from attngroup.reference_engine.model_pairs import get_model_pair
from attngroup.suites.cuda_graphs.harness import DEVICE


def _group(name: str, backend: str, heads: int, kv_group: int = 0, head_size: int = 256):
    return CaptureGroup(name, kv_group, GroupGeometry(backend, heads, 1, head_size, None))


def _step(plan: CapturePlan, kind: StepKind) -> StepPlan:
    """The plan's step of ``kind``, which every plan here has (its buckets may be none)."""
    step = plan.step(kind)
    assert step is not None, f"the plan has no {kind.value} step"
    return step


@pytest.mark.parametrize(
    ("max_num_seqs", "expected"),
    [(1, (1,)), (5, (1, 2, 4, 5)), (64, (1, 2, 4, 8, 16, 24, 32, 48, 64))],
    ids=["one", "five", "sixty-four"],
)
def test_buckets_end_at_max_num_seqs(max_num_seqs: int, expected: tuple[int, ...]) -> None:
    assert buckets_up_to(max_num_seqs) == expected


def test_a_batch_runs_the_smallest_bucket_that_holds_it() -> None:
    plan = plan_capture(
        [_group("t", "triton", 8)],
        {StepKind.VERIFY: ["t"]},
        num_spec_tokens=3,
        max_num_seqs=64,
        block_table_widths={0: 10},
    )
    step = _step(plan, StepKind.VERIFY)
    assert step.query_len == 4
    assert [step.bucket_for(n) for n in (1, 3, 17, 64)] == [1, 4, 24, 64]
    assert step.bucket_for(65) is None
    buffers = plan.buffers_of(StepKind.VERIFY, 24)["t"]
    assert (buffers.num_reqs, buffers.num_tokens, buffers.block_table_width) == (24, 96, 10)


def test_flashinfer_buffers_cover_the_bucket() -> None:
    """Every FlashInfer group's index buffers hold the whole bucket's block tables, padded
    requests included, at head 512 (FA2 prefill for verify) as at head 128."""
    plan = plan_capture(
        [_group("wide", "flashinfer", 8, head_size=512), _group("narrow", "flashinfer", 8, 1)],
        {StepKind.VERIFY: ["wide", "narrow"]},
        num_spec_tokens=3,
        max_num_seqs=8,
        block_table_widths={0: 10, 1: 10},
    )
    buffers = plan.buffers_of(StepKind.VERIFY, 8)
    assert (buffers["wide"].indptr_len, buffers["wide"].max_pages) == (9, 80)
    assert (buffers["narrow"].indptr_len, buffers["narrow"].max_pages) == (9, 80)


def test_a_group_that_cannot_be_captured_keeps_only_its_steps_eager() -> None:
    """A draft group refused (here: torch) leaves the target's steps captured, and the plan
    names the group and the reason."""
    plan = plan_capture(
        [_group("target", "triton", 8), _group("draft", "torch", 4)],
        {StepKind.VERIFY: ["target"], StepKind.DRAFT: ["draft"]},
        num_spec_tokens=2,
        max_num_seqs=4,
        block_table_widths={0: 4},
    )
    assert _step(plan, StepKind.VERIFY).buckets == (1, 2, 4)
    assert _step(plan, StepKind.DRAFT).buckets == ()
    text = "\n".join(plan.describe())
    assert "eager for group draft (4 q heads, head 256): the torch reference" in text
    assert "eager for group target" not in text


@pytest.mark.mtp
@pytest.mark.parametrize("pair", ["gemma4-e2b-mtp", "gemma4-e4b-mtp", "qwen3-next-mtp"])
def test_every_group_decides_on_its_own_geometry(pair: str, caplog) -> None:
    caplog.set_level(logging.INFO)
    runner = ModelRunner(
        get_model_pair(pair),
        backend="triton",
        device=DEVICE,
        num_blocks=8,
        num_spec_tokens=2,
        max_num_seqs=4,
        cuda_graph=True,
        max_model_len=64,
    )
    graphs = runner.cuda_graphs
    assert graphs is not None
    plan = graphs.plan
    assert plan.decisions
    layers_of = {g.name: g.layer_names for gs in graphs.groups.values() for g in gs}
    for decision in plan.decisions:
        heads = {runner.layers[name].num_heads_q for name in layers_of[decision.group]}
        heads.discard(0)  # state layers have no query heads
        if heads:
            assert {decision.num_heads_q} == heads, decision
    if get_model_pair(pair).is_mixed:
        assert len({d.num_heads_q for d in plan.decisions}) > 1
    if pair == "qwen3-next-mtp":  # the target's state group keeps the target eager, not the draft
        assert _step(plan, StepKind.VERIFY).buckets == ()
        assert _step(plan, StepKind.DRAFT).buckets == (1, 2, 4)
        assert "run eagerly" in caplog.text and "state group" in "\n".join(plan.describe())


def test_support_rules() -> None:
    triton = GroupGeometry("triton", 8, 1, 256, None)
    assert graph_support(triton, query_len=4, num_reqs=8).capturable
    assert not graph_support(triton, query_len=4, num_reqs=8, scratch_rows=16).capturable
    assert not graph_support(
        GroupGeometry("torch", 8, 1, 256, None), query_len=1, num_reqs=1
    ).capturable
