"""The reference engine's attention grouping and its builders (reference
engine only: these test its public API directly, not through an adapter)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attngroup.kernels.backend import (
    AttentionLayerParams,
    AttentionMetadataBuilder,
    StateMetadataBuilder,
    get_num_attention_heads_from_layers,
)
from attngroup.kernels.registry import get_backend
from attngroup.reference_engine.attention_groups import (
    AttentionGroupKey,
    GroupingPolicy,
    group_attention_layers,
)
from attngroup.reference_engine.grouping_plan import plan_grouping
from attngroup.reference_engine.kv_cache_groups import get_kv_cache_groups
from attngroup.reference_engine.kv_cache_spec import MambaSpec, UniformTypeKVCacheSpecs
from attngroup.reference_engine.layers import LayerDescription, LayerKind, Role
from attngroup.reference_engine.model_pairs import get_model_pair

pytestmark = pytest.mark.grouping


def attention(
    name: str, heads: int, *, head_size: int = 128, backend: str = "triton", role=Role.TARGET
):
    return LayerDescription(
        name=name,
        role=role,
        kind=LayerKind.ATTENTION,
        backend=backend,
        num_heads_q=heads,
        num_kv_heads=2,
        head_size=head_size,
        sm_scale=head_size**-0.5,
    )


def groups_of(layers, policy=GroupingPolicy.SPLIT_BY_Q_HEADS):
    specs = {layer.name: layer.kv_cache_spec(16, torch.float16) for layer in layers}
    kv_groups = get_kv_cache_groups(specs)
    return kv_groups, group_attention_layers(kv_groups, layers, policy)


def test_heads_helper_none_uniform_and_mixed():
    params = [attention(f"l{i}", h).attention_params() for i, h in enumerate((8, 8, 4))]
    assert get_num_attention_heads_from_layers([]) is None
    assert get_num_attention_heads_from_layers(params[:2]) == 8
    with pytest.raises(AssertionError) as raised:
        get_num_attention_heads_from_layers(params)
    assert str(raised.value) == (
        "All layers in one attention group must share num_heads; got {8, 4} for ['l0', 'l1', 'l2']."
    )


def test_same_spec_different_heads_split_inside_one_kv_group():
    layers = [attention("t0", 8), attention("d0", 4, role=Role.DRAFT), attention("t1", 8)]
    kv_groups, attn = groups_of(layers)
    assert len(kv_groups) == 1
    assert [(g.layer_names, g.num_heads_q) for g in attn[0]] == [(["t0", "t1"], 8), (["d0"], 4)]


def test_legacy_merges_them_in_first_seen_order():
    layers = [attention("t0", 8), attention("d0", 4, role=Role.DRAFT), attention("t1", 8)]
    _, attn = groups_of(layers, GroupingPolicy.LEGACY)
    assert [g.layer_names for g in attn[0]] == [["t0", "d0", "t1"]]


def test_backends_split_groups():
    layers = [attention("a", 8, backend="triton"), attention("b", 8, backend="torch")]
    _, attn = groups_of(layers)
    assert [g.backend.name for g in attn[0]] == ["triton", "torch"]


def test_backend_identity_is_the_fully_qualified_class_name():
    """Dynamically made subclasses with the same qualified name deduplicate (vLLM's FastPrefill case)."""
    base = get_backend("triton")
    first = type(base.__name__, (base,), {"__module__": base.__module__})
    second = type(base.__name__, (base,), {"__module__": base.__module__})
    spec = attention("a", 8).kv_cache_spec(16, torch.float16)
    keys = {
        AttentionGroupKey(cls, spec, 8).dedup_key(GroupingPolicy.SPLIT_BY_Q_HEADS)
        for cls in (first, second)
    }
    assert first is not second and len(keys) == 1


def test_per_layer_spec_splits_inside_a_uniform_type_group():
    layers = [attention("small", 8, head_size=64), attention("large", 8, head_size=128)]
    kv_groups, attn = groups_of(layers)
    assert len(kv_groups) == 1, "same type and block size: one UniformTypeKVCacheSpecs group"
    assert [(g.layer_names, g.kv_cache_spec.head_size) for g in attn[0]] == [
        (["small"], 64),
        (["large"], 128),
    ]


def test_kv_sharing_chain_inside_a_uniform_type_group():
    """``draft`` reads ``mid``, which reads ``large``: the chain ends at ``large``, whose
    per-layer spec (head 128 inside the uniform-type group) both sharers take; the
    4-head draft still gets an attention group and a builder head count of its own."""
    layers = [
        attention("small", 8, head_size=64),
        attention("large", 8, head_size=128),
        replace(attention("mid", 8), kv_sharing_target="large"),
        replace(attention("draft", 4, role=Role.DRAFT), kv_sharing_target="mid"),
    ]
    plan = plan_grouping(layers, "split", dtype=torch.float16)
    (kv_group,) = plan.kv_cache_groups
    assert isinstance(kv_group.kv_cache_spec, UniformTypeKVCacheSpecs)
    assert kv_group.layer_names == ("small", "large", "mid", "draft")
    large_spec = kv_group.spec_for("large")
    assert [
        (e.group.layer_names, e.group.kv_cache_spec, e.group.num_heads_q, e.builder_num_heads)
        for e in plan.attention_groups[0]
    ] == [
        (["small"], kv_group.spec_for("small"), 8, 8),
        (["large", "mid"], large_spec, 8, 8),
        (["draft"], large_spec, 4, 4),
    ]
    assert plan.error is None


def test_state_layers_have_zero_query_heads():
    pair = get_model_pair("qwen3-next-mtp")
    plan = plan_grouping(pair.layers(), "split")
    state = [e for row in plan.attention_groups for e in row if e.group.backend.name == "mamba"]
    assert state and all(e.group.num_heads_q == 0 and e.builder_num_heads == 0 for e in state)


def test_state_groups_get_state_builders_from_their_layer_names():
    """A hybrid pair's state groups get state builders (made from the layer names alone),
    its attention groups attention builders; each serves exactly its group's layers."""
    layers = get_model_pair("qwen3-next-mtp").layers()
    plan = plan_grouping(layers, "split")
    by_name = {layer.name: layer for layer in layers}
    kinds = set()
    for group in (e.group for row in plan.attention_groups for e in row):
        group.create_metadata_builders(by_name, "cpu", max_num_seqs=4)
        builder = group.get_metadata_builder()
        is_state = isinstance(group.kv_cache_spec, MambaSpec)
        kinds.add(is_state)
        assert isinstance(builder, StateMetadataBuilder if is_state else AttentionMetadataBuilder)
        assert builder.layer_names == tuple(group.layer_names)
        assert builder.num_heads_q == group.num_heads_q
    assert kinds == {True, False}


@pytest.fixture
def gemma_groups():
    layers = get_model_pair("gemma4-e2b-mtp").layers()
    plan = plan_grouping(layers, "split")
    return {layer.name: layer for layer in layers}, [
        e.group for row in plan.attention_groups for e in row
    ]


@pytest.mark.mtp
def test_one_distinct_builder_per_micro_batch_sized_by_the_group(gemma_groups):
    by_name, groups = gemma_groups
    for group in groups:
        group.create_metadata_builders(by_name, "cpu", num_builders=2, max_num_seqs=4)
        first, second = group.metadata_builders
        assert first is not second
        assert first.num_heads_q == second.num_heads_q == group.num_heads_q
        assert {by_name[n].num_heads_q for n in group.layer_names} == {group.num_heads_q}
        with pytest.raises(IndexError, match="no metadata builder for micro-batch 2"):
            group.get_metadata_builder(2)


@pytest.mark.mtp
def test_builders_of_a_legacy_group_refuse_mixed_heads():
    layers = get_model_pair("gemma4-e2b-mtp").layers()
    plan = plan_grouping(layers, "legacy")
    with pytest.raises(AssertionError, match=r"must share num_heads; got \{8, 4\}"):
        plan.raise_on_error()
    mixed = plan.first_error.group
    with pytest.raises(AssertionError, match=r"got \{8, 4\} for \['model.layers.3.self_attn.attn'"):
        mixed.create_metadata_builders(
            {layer.name: layer for layer in layers}, "cpu", max_num_seqs=4
        )


def test_attention_params_refuse_indivisible_gqa():
    with pytest.raises(ValueError, match="num_heads_q 6 is not a multiple of num_kv_heads 4"):
        AttentionLayerParams(name="x", num_heads_q=6, num_kv_heads=4, head_size=64, sm_scale=1.0)
