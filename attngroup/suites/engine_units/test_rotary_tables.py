"""Rotary embeddings: the three-kernel rotation equals the rotate-half form, and a decoder
stack's per-forward tables serve every layer of a frequency set.

The stack makes the cos/sin tables once per forward (``with_rotary_tables``) and each layer
only applies them, so the tables must be exactly what a layer would compute for itself, be
shared only between equal frequency sets, and follow positions written in place between
forwards (a captured step's persistent buffers)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attngroup.reference_engine.models.common import (
    ForwardContext,
    RotaryEmbedding,
    default_inv_freq,
    distinct_rotaries,
    proportional_inv_freq,
    with_rotary_tables,
)

HEAD_SIZE = 128
FREQUENCIES = {
    "default": default_inv_freq(10_000.0, HEAD_SIZE),
    "proportional": proportional_inv_freq(1_000_000.0, HEAD_SIZE, 0.25),  # zeros: no rotation
    "partial": default_inv_freq(10_000.0, HEAD_SIZE // 4),  # rotates the first 32 dims only
}


def context(positions: torch.Tensor) -> ForwardContext:
    return ForwardContext(positions=positions, attn_metadata={}, kv_caches={}, slot_mappings={})


def rotate_half_oracle(x: torch.Tensor, inv_freq: torch.Tensor, positions: torch.Tensor):
    """NeoX rotation in float64, as transformers writes it; the angles are float32 products
    there (their rounding at large positions is the model's, not the rotation's)."""
    x, rotary_dim = x.double(), 2 * inv_freq.shape[0]
    angles = (positions.float()[:, None] * inv_freq.float()[None, :]).double()
    emb = torch.cat([angles, angles], dim=-1)[:, None, :]
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotate_half = torch.cat([-rotated[..., half:], rotated[..., :half]], dim=-1)
    return torch.cat([rotated * emb.cos() + rotate_half * emb.sin(), passed], dim=-1)


@pytest.mark.parametrize("name", list(FREQUENCIES))
def test_rotation_matches_the_rotate_half_oracle(name: str) -> None:
    inv_freq = FREQUENCIES[name]
    positions = torch.randint(0, 32_768, (9,))
    x = torch.randn(9, 3, HEAD_SIZE)
    out = RotaryEmbedding(inv_freq)(x, context(positions))
    expected = rotate_half_oracle(x, inv_freq, positions)
    assert float((out.double() - expected).norm() / expected.norm()) < 1e-5


def test_a_stack_shares_one_table_per_frequency_set() -> None:
    layers = nn.ModuleList(
        RotaryEmbedding(FREQUENCIES[name]) for name in ("default", "partial", "default")
    )
    shared = distinct_rotaries(layers)
    assert [m.table_key for m in layers] == [0, 1, 0]
    assert shared == (layers[0], layers[1])
    positions = torch.randint(0, 4096, (5,))
    ctx = with_rotary_tables(context(positions), shared, torch.float32)
    assert sorted(ctx.rotary_tables) == [(0, torch.float32), (1, torch.float32)]
    x = torch.randn(5, 2, HEAD_SIZE)
    for layer in layers:  # each layer's output from the shared table equals its own
        assert torch.equal(layer(x, ctx), layer(x, context(positions)))


def test_a_layer_applies_the_stacks_table() -> None:
    """The table in the context is the one used (a planted table changes the output)."""
    (layer,) = layers = nn.ModuleList([RotaryEmbedding(FREQUENCIES["default"])])
    ctx = with_rotary_tables(context(torch.arange(4)), distinct_rotaries(layers), torch.float32)
    x = torch.randn(4, 1, HEAD_SIZE)
    cos, sin = ctx.rotary_tables[(0, torch.float32)]
    planted = ForwardContext(
        positions=ctx.positions,
        attn_metadata={},
        kv_caches={},
        slot_mappings={},
        rotary_tables={(0, torch.float32): (cos, -sin)},
    )
    assert not torch.allclose(layer(x, planted), layer(x, ctx))


def test_tables_follow_positions_written_in_place() -> None:
    """A captured step's context keeps one positions buffer; every forward makes new tables."""
    layers = nn.ModuleList([RotaryEmbedding(FREQUENCIES["default"])])
    shared, buffer = distinct_rotaries(layers), torch.arange(6)
    persistent = context(buffer)
    x = torch.randn(6, 2, HEAD_SIZE)
    first = layers[0](x, with_rotary_tables(persistent, shared, torch.float32))
    buffer.copy_(torch.arange(100, 106))
    second = layers[0](x, with_rotary_tables(persistent, shared, torch.float32))
    assert not torch.allclose(first, second)
    expected = rotate_half_oracle(x, FREQUENCIES["default"], buffer)
    assert float((second.double() - expected).norm() / expected.norm()) < 1e-5
