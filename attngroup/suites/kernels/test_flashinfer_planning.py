"""FlashInfer's planning on the CPU: every attention group's plan is that group's own.

The FlashInfer builder runs on the stand-in (``flashinfer_standin``), through the
same builder, plans and impl as on the GPU. For every model pair, TP size and
grouping policy, each group's builders plan a decode and a verify step, and every
plan the stand-in recorded must carry the head count, window, scale and soft cap
of each layer the group serves, and the KV geometry of its spec; then each layer
runs on its group's metadata. A builder that plans a group with another group's
head count (one plan cached per KV geometry, vLLM #53002's class; the model-wide
head count, #42650) fails here. LEGACY merges the drafts' 4-head layers into the
targets' 8-head groups: the strict check refuses the builders, and builders made
without it (as an engine without the check makes them) plan violations.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import ModuleType

import pytest
import torch

from attngroup.kernels.backends.flashinfer_attn import FlashInferBackend, FlashInferImpl
from attngroup.kernels.metadata import CommonAttentionMetadata
from attngroup.reference_engine.attention_groups import AttentionGroup, GroupingPolicy
from attngroup.reference_engine.grouping_plan import GroupingPlan, plan_grouping
from attngroup.reference_engine.layers import LayerDescription, LayerKind, Role
from attngroup.reference_engine.model_pairs import MODEL_PAIRS
from attngroup.suites.kernels.backend_harness import attention_spec, poisoned_like
from attngroup.suites.kernels.flashinfer_standin import Call, PlanMismatchError, calls_since, mark

pytestmark = pytest.mark.kernels

DTYPE = torch.bfloat16
BUILDER_OPTIONS = {"max_num_seqs": 4, "max_query_len": 5}
STEPS = {  # (seq_lens, query_lens): a decode and a verify step, crossing pages and the window
    "decode": ((5, 40), (1, 1)),
    "verify": ((9, 44), (4, 4)),
}


def _softcap_layers(tp: int) -> list[LayerDescription]:
    """A target (8 q heads) and a draft (4) on one KV spec, with their own scale and soft
    cap: the plan must carry each group's (real pairs have no attention soft cap)."""
    if tp != 1:
        raise ValueError("one rank only")

    def layer(name: str, role: Role, heads: int, scale: float, cap: float) -> LayerDescription:
        return LayerDescription(
            name=name,
            role=role,
            kind=LayerKind.ATTENTION,
            backend="flashinfer",
            num_heads_q=heads,
            num_kv_heads=2,
            head_size=128,
            sliding_window=64,
            sm_scale=scale,
            logits_soft_cap=cap,
        )

    return [
        layer("model.layers.0.attn", Role.TARGET, 8, 0.125, 50.0),
        layer("model.layers.1.attn", Role.TARGET, 8, 0.125, 50.0),
        layer("draft_model.layers.0.attn", Role.DRAFT, 4, 0.0625, 30.0),
    ]


def layer_sets() -> list:
    params = [
        pytest.param(name, tp, id=f"{name}-tp{tp}")
        for name, pair in MODEL_PAIRS.items()
        for tp in pair.supported_tp_sizes
    ]
    return [*params, pytest.param("softcap-scale-draft", 1, id="softcap-scale-draft-tp1")]


def describe(name: str, tp: int) -> list[LayerDescription]:
    if name == "softcap-scale-draft":
        return _softcap_layers(tp)
    return MODEL_PAIRS[name].layers(tp, backend="flashinfer")


def step_metadata(plan: GroupingPlan, kv_group_id: int, step: str) -> CommonAttentionMetadata:
    seq_lens, query_lens = STEPS[step]
    block_size = plan.kv_cache_groups[kv_group_id].kv_cache_spec.block_size
    blocks = math.ceil(max(seq_lens) / block_size)
    table = torch.arange(len(seq_lens) * blocks, dtype=torch.int32).reshape(len(seq_lens), blocks)
    return CommonAttentionMetadata.from_seq_lens(seq_lens, query_lens, table, block_size, "cpu")


def plan_violations(plan_call: Call, layer: LayerDescription, spec) -> list[str]:
    """How a recorded plan differs from what ``layer`` needs."""
    arguments = plan_call.arguments
    head_dim = arguments.get("head_dim", arguments.get("head_dim_qk"))
    expected = {
        "num_qo_heads": layer.num_heads_q,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_size,
        "page_size": spec.block_size,
        "window_left": -1 if layer.sliding_window is None else layer.sliding_window - 1,
        "sm_scale": layer.sm_scale,
        "logits_soft_cap": layer.logits_soft_cap or 0.0,
    }
    planned = {**{key: arguments.get(key) for key in expected}, "head_dim": head_dim}
    planned["logits_soft_cap"] = planned["logits_soft_cap"] or 0.0
    return [
        f"{layer.name}: planned {key}={planned[key]}, the layer needs {value}"
        for key, value in expected.items()
        if planned[key] != value
    ]


def group_violations(
    group: AttentionGroup,
    plan: GroupingPlan,
    layers: dict[str, LayerDescription],
    *,
    strict: bool,
) -> list[str]:
    """Build the group's builder, plan both steps, check every plan and run every layer."""
    try:
        group.create_metadata_builders(layers, "cpu", strict=strict, **BUILDER_OPTIONS)
    except (AssertionError, ValueError) as error:
        return [f"builder of {group.layer_names} refused: {type(error).__name__}: {error}"]
    builder = group.get_metadata_builder()
    problems = []
    for step in STEPS:
        common = step_metadata(plan, group.kv_cache_group_id, step)
        before = mark()
        metadata = builder.build(common)
        plans = calls_since(before, "plans")
        if not plans:
            problems.append(f"{group.layer_names}: {step} step built without planning a wrapper")
        for _, call in plans:
            for name in group.layer_names:
                problems += plan_violations(call, layers[name], group.kv_cache_spec)
        for name in group.layer_names:
            problems += run_violations(layers[name], group.kv_cache_spec, common, metadata, step)
    return problems


def run_violations(
    layer: LayerDescription, spec, common: CommonAttentionMetadata, metadata, step: str
) -> list[str]:
    """Run ``layer`` on ``metadata``; its q must reach a wrapper planned for its heads."""
    generator = torch.Generator().manual_seed(0)
    shape = (64, spec.block_size, spec.num_kv_heads, spec.head_size)
    key_cache = torch.randn(shape, generator=generator).to(DTYPE)
    value_cache = torch.randn(shape, generator=generator).to(DTYPE)
    query = torch.randn(
        common.num_actual_tokens, layer.num_heads_q, layer.head_size, generator=generator
    ).to(DTYPE)
    output = poisoned_like(query)
    before = mark()
    try:
        FlashInferImpl(layer.attention_params()).forward(
            query, key_cache, value_cache, metadata, output
        )
    except (ValueError, RuntimeError) as error:
        return [f"{layer.name} ({step}): {type(error).__name__}: {error}"]
    runs = calls_since(before, "runs")
    if [call["q"].shape[1] for _, call in runs] != [layer.num_heads_q]:
        return [f"{layer.name} ({step}): expected one run with its q, got {len(runs)}"]
    if output.isnan().any():
        return [f"{layer.name} ({step}): the run left output rows unwritten"]
    return []


def flashinfer_violations(name: str, tp: int, policy: GroupingPolicy, strict: bool) -> list[str]:
    layers = describe(name, tp)
    plan = plan_grouping(layers, policy, dtype=DTYPE)
    by_name = {layer.name: layer for layer in layers}
    return [
        problem
        for row in plan.attention_groups
        for entry in row
        if entry.group.backend is FlashInferBackend
        for problem in group_violations(entry.group, plan, by_name, strict=strict)
    ]


def is_mixed(name: str) -> bool:
    layers = [layer for layer in describe(name, 1) if layer.is_attention]
    return len({layer.num_heads_q for layer in layers}) > 1


@pytest.mark.parametrize(("name", "tp"), layer_sets())
def test_every_group_plans_its_own_heads_window_scale_and_softcap(
    flashinfer_standin_module: ModuleType, name: str, tp: int
) -> None:
    """The engine's grouping (split by query heads), builders as the engine makes them."""
    assert flashinfer_violations(name, tp, GroupingPolicy.SPLIT_BY_Q_HEADS, strict=True) == []


@pytest.mark.parametrize(("name", "tp"), layer_sets())
def test_legacy_groups_are_caught(
    flashinfer_standin_module: ModuleType, name: str, tp: int
) -> None:
    """LEGACY on a mixed pair: refused by the strict check, and without it (an engine
    that lacks the check) the plans of the merged groups serve layers of other head
    counts. On a uniform pair LEGACY is harmless."""
    strict = flashinfer_violations(name, tp, GroupingPolicy.LEGACY, strict=True)
    unchecked = flashinfer_violations(name, tp, GroupingPolicy.LEGACY, strict=False)
    if not is_mixed(name):
        assert strict == unchecked == []
        return
    assert any("must share num_heads" in problem for problem in strict)
    assert unchecked, "a merged group's plan served layers of another head count unnoticed"


def test_standin_refuses_a_q_with_other_heads(flashinfer_standin_module: ModuleType) -> None:
    """The stand-in's own guard: a wrapper planned for 8 query heads refuses a 4-head q
    (FlashInfer itself never compares the two), and a run before any plan."""
    wrapper = flashinfer_standin_module.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(16, dtype=torch.uint8), "NHD", use_tensor_cores=True
    )
    cache = torch.randn(4, 16, 1, 64).to(DTYPE)
    with pytest.raises(PlanMismatchError, match="before any plan"):
        wrapper.run(torch.randn(1, 8, 64).to(DTYPE), (cache, cache))
    pages = (torch.tensor([0, 2]), torch.tensor([1, 3]), torch.tensor([5]))
    wrapper.plan(*pages, 8, 1, 64, 16, window_left=-1, sm_scale=0.125)
    assert wrapper.record.options == {"kv_layout": "NHD", "use_tensor_cores": True}
    assert wrapper.record.plans[0]["num_qo_heads"] == 8
    assert wrapper.record.plans[0]["sm_scale"] == 0.125
    with pytest.raises(PlanMismatchError, match="4 heads of size 64, but the wrapper was planned"):
        wrapper.run(torch.randn(1, 4, 64).to(DTYPE), (cache, cache))
    assert len(wrapper.record.runs) == 2  # refused runs are recorded too


def test_standin_is_installed_only_by_the_fixture() -> None:
    """Without the fixture nothing named ``flashinfer`` is the stand-in, and FlashInfer
    refuses the CPU (the stand-in must never serve outside tests)."""
    import sys

    from attngroup.suites.kernels import flashinfer_standin

    assert sys.modules.get("flashinfer") is not flashinfer_standin
    assert not FlashInferBackend.is_available("cpu")


def test_the_fixture_lets_flashinfer_serve_the_cpu(flashinfer_standin_module: ModuleType) -> None:
    assert FlashInferBackend.is_available("cpu")
    assert FlashInferBackend.unsupported_reason(64, torch.float16, 16, "cpu") is None


def test_standin_run_matches_the_oracle(flashinfer_standin_module: ModuleType) -> None:
    """Builder + impl on the stand-in give the float64 oracle's attention for a verify
    step with a window and a soft cap (the page indices the builder planned are right)."""
    from attngroup.kernels.attention_oracle import paged_attention_reference

    layer = replace(_softcap_layers(1)[2], sliding_window=6)
    layers = {layer.name: layer}
    plan = plan_grouping([layer], "split", dtype=DTYPE)
    (entry,) = plan.attention_groups[0]
    entry.group.create_metadata_builders(layers, "cpu", **BUILDER_OPTIONS)
    common = step_metadata(plan, 0, "verify")
    spec = attention_spec(entry.group)
    generator = torch.Generator().manual_seed(1)
    shape = (64, spec.block_size, spec.num_kv_heads, spec.head_size)
    key_cache = torch.randn(shape, generator=generator).to(DTYPE)
    value_cache = torch.randn(shape, generator=generator).to(DTYPE)
    query = torch.randn(common.num_actual_tokens, 4, 128, generator=generator).to(DTYPE)
    output = poisoned_like(query)
    metadata = entry.group.get_metadata_builder().build(common)
    FlashInferImpl(layer.attention_params()).forward(
        query, key_cache, value_cache, metadata, output
    )
    expected = paged_attention_reference(
        query,
        key_cache,
        value_cache,
        query_start_loc=common.query_start_loc_cpu,
        seq_lens=common.seq_lens_cpu,
        block_table=common.block_table,
        sm_scale=layer.sm_scale,
        sliding_window=layer.sliding_window,
        logits_soft_cap=layer.logits_soft_cap,
    )
    error = (output.double() - expected).norm() / expected.norm()
    assert error < 1e-2  # bfloat16 output


def _mixed_head_layer_sets() -> list:
    """Every pair and TP size whose attention groups differ in query heads."""
    return [param for param in layer_sets() if len(_heads_of(*param.values)) > 1]


def _heads_of(name: str, tp: int) -> set[int]:
    return {layer.num_heads_q for layer in describe(name, tp) if layer.is_attention}


@pytest.mark.parametrize(("name", "tp"), _mixed_head_layer_sets())
def test_each_group_keeps_its_plan_while_the_others_plan(
    flashinfer_standin_module: ModuleType, name: str, tp: int
) -> None:
    """As a runner step does: every group's builder plans the step, then every layer runs.
    A planner shared across groups (SGLang #32062: the last plan() overwrote the others)
    serves a layer another group's heads or window."""
    layers = describe(name, tp)
    plan = plan_grouping(layers, GroupingPolicy.SPLIT_BY_Q_HEADS, dtype=DTYPE)
    by_name = {layer.name: layer for layer in layers}
    groups = [
        entry.group
        for row in plan.attention_groups
        for entry in row
        if entry.group.backend is FlashInferBackend
    ]
    for step in STEPS:
        built = []
        for group in groups:
            group.create_metadata_builders(by_name, "cpu", strict=True, **BUILDER_OPTIONS)
            common = step_metadata(plan, group.kv_cache_group_id, step)
            built.append((group, common, group.get_metadata_builder().build(common)))
        problems = [
            problem
            for group, common, metadata in built
            for layer_name in group.layer_names
            for problem in run_violations(
                by_name[layer_name], group.kv_cache_spec, common, metadata, step
            )
        ]
        assert problems == []


def test_standin_run_leaves_padded_rows_alone(flashinfer_standin_module: ModuleType) -> None:
    """A padded step (CUDA-graph or DP padding: more query rows than ``query_start_loc``
    counts): the impl hands FlashInfer only the real rows, which FlashInfer checks
    (``q.shape[0]`` against ``qo_indptr[-1]``), and the padded output rows stay untouched."""
    layer = _softcap_layers(1)[2]
    plan = plan_grouping([layer], "split", dtype=DTYPE)
    (entry,) = plan.attention_groups[0]
    entry.group.create_metadata_builders({layer.name: layer}, "cpu", **BUILDER_OPTIONS)
    seq_lens, query_lens = STEPS["verify"]
    real = step_metadata(plan, 0, "verify")
    padded = CommonAttentionMetadata.from_seq_lens(
        seq_lens,
        query_lens,
        real.block_table,
        entry.group.kv_cache_spec.block_size,
        "cpu",
        num_tokens_padded=real.num_actual_tokens + 3,
    )
    spec = attention_spec(entry.group)
    generator = torch.Generator().manual_seed(2)
    shape = (64, spec.block_size, spec.num_kv_heads, spec.head_size)
    key_cache = torch.randn(shape, generator=generator).to(DTYPE)
    value_cache = torch.randn(shape, generator=generator).to(DTYPE)
    query = torch.randn(real.num_actual_tokens + 3, 4, 128, generator=generator).to(DTYPE)
    outputs = []
    for common, rows in ((real, real.num_actual_tokens), (padded, query.shape[0])):
        output = poisoned_like(query[:rows])
        metadata = entry.group.get_metadata_builder().build(common)
        FlashInferImpl(layer.attention_params()).forward(
            query[:rows], key_cache, value_cache, metadata, output
        )
        outputs.append(output)
    unpadded, padded_output = outputs
    num_real = real.num_actual_tokens
    assert padded_output[num_real:].isnan().all(), "padded rows were written"
    assert torch.equal(padded_output[:num_real], unpadded)
    with pytest.raises(PlanMismatchError, match=r"q.shape\[0\] \(3\) does not match"):
        metadata.wrapper.run(query[:3], (key_cache, value_cache))
