"""KV-cache grouping conformance: which layers share one block table.

The cases follow vLLM's ``tests/v1/core/test_kv_cache_utils.py::
test_get_kv_cache_config_one_worker`` (same specs, same expected groups) plus
the rules behind them (1.5x padding rule, strided split, page unification,
bucket merging, Mamba padding, KV sharing). Every test above the "reference
engine only" line judges an engine through the adapter seam
(``engine.kv_cache_groups``), so the same cases judge vLLM's own code.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

# Only the "reference engine only" section at the end uses these directly.
from attngroup.reference_engine.kv_cache_groups import (
    KVCacheGroupingError,
    check_exact_partition,
    get_kv_cache_groups,
)
from attngroup.reference_engine.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

pytestmark = pytest.mark.grouping

#: Engines refuse bad input with different exception types (vLLM: NotImplementedError
#: for pages it cannot unify, KeyError for a missing KV-sharing target); the seam demands
#: a refusal that names the culprit, not a type. The reference engine's own error class
#: and texts are tested in the reference-only section below.
ENGINE_REFUSALS = (ValueError, KeyError, AssertionError, NotImplementedError)


def full_spec(block_size=16, head_size=64, sliding_window=None) -> FullAttentionSpec:
    """vLLM's ``new_kv_cache_spec`` defaults: 2 KV heads, float32."""
    return FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=2,
        head_size=head_size,
        dtype=torch.float32,
        sliding_window=sliding_window,
    )


def sliding_spec(block_size=16, head_size=64, sliding_window=1) -> SlidingWindowSpec:
    """vLLM's ``new_sliding_window_spec`` defaults: 2 KV heads, float32, window 1."""
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=2,
        head_size=head_size,
        dtype=torch.float32,
        sliding_window=sliding_window,
    )


def mamba_spec(state_shape=(3, 100), page_size_padded=None) -> MambaSpec:
    return MambaSpec(
        block_size=16,
        shapes=(state_shape,),
        dtypes=(torch.float32,),
        page_size_padded=page_size_padded,
    )


def layers(*specs: KVCacheSpec) -> dict[str, KVCacheSpec]:
    """``layer_1``, ``layer_2``, ... in order, as vLLM's table names them."""
    return {f"layer_{i}": spec for i, spec in enumerate(specs, start=1)}


def hybrid(num_full: int, num_sliding: int) -> dict[str, KVCacheSpec]:
    """Full-attention layers first, then sliding-window layers (vLLM's table)."""
    return layers(*[full_spec()] * num_full, *[sliding_spec()] * num_sliding)


def group(spec: KVCacheSpec, *layer_numbers: int | str) -> KVCacheGroupSpec:
    names = [f"layer_{n}" if isinstance(n, int) else n for n in layer_numbers]
    return KVCacheGroupSpec(tuple(names), spec)


FULL, SLIDING = full_spec(), sliding_spec()
MIXED_HEADS = layers(full_spec(head_size=128), full_spec(head_size=64))
# The one spec of their group: same type and block size, per-layer sizes kept.
MIXED_HEADS_UNIFORM = UniformTypeKVCacheSpecs(
    block_size=16, kv_cache_specs=tuple(MIXED_HEADS.items())
)

VLLM_TABLE_CASES = [
    pytest.param(hybrid(2, 0), [group(FULL, 1, 2)], id="2full-one-group"),
    pytest.param(hybrid(0, 2), [group(SLIDING, 1, 2)], id="2sliding-one-group"),
    pytest.param(hybrid(1, 1), [group(FULL, 1), group(SLIDING, 2)], id="full+sliding-two-groups"),
    pytest.param(
        hybrid(2, 4),
        [group(FULL, 1, 2), group(SLIDING, 3, 5), group(SLIDING, 4, 6)],
        id="2full+4sliding-strided",
    ),
    pytest.param(
        hybrid(3, 7),
        [
            group(FULL, 1, 2, 3),
            group(SLIDING, 4, 7, 10),
            group(SLIDING, 5, 8),
            group(SLIDING, 6, 9),
        ],
        id="3full+7sliding-last-groups-padded",
    ),
    pytest.param(
        hybrid(6, 5),
        [group(FULL, 1, 2, 3, 4, 5, 6), group(SLIDING, 7, 8, 9, 10, 11)],
        id="6full+5sliding-pad-to-largest-bucket",
    ),
    pytest.param(
        MIXED_HEADS,
        [group(MIXED_HEADS_UNIFORM, 1, 2)],
        id="full-head128+full-head64-uniform-type",
    ),
    pytest.param(
        layers(full_spec(head_size=64), sliding_spec(head_size=32)),
        [group(full_spec(head_size=64), 1), group(sliding_spec(head_size=32, block_size=32), 2)],
        id="full-head64+sliding-head32-block-size-scaled",
    ),
]

RULE_CASES = [
    pytest.param({}, [], id="attention-free-no-groups"),
    pytest.param(
        hybrid(2, 3),
        [group(FULL, 1, 2), group(SLIDING, 3, 5), group(SLIDING, 4)],
        id="2full+3sliding-at-1.5x-splits",
    ),
    pytest.param(
        hybrid(4, 5),
        [group(FULL, 1, 2, 3, 4), group(SLIDING, 5, 6, 7, 8, 9)],
        id="4full+5sliding-below-1.5x-pads",
    ),
    pytest.param(
        layers(SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL),
        [group(SLIDING, 1, 4), group(SLIDING, 2, 5), group(FULL, 3, 6)],
        id="interleaved-pattern-first-seen-bucket-first",
    ),
    pytest.param(
        layers(full_spec(), full_spec(sliding_window=8), *[sliding_spec(sliding_window=8)] * 2),
        [group(full_spec(sliding_window=8), 1, 2), group(sliding_spec(sliding_window=8), 3, 4)],
        id="full-with-and-without-window-buckets-merge",
    ),
    pytest.param(
        layers(full_spec(head_size=32), sliding_spec(head_size=128)),
        [group(full_spec(head_size=32, block_size=64), 1), group(sliding_spec(head_size=128), 2)],
        id="full-head32+sliding-head128-block-size-x4",
    ),
    pytest.param(
        layers(FULL, FULL, mamba_spec(), mamba_spec()),
        [group(FULL, 1, 2), group(mamba_spec(page_size_padded=FULL.page_size_bytes), 3, 4)],
        id="full+mamba-state-page-padded",
    ),
    pytest.param(
        # vLLM #43626 / PR #45207: a state page that divides the largest page must still be
        # padded; scaling a Mamba layer's block size leaves its page (its state) unchanged.
        layers(FULL, FULL, mamba_spec((2, 1024)), mamba_spec((2, 1024))),
        [
            group(FULL, 1, 2),
            group(mamba_spec((2, 1024), page_size_padded=FULL.page_size_bytes), 3, 4),
        ],
        id="full+mamba-state-page-dividing-padded",
    ),
]


@pytest.mark.parametrize(("specs", "expected"), [*VLLM_TABLE_CASES, *RULE_CASES])
def test_kv_cache_groups(engine, specs, expected):
    assert engine.kv_cache_groups(specs, {}) == expected


def test_indivisible_page_sizes_are_refused(engine):
    """vLLM's last table row: a 16 KiB full page and a 24 KiB sliding page cannot
    share one block pool by scaling block sizes. (vLLM >= 0.34 pads the smaller
    page instead; the neutral spec types cannot express a padded attention page.)"""
    specs = layers(full_spec(head_size=64), sliding_spec(head_size=96))
    with pytest.raises(ENGINE_REFUSALS):
        engine.kv_cache_groups(specs, {})


SHARING_CASES = [
    pytest.param(
        hybrid(2, 4),
        {"draft_0": "layer_3", "draft_1": "layer_1"},
        [
            group(FULL, 1, 2, "draft_1"),
            group(SLIDING, 3, 5, "draft_0"),
            group(SLIDING, 4, 6),
        ],
        id="joins-target-group",
    ),
    pytest.param(
        hybrid(2, 4),
        {"draft_b": "layer_6", "draft_a": "layer_4"},
        [group(FULL, 1, 2), group(SLIDING, 3, 5), group(SLIDING, 4, 6, "draft_b", "draft_a")],
        id="appended-in-kv-sharing-order",
    ),
    pytest.param(
        hybrid(1, 1),
        {"draft_0": "layer_2", "draft_1": "draft_0"},
        [group(FULL, 1), group(SLIDING, 2, "draft_0", "draft_1")],
        id="chain-follows-to-owner",
    ),
    pytest.param(
        MIXED_HEADS,
        {"draft_0": "layer_2"},
        [group(MIXED_HEADS_UNIFORM, 1, 2, "draft_0")],
        id="joins-uniform-type-group",
    ),
]


@pytest.mark.parametrize(("specs", "kv_sharing", "expected"), SHARING_CASES)
def test_kv_sharing_layers_join_target_group(engine, specs, kv_sharing, expected):
    assert engine.kv_cache_groups(specs, kv_sharing) == expected


@pytest.mark.parametrize(
    ("kv_sharing", "culprit"),
    [
        pytest.param({"draft_0": "layer_9"}, "layer_9", id="missing-target"),
        pytest.param({"layer_2": "layer_1"}, "layer_2", id="shared-layer-also-has-spec"),
    ],
)
def test_bad_kv_sharing_is_refused(engine, kv_sharing, culprit):
    with pytest.raises(ENGINE_REFUSALS, match=culprit):
        engine.kv_cache_groups(hybrid(1, 1), kv_sharing)


LAYER_KINDS = {
    "full-h32": full_spec(head_size=32),
    "full-h64": full_spec(head_size=64),
    "full-h128": full_spec(head_size=128),
    "sliding4-h64": sliding_spec(head_size=64, sliding_window=4),
    "sliding8-h32": sliding_spec(head_size=32, sliding_window=8),
    "mamba": mamba_spec(state_shape=(4, 64)),
}


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(sorted(LAYER_KINDS)), min_size=1, max_size=14),
    num_shared=st.integers(min_value=0, max_value=3),
)
def test_groups_partition_layers_with_one_page_size(engine, kinds, num_shared):
    """Any mix of unifiable layers: every layer (own spec or KV-sharing) is in
    exactly one group; layers keep spec order; with several groups all pages
    are equal; each layer's group spec is of its own spec's type."""
    specs = layers(*(LAYER_KINDS[kind] for kind in kinds))
    owners = list(specs)
    kv_sharing = {f"draft_{i}": owners[i % len(owners)] for i in range(num_shared)}
    groups = engine.kv_cache_groups(specs, kv_sharing)

    placed = [name for g in groups for name in g.layer_names]
    assert sorted(placed) == sorted([*specs, *kv_sharing])
    for g in groups:
        own_layers = [name for name in g.layer_names if name in specs]
        assert own_layers == sorted(own_layers, key=owners.index)
        assert {type(g.spec_for(name)) for name in own_layers} == {
            type(specs[name]) for name in own_layers
        }
    if len(groups) > 1:
        assert len({g.kv_cache_spec.page_size_bytes for g in groups}) == 1


def test_grouping_is_deterministic_and_leaves_inputs_untouched(engine):
    """Equal inputs built afresh give equal groups, and the caller's mappings
    are not modified (vLLM's own function unifies specs in place)."""
    kv_sharing = {"draft_0": "layer_3", "draft_1": "layer_2"}
    specs = layers(full_spec(head_size=64), *[sliding_spec(head_size=32)] * 4)
    first = engine.kv_cache_groups(specs, kv_sharing)
    assert specs == layers(full_spec(head_size=64), *[sliding_spec(head_size=32)] * 4)
    assert kv_sharing == {"draft_0": "layer_3", "draft_1": "layer_2"}
    again = engine.kv_cache_groups(
        layers(full_spec(head_size=64), *[sliding_spec(head_size=32)] * 4), dict(kv_sharing)
    )
    assert again == first


# --- Reference engine only ----------------------------------------------------------------
# The tests below call attngroup.reference_engine.kv_cache_groups directly: they cover an option
# (disable_hybrid) and error texts that belong to the reference implementation, not the seam.


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        pytest.param(
            hybrid(1, 1), [group(full_spec(sliding_window=1), 1, 2)], id="full+sliding-vllm-row"
        ),
        pytest.param(
            hybrid(2, 4),
            [group(full_spec(sliding_window=1), 1, 2, 3, 4, 5, 6)],
            id="2full+4sliding",
        ),
        pytest.param(hybrid(0, 2), [group(SLIDING, 1, 2)], id="all-sliding-unchanged"),
    ],
)
def test_reference_disable_hybrid_promotes_sliding_window(specs, expected):
    """Reference engine only (vLLM takes this from its scheduler config): sliding
    layers become full attention that keeps the window for compute."""
    assert get_kv_cache_groups(specs, disable_hybrid=True) == expected


def test_reference_disable_hybrid_refuses_what_it_cannot_unify():
    """Reference engine only: full attention + Mamba has no single type."""
    with pytest.raises(KVCacheGroupingError, match=r"disable_hybrid=True.*MambaSpec"):
        get_kv_cache_groups(layers(FULL, mamba_spec()), disable_hybrid=True)


@pytest.mark.parametrize(
    ("specs", "kv_sharing", "message"),
    [
        pytest.param(
            layers(full_spec(head_size=64), sliding_spec(head_size=96)),
            {},
            r"layer 'layer_1' .* page of 16384 bytes.* largest page, 24576 bytes "
            r"\(layer 'layer_2'\); .*choose block sizes",
            id="indivisible-page",
        ),
        pytest.param(
            hybrid(1, 1),
            {"draft_0": "layer_9"},
            r"'draft_0' shares the KV cache of 'layer_9', but 'layer_9' has no KV-cache spec",
            id="missing-target",
        ),
        pytest.param(
            hybrid(1, 1),
            {"draft_0": "draft_1", "draft_1": "layer_9"},
            r"'draft_0' .* 'layer_9' has no .*draft_0 -> draft_1 -> layer_9",
            id="missing-target-at-end-of-chain",
        ),
        pytest.param(
            hybrid(1, 1),
            {"layer_2": "layer_1"},
            r"layer 'layer_2' is in kv_sharing .* also has a KV-cache spec.*remove it",
            id="shared-layer-also-has-spec",
        ),
        pytest.param(
            hybrid(1, 1),
            {"draft_0": "draft_1", "draft_1": "draft_0"},
            r"cycle: draft_0 -> draft_1 -> draft_0",
            id="sharing-cycle",
        ),
        pytest.param(
            {"layer_1": MIXED_HEADS},
            {},
            r"layer 'layer_1': expected one layer's KVCacheSpec .*got dict",
            id="not-a-spec",
        ),
    ],
)
def test_reference_errors_say_what_is_wrong(specs, kv_sharing, message):
    """Reference engine only: our error class (a ValueError) and its texts."""
    with pytest.raises(KVCacheGroupingError, match=message) as caught:
        get_kv_cache_groups(specs, kv_sharing)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        pytest.param(
            [group(FULL, 1, 2), group(SLIDING, 2, 3)],
            r"more than one group \['layer_2'\]",
            id="dup",
        ),
        pytest.param(
            [group(FULL, 1), group(SLIDING, 3)], r"in no group \['layer_2'\]", id="missing"
        ),
        pytest.param([group(FULL, 1, 2, 3, 4)], r"not a layer \['layer_4'\]", id="unknown-layer"),
    ],
)
def test_reference_exact_partition_check(groups, message):
    """Reference engine only: the partition check that guards every result."""
    with pytest.raises(KVCacheGroupingError, match=message):
        check_exact_partition(groups, ["layer_1", "layer_2", "layer_3"])


def test_reference_exact_partition_check_accepts_a_partition():
    """Reference engine only: a strided, padded split is a valid partition."""
    check_exact_partition([group(FULL, 1, 3), group(SLIDING, 2)], ["layer_1", "layer_2", "layer_3"])


def test_reference_merged_bucket_keeps_spec_order():
    """Reference engine only: when buckets merge (full attention with and without a
    window), the merged bucket keeps the layers' spec order, [1, 2, 3]. vLLM appends
    the joining bucket instead, [1, 3, 2]; the seam tests above avoid depending on it."""
    specs = layers(FULL, full_spec(sliding_window=8), FULL, *[sliding_spec(sliding_window=8)] * 3)
    assert get_kv_cache_groups(specs) == [
        group(full_spec(sliding_window=8), 1, 2, 3),
        group(sliding_spec(sliding_window=8), 4, 5, 6),
    ]
