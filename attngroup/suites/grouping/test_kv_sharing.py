"""KV-sharing chains resolved once, where grouping is planned (reference engine
only: these test its public API directly, not through an adapter).

``plan_grouping`` follows every chain once and writes each sharing layer's
cache owner on its description; KV-cache grouping, attention grouping and the
runner's caches read that owner. Every entry point that takes layers or a
sharing map refuses a cycle with an error that names the layers in it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attngroup.reference_engine.attention_groups import group_attention_layers
from attngroup.reference_engine.engine.model_runner import ModelRunner
from attngroup.reference_engine.engine.paged_caches import allocate_caches
from attngroup.reference_engine.grouping_plan import plan_grouping
from attngroup.reference_engine.kv_cache_groups import KVCacheGroupingError, get_kv_cache_groups
from attngroup.reference_engine.kv_sharing import kv_sharing_of, with_kv_cache_owners
from attngroup.reference_engine.layers import LayerDescription, LayerKind, Role
from attngroup.reference_engine.model_pairs import ModelPair, SpecMethod

pytestmark = pytest.mark.grouping

DTYPE = torch.float16
SHARERS = ("hop1", "hop2", "hop3")


def attention(name: str, heads: int = 8, *, head_size: int = 128, shares: str | None = None):
    return LayerDescription(
        name=name,
        role=Role.DRAFT if heads == 4 else Role.TARGET,
        kind=LayerKind.ATTENTION,
        backend="torch",
        num_heads_q=heads,
        num_kv_heads=2,
        head_size=head_size,
        sm_scale=head_size**-0.5,
        kv_sharing_target=shares,
    )


@pytest.fixture
def three_hop_chain() -> list[LayerDescription]:
    """``hop3`` reads ``hop2``, which reads ``hop1``, which reads ``root``: three hops to
    the owner. ``small`` has another head size, so the KV-cache group is a uniform-type
    one whose per-layer specs differ, and taking the wrong layer's spec shows."""
    return [
        attention("small", head_size=64),
        attention("root"),
        attention("hop1", shares="root"),
        attention("hop2", shares="hop1"),
        attention("hop3", 4, shares="hop2"),
    ]


@pytest.fixture
def cycle() -> list[LayerDescription]:
    """``a`` -> ``b`` -> ``c`` -> ``a``: no layer of the chain owns a cache."""
    return [
        attention("root"),
        attention("a", shares="b"),
        attention("b", shares="c"),
        attention("c", shares="a"),
    ]


CYCLE_MESSAGE = r"cycle: a -> b -> c -> a"


def test_owner_is_on_the_planned_descriptions(three_hop_chain):
    plan = plan_grouping(three_hop_chain, "split", dtype=DTYPE)
    owners = {layer.name: layer.kv_cache_owner for layer in plan.layers}
    assert owners == {"small": None, "root": None, "hop1": "root", "hop2": "root", "hop3": "root"}
    assert [layer.cache_layer for layer in plan.layers] == ["small", "root", "root", "root", "root"]
    assert [layer.kv_sharing_target for layer in plan.layers][2:] == ["root", "hop1", "hop2"]


def test_three_hop_chain_joins_the_root_and_takes_its_spec(three_hop_chain):
    plan = plan_grouping(three_hop_chain, "split", dtype=DTYPE)
    (kv_group,) = plan.kv_cache_groups
    assert kv_group.layer_names == ("small", "root", *SHARERS)
    root_spec = kv_group.spec_for("root")
    assert root_spec != kv_group.spec_for("small")
    assert [
        (entry.group.layer_names, entry.group.kv_cache_spec, entry.builder_num_heads)
        for entry in plan.attention_groups[0]
    ] == [
        (["small"], kv_group.spec_for("small"), 8),
        (["root", "hop1", "hop2"], root_spec, 8),
        (["hop3"], root_spec, 4),
    ]


def test_three_hop_chain_through_the_sharing_map(three_hop_chain):
    """``get_kv_cache_groups`` takes the one-hop map as a config gives it and follows it."""
    specs = {
        layer.name: spec
        for layer in three_hop_chain
        if (spec := layer.kv_cache_spec(16, DTYPE)) is not None
    }
    (group,) = get_kv_cache_groups(specs, kv_sharing_of(three_hop_chain))
    assert group.layer_names == ("small", "root", *SHARERS)


def test_three_hop_chain_reads_the_roots_cache_tensors(three_hop_chain):
    plan = plan_grouping(three_hop_chain, "split", dtype=DTYPE)
    by_name = {layer.name: layer for layer in plan.layers}
    kv_caches, state_caches = allocate_caches(plan.kv_cache_groups, by_name, 2, torch.device("cpu"))
    assert not state_caches
    for sharer in SHARERS:
        assert all(
            mine is root for mine, root in zip(kv_caches[sharer], kv_caches["root"], strict=True)
        )
    assert kv_caches["small"][0] is not kv_caches["root"][0]
    (group,) = plan.kv_cache_groups
    for owner in ("small", "root"):  # each its own layout, not the group's first layer's
        spec = group.spec_for(owner)
        expected = (2, spec.block_size, spec.num_kv_heads, spec.head_size)
        assert [tuple(t.shape) for t in kv_caches[owner]] == [expected, expected], owner


def test_resolved_descriptions_are_not_resolved_again(three_hop_chain):
    resolved = with_kv_cache_owners(three_hop_chain)
    assert all(
        again is first
        for again, first in zip(with_kv_cache_owners(resolved), resolved, strict=True)
    )


def test_unresolved_owner_is_refused_by_name():
    with pytest.raises(ValueError, match=r"layer hop1 reads the KV cache of 'root'.*not resolved"):
        _ = attention("hop1", shares="root").cache_layer


def _cyclic_pair(layers: list[LayerDescription]) -> ModelPair:
    return ModelPair(
        name="cyclic-sharing",
        description="a KV-sharing cycle",
        family="llama",
        spec_method=SpecMethod.EAGLE,
        target_config=lambda: None,
        draft_config=lambda: None,
        describe_layers=lambda target, draft, tp, backend: layers,
        default_backend="torch",
    )


def _specs_and_map(layers):
    specs = {
        layer.name: spec for layer in layers if (spec := layer.kv_cache_spec(16, DTYPE)) is not None
    }
    return get_kv_cache_groups(specs, kv_sharing_of(layers))


ENTRY_POINTS = {
    "plan_grouping": lambda layers: plan_grouping(layers, "split", dtype=DTYPE),
    "get_kv_cache_groups": _specs_and_map,
    "group_attention_layers": lambda layers: group_attention_layers([], layers),
    "allocate_caches": lambda layers: allocate_caches(
        [], {layer.name: layer for layer in layers}, 1, torch.device("cpu")
    ),
    "model_runner": lambda layers: ModelRunner(_cyclic_pair(layers), backend="torch"),
    "with_kv_cache_owners": with_kv_cache_owners,
}


@pytest.mark.parametrize("entry_point", ENTRY_POINTS.values(), ids=ENTRY_POINTS.keys())
def test_cycle_is_refused_naming_its_layers(cycle, entry_point):
    with pytest.raises(KVCacheGroupingError, match=CYCLE_MESSAGE) as caught:
        entry_point(cycle)
    assert isinstance(caught.value, ValueError)


def test_chain_to_a_missing_layer_is_refused_naming_the_chain():
    layers = [attention("root"), attention("a", shares="b"), attention("b", shares="gone")]
    with pytest.raises(KVCacheGroupingError, match=r"'gone' has no KV-cache spec.*a -> b -> gone"):
        plan_grouping(layers, "split", dtype=DTYPE)


def test_a_layer_sharing_with_itself_is_a_cycle():
    with pytest.raises(KVCacheGroupingError, match=r"cycle: a -> a"):
        with_kv_cache_owners([attention("root"), replace(attention("a"), kv_sharing_target="a")])
