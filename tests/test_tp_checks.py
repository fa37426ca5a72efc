"""The per-rank TP checks (``attngroup.suites.tp_checks``) find what they are for: a rank
whose groups, layers or builders carry unsharded heads, a grouping that differs
from tp = 1's, and a FlashInfer plan whose head guard would let another head
count through. The TP suites run them on real ranks; here they meet known faults."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch

from attngroup.kernels.backends.flashinfer_attn import FlashInferPlanParams
from attngroup.reference_engine.kv_cache_spec import FullAttentionSpec
from attngroup.reference_engine.model_pairs import get_model_pair
from attngroup.suites.tp_checks import flashinfer_guard_active, rank_group_problems

TP_SIZE = 2
#: Gemma 4 e2b at tp = 1: the target's sliding group has 8 query heads, the draft's 4.
UNSHARDED = [
    {"layers": ["t.0", "t.1"], "num_heads_q": 8, "layer_heads": [8], "builder_heads": [8]},
    {"layers": ["d.0"], "num_heads_q": 4, "layer_heads": [4], "builder_heads": [4]},
]


def _rank(**changes: Any) -> list[dict]:
    """A correct tp = 2 rank (target 4 heads, draft 2), with ``changes`` to the draft group."""
    target = {**UNSHARDED[0], "num_heads_q": 4, "layer_heads": [4], "builder_heads": [4]}
    draft = {**UNSHARDED[1], "num_heads_q": 2, "layer_heads": [2], "builder_heads": [2]}
    return [
        {**target, "flashinfer_guard": [True]},
        {**draft, "flashinfer_guard": [True], **changes},
    ]


def test_a_correct_rank_has_no_problems() -> None:
    assert rank_group_problems(1, _rank(), UNSHARDED, TP_SIZE) == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param({"builder_heads": [4]}, "builders of d.0.. carry [4]", id="unsharded-builder"),
        pytest.param({"builder_heads": [2, 4]}, "builders of d.0.. carry [2, 4]", id="mixed-state"),
        pytest.param({"layer_heads": [4]}, "layers of d.0.. carry [4]", id="unsharded-layer"),
        pytest.param({"num_heads_q": 4}, "group of d.0.. carry [4]", id="unsharded-group"),
        pytest.param({"layers": ["t.0", "d.0"]}, "does not exist at tp=1", id="other-grouping"),
        pytest.param({"flashinfer_guard": [False]}, "accepted a query", id="guard-off"),
    ],
)
def test_a_faulty_rank_is_reported(changes: dict, expected: str) -> None:
    problems = rank_group_problems(1, _rank(**changes), UNSHARDED, TP_SIZE)
    assert any(expected in problem and problem.startswith("rank 1:") for problem in problems), (
        problems
    )


def test_an_empty_comparison_is_a_problem() -> None:
    assert rank_group_problems(0, [], [], TP_SIZE) == [
        "rank 0: tp=1 has no attention group to compare with"
    ]


def test_a_missing_group_is_reported() -> None:
    problems = rank_group_problems(0, _rank()[:1], UNSHARDED, TP_SIZE)
    assert problems == ["rank 0: no attention group ['d.0'] (tp=1 has it)"]


@dataclass
class _PlannedBuilder:
    """What the guard check reads of a FlashInfer builder (its plan needs no GPU)."""

    layers: tuple
    plan: FlashInferPlanParams
    device: str = "cpu"


@pytest.fixture
def draft_builder() -> _PlannedBuilder:
    """A builder for Gemma 4 e2b's draft layer at tp = 2 (2 query heads per rank)."""
    layer = next(
        layer
        for layer in get_model_pair("gemma4-e2b-mtp").layers(TP_SIZE, "flashinfer")
        if layer.is_attention and layer.num_heads_q == 2
    )
    spec = FullAttentionSpec(16, layer.num_kv_heads, layer.head_size, torch.bfloat16)
    params = layer.attention_params()
    plan = FlashInferPlanParams.for_group(spec, [params], layer.num_heads_q)
    return _PlannedBuilder((params,), plan)


def test_the_flashinfer_guard_check_sees_an_active_guard(draft_builder) -> None:
    assert draft_builder.plan.num_qo_heads == 2
    assert flashinfer_guard_active(draft_builder)


class _UnguardedPlan(FlashInferPlanParams):
    """A plan without the head guard: FlashInfer's own behaviour (it never compares heads)."""

    def check_serves(self, query: torch.Tensor, layer: Any) -> None:
        return None


def test_the_flashinfer_guard_check_sees_a_missing_guard(draft_builder) -> None:
    fields = {
        name: getattr(draft_builder.plan, name) for name in draft_builder.plan.__dataclass_fields__
    }
    unguarded = replace(draft_builder, plan=_UnguardedPlan(**fields))
    assert not flashinfer_guard_active(unguarded)
