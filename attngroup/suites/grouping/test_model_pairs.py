"""The model-pair registry: real head structures, roles and TP rules."""

from __future__ import annotations

import pytest

from attngroup.kernels.registry import NotAnAttentionBackendError, UnknownBackendError
from attngroup.reference_engine.layers import TensorParallelError, heads_per_rank
from attngroup.reference_engine.model_pairs import (
    BUILTIN_PAIR_NAMES,
    MODEL_PAIRS,
    UnknownModelPairError,
    get_model_pair,
)

pytestmark = pytest.mark.grouping


def heads(pair_name: str, role: str, tp: int = 1) -> set[tuple[int, int, int]]:
    pair = get_model_pair(pair_name)
    names = set(pair.layer_roles(tp)[role])
    return {
        (layer.num_heads_q, layer.num_kv_heads, layer.head_size)
        for layer in pair.layers(tp)
        if layer.name in names and layer.is_attention
    }


@pytest.mark.parametrize(
    ("pair_name", "role", "expected"),
    [
        pytest.param(
            "gemma4-e2b-mtp", "target", {(8, 1, 256), (8, 1, 512)}, id="gemma4-e2b-target"
        ),
        pytest.param("gemma4-e2b-mtp", "draft", {(4, 1, 256), (4, 1, 512)}, id="gemma4-e2b-draft"),
        pytest.param(
            "gemma4-e4b-mtp", "target", {(8, 2, 256), (8, 2, 512)}, id="gemma4-e4b-target"
        ),
        pytest.param("gemma4-e4b-mtp", "draft", {(4, 2, 256), (4, 2, 512)}, id="gemma4-e4b-draft"),
        pytest.param("llama3-eagle", "target", {(32, 8, 128)}, id="llama3-target"),
        pytest.param("llama3-eagle", "draft", {(32, 8, 128)}, id="llama3-eagle-draft"),
        pytest.param("qwen3-8b-draft-1.7b", "draft", {(16, 8, 128)}, id="qwen3-draft-model"),
        pytest.param("qwen3-next-mtp", "draft", {(16, 2, 256)}, id="qwen3-next-mtp-layer"),
        pytest.param("qwen3-mtp", "draft", {(16, 8, 128)}, id="qwen3-mtp-layer"),
    ],
)
def test_pairs_keep_the_real_head_structure(pair_name, role, expected):
    assert heads(pair_name, role) == expected


@pytest.mark.mtp
def test_gemma4_e2b_layout_matches_the_real_model():
    """4 sliding : 1 full, later layers KV-shared, the assistant's 4 layers
    (sliding x3, full) Q-only, reading the last non-shared target layer of
    their type."""
    pair = get_model_pair("gemma4-e2b-mtp")
    layers = {layer.name: layer for layer in pair.layers()}
    target = [layer for layer in layers.values() if layer.name.startswith("model.")]
    assert [layer.sliding_window is None for layer in target[:5]] == [False] * 4 + [True]
    assert [layer.sliding_window is not None for layer in target].count(True) == 4 * len(
        target
    ) // 5
    shared = [layer for layer in target if layer.kv_sharing_target]
    assert shared and target.index(shared[0]) + len(shared) == len(target), (
        "shared layers are the last ones"
    )
    draft = [layer for layer in layers.values() if layer.name.startswith("draft_model.")]
    assert [layer.sliding_window is not None for layer in draft] == [True, True, True, False]
    last_sliding = max(
        (layer for layer in target if not layer.kv_sharing_target and layer.sliding_window),
        key=target.index,
    )
    last_full = max(
        (layer for layer in target if not layer.kv_sharing_target and not layer.sliding_window),
        key=target.index,
    )
    assert [layer.kv_sharing_target for layer in draft] == [last_sliding.name] * 3 + [
        last_full.name
    ]


@pytest.mark.parametrize("pair_name", MODEL_PAIRS)
def test_pairs_are_tiny(pair_name):
    pair = get_model_pair(pair_name)
    for config in (pair.target_config(), pair.draft_config()):
        text = getattr(config, "text_config", config)
        assert text.hidden_size <= 256 and text.vocab_size <= 1024 and text.num_hidden_layers <= 16


@pytest.mark.parametrize(
    ("pair_name", "expect_mixed"),
    [
        (name, name in {"gemma4-e2b-mtp", "gemma4-e4b-mtp", "qwen3-8b-draft-1.7b"})
        for name in BUILTIN_PAIR_NAMES
    ],
    ids=list(BUILTIN_PAIR_NAMES),
)
def test_mixed_pairs_are_flagged(pair_name, expect_mixed):
    assert get_model_pair(pair_name).is_mixed is expect_mixed


@pytest.mark.parametrize(
    ("pair_name", "tp", "draft_heads"),
    [("gemma4-e2b-mtp", 2, 2), ("gemma4-e2b-mtp", 4, 1), ("qwen3-8b-draft-1.7b", 8, 2)],
    ids=["gemma4-e2b-tp2", "gemma4-e2b-tp4", "qwen3-draft-tp8"],
)
def test_heads_divide_per_rank(pair_name, tp, draft_heads):
    assert {h[0] for h in heads(pair_name, "draft", tp)} == {draft_heads}


@pytest.mark.parametrize(
    ("num_heads_q", "num_kv_heads", "tp", "expected"),
    [(32, 8, 2, (16, 4)), (8, 1, 4, (2, 1)), (8, 2, 4, (2, 1)), (16, 8, 8, (2, 1))],
    ids=["split-both", "replicate-one-kv", "replicate-two-kv", "even"],
)
def test_heads_per_rank(num_heads_q, num_kv_heads, tp, expected):
    assert heads_per_rank("layer", num_heads_q, num_kv_heads, tp) == expected


@pytest.mark.parametrize(
    ("num_heads_q", "num_kv_heads", "tp", "match"),
    [
        (8, 1, 3, r"model.layers.0.self_attn.attn: 8 query heads do not divide over tp=3"),
        (12, 6, 4, r"model.layers.0.self_attn.attn: 6 KV heads do not divide over tp=4"),
        (
            12,
            4,
            6,
            r"model.layers.0.self_attn.attn: 4 KV heads cannot be replicated evenly over tp=6",
        ),
        (8, 1, 0, r"tensor-parallel size must be >= 1, got 0"),
    ],
    ids=["q-indivisible", "kv-indivisible", "kv-not-replicable", "tp-zero"],
)
def test_indivisible_tp_names_layer_and_numbers(num_heads_q, num_kv_heads, tp, match):
    with pytest.raises(TensorParallelError, match=match):
        heads_per_rank("model.layers.0.self_attn.attn", num_heads_q, num_kv_heads, tp)


def test_pair_refuses_unsupported_tp():
    pair = get_model_pair("gemma4-e2b-mtp")
    assert 8 not in pair.supported_tp_sizes
    with pytest.raises(TensorParallelError, match="4 query heads do not divide over tp=8"):
        pair.layers(8)


def test_unknown_pair_lists_the_known_ones():
    with pytest.raises(UnknownModelPairError, match="known pairs: gemma4-e2b-mtp"):
        get_model_pair("gemma5")


@pytest.mark.parametrize(
    ("backend", "error", "match"),
    [
        ("mamba", NotAnAttentionBackendError, "'mamba' serves state layers, not attention layers"),
        ("bogus", UnknownBackendError, "unknown attention backend 'bogus'"),
    ],
    ids=["state-backend", "unknown-backend"],
)
def test_attention_layers_refuse_a_backend_that_is_not_attention(backend, error, match):
    with pytest.raises(error, match=match):
        get_model_pair("qwen3-next-mtp").layers(1, backend)
