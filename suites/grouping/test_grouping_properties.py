"""Property tests: random layer sets group conformantly under the engine's
native policy, and LEGACY fails loudly exactly when a group mixes heads."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine.layers import LayerDescription, LayerKind, Role
from suites.grouping.checks import conformance_violations, expected_mixed_heads_error

pytestmark = pytest.mark.grouping

BACKENDS = ("triton", "torch")


@st.composite
def layer_sets(draw) -> list[LayerDescription]:
    """Target layers of a few shapes, draft layers that may have fewer query
    heads, and KV-sharing layers that read an earlier non-shared layer."""
    num_layers = draw(st.integers(min_value=1, max_value=12))
    layers: list[LayerDescription] = []
    for index in range(num_layers):
        role = draw(st.sampled_from(list(Role)))
        num_kv_heads = draw(st.sampled_from((1, 2, 8)))
        owners = [layer for layer in layers if layer.kv_sharing_target is None]
        share = owners and draw(st.booleans())
        source = draw(st.sampled_from(owners)) if share else None
        if source is not None:
            num_kv_heads = source.num_kv_heads
        layers.append(
            LayerDescription(
                name=f"{role}.layers.{index}.attn",
                role=role,
                kind=LayerKind.ATTENTION,
                backend=draw(st.sampled_from(BACKENDS)),
                num_heads_q=num_kv_heads * draw(st.sampled_from((1, 2, 4))),
                num_kv_heads=num_kv_heads,
                head_size=source.head_size if source else draw(st.sampled_from((64, 128, 256))),
                sliding_window=source.sliding_window
                if source
                else draw(st.sampled_from((None, 32))),
                kv_sharing_target=source.name if source else None,
            )
        )
    return layers


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
