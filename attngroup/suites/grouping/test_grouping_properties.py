"""Property tests: random layer sets group conformantly under the engine's
native policy, and LEGACY fails loudly exactly when a group mixes heads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from attngroup.reference_engine.kv_cache_groups import get_kv_cache_groups
from attngroup.reference_engine.kv_cache_spec import UniformTypeKVCacheSpecs
from attngroup.reference_engine.kv_sharing import kv_sharing_of
from attngroup.reference_engine.layers import LayerDescription, LayerKind, Role
from attngroup.suites.grouping.checks import conformance_violations, expected_mixed_heads_error

pytestmark = pytest.mark.grouping

BACKENDS = ("triton", "torch")


WINDOW_MIXES = {"full": (None,), "sliding": (32,), "hybrid": (None, 32)}


@st.composite
def layer_sets(draw) -> list[LayerDescription]:
    """Target layers of a few shapes, draft layers that may have fewer query
    heads, and KV-sharing layers that read any earlier layer, a shared one
    included (a chain: the owner is at its end).

    One window mix per set: when every owner is full (or every owner sliding)
    but head sizes differ, the layers form one ``UniformTypeKVCacheSpecs`` group,
    where each attention group takes its layer's own spec from inside it.
    """
    num_layers = draw(st.integers(min_value=1, max_value=12))
    windows = WINDOW_MIXES[draw(st.sampled_from(sorted(WINDOW_MIXES)))]
    layers: list[LayerDescription] = []
    for index in range(num_layers):
        role = draw(st.sampled_from(list(Role)))
        share = bool(layers) and draw(st.booleans())
        source = draw(st.sampled_from(layers)) if share else None
        owner = _owner_of(source, layers) if source else None
        num_kv_heads = owner.num_kv_heads if owner else draw(st.sampled_from((1, 2, 8)))
        layers.append(
            LayerDescription(
                name=f"{role}.layers.{index}.attn",
                role=role,
                kind=LayerKind.ATTENTION,
                backend=draw(st.sampled_from(BACKENDS)),
                num_heads_q=num_kv_heads * draw(st.sampled_from((1, 2, 4))),
                num_kv_heads=num_kv_heads,
                head_size=owner.head_size if owner else draw(st.sampled_from((64, 128, 256))),
                sliding_window=owner.sliding_window if owner else draw(st.sampled_from(windows)),
                kv_sharing_target=source.name if source else None,
            )
        )
    return layers


def _owner_of(layer: LayerDescription, layers: list[LayerDescription]) -> LayerDescription:
    """The layer at the end of ``layer``'s KV-sharing chain (the one that owns the cache)."""
    by_name = {candidate.name: candidate for candidate in layers}
    while layer.kv_sharing_target is not None:
        layer = by_name[layer.kv_sharing_target]
    return layer


def test_strategy_draws_chains_and_uniform_type_groups():
    """The strategy reaches the inputs it exists for: a KV-sharing chain inside a
    ``UniformTypeKVCacheSpecs`` group (hypothesis' ``find`` fails if none is drawn)."""

    def chain_in_uniform_type_group(layers: list[LayerDescription]) -> bool:
        by_name = {layer.name: layer for layer in layers}
        has_chain = any(
            layer.kv_sharing_target and by_name[layer.kv_sharing_target].kv_sharing_target
            for layer in layers
        )
        specs = {
            layer.name: spec
            for layer in layers
            if (spec := layer.kv_cache_spec(16, torch.float32)) is not None
        }
        groups = get_kv_cache_groups(specs, kv_sharing_of(layers))
        return has_chain and any(
            isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs) for group in groups
        )

    example = find(layer_sets(), chain_in_uniform_type_group, settings=settings(max_examples=2000))
    assert chain_in_uniform_type_group(example)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(layers=layer_sets())
def test_native_grouping_of_random_layer_sets_conforms(engine, layers):
    outcome = engine.setup(layers, engine.policies[0])
    assert conformance_violations(outcome, layers) == []


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(layers=layer_sets())
def test_legacy_fails_exactly_when_a_group_mixes_heads(engine, layers):
    if "legacy" not in engine.policies:
        pytest.skip(f"engine {engine.name} has no LEGACY policy")
    outcome = engine.setup(layers, "legacy")
    assert outcome.error == expected_mixed_heads_error(outcome, layers)
