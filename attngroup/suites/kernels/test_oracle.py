"""The oracle against independent computations: torch's SDPA on the dense K/V, and closed
forms for the soft cap, the sliding window and the GQA head mapping."""

from __future__ import annotations

import math
from typing import TypedDict

import pytest
import torch
import torch.nn.functional as F

from attngroup.kernels.attention_oracle import paged_attention_reference
from attngroup.suites.kernels.batches import (
    BATCHES_CPU,
    BatchMetadata,
    BatchSpec,
    PagedBatch,
    make_paged_batch,
)

pytestmark = pytest.mark.kernels


def _batch(
    kind: str,
    num_heads_q: int,
    num_kv_heads: int,
    window: int | None = None,
    head_size: int = 32,
    block_size: int = 16,
) -> PagedBatch:
    return make_paged_batch(
        BATCHES_CPU[kind],
        num_heads_q=num_heads_q,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
        dtype=torch.float64,
        seed=num_heads_q * 100 + num_kv_heads,
        sliding_window=window,
    )


def _dense_sdpa(batch: PagedBatch, sm_scale: float, window: int | None) -> torch.Tensor:
    """Per request, SDPA over the dense K/V the cache was filled from, with an explicit mask."""
    outputs = []
    starts = batch.query_start_loc.tolist()
    for request, seq_len in enumerate(batch.spec.seq_lens):
        query = batch.query[starts[request] : starts[request + 1]]
        query_pos = torch.arange(seq_len - query.shape[0], seq_len)[:, None]
        key_pos = torch.arange(seq_len)[None, :]
        mask = key_pos <= query_pos
        if window is not None:
            mask &= key_pos > query_pos - window
        out = F.scaled_dot_product_attention(
            query.transpose(0, 1),
            batch.keys[request].transpose(0, 1),
            batch.values[request].transpose(0, 1),
            attn_mask=mask,
            scale=sm_scale,
            enable_gqa=True,
        )
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs)


@pytest.mark.parametrize("window", [None, 1, 7, 24], ids=["full", "swa1", "swa7", "swa24"])
@pytest.mark.parametrize(
    ("num_heads_q", "num_kv_heads"),
    [(8, 1), (4, 2), (6, 2), (4, 4)],
    ids=["hq8-hkv1", "hq4-hkv2", "hq6-hkv2", "hq4-hkv4"],
)
@pytest.mark.parametrize("kind", list(BATCHES_CPU))
def test_oracle_matches_dense_sdpa(
    kind: str, num_heads_q: int, num_kv_heads: int, window: int | None
) -> None:
    batch = _batch(kind, num_heads_q, num_kv_heads, window)
    sm_scale = 0.3
    result = paged_attention_reference(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        **batch.metadata(),
        sm_scale=sm_scale,
        sliding_window=window,
    )
    expected = _dense_sdpa(batch, sm_scale, window)
    torch.testing.assert_close(result, expected, rtol=1e-10, atol=1e-12)


def test_soft_cap_closed_form() -> None:
    """One query, two keys, head size 1: weights are exp(c * tanh(s_i / c)) normalised."""
    cap, sm_scale = 2.0, 1.5
    key_cache = torch.zeros(2, 16, 1, 1, dtype=torch.float64)
    value_cache = torch.zeros_like(key_cache)
    key_cache[1, :2, 0, 0] = torch.tensor([3.0, -1.0])
    value_cache[1, :2, 0, 0] = torch.tensor([10.0, -4.0])
    query = torch.tensor([[[0.7]]], dtype=torch.float64)
    result = paged_attention_reference(
        query,
        key_cache,
        value_cache,
        query_start_loc=torch.tensor([0, 1]),
        seq_lens=torch.tensor([2]),
        block_table=torch.tensor([[1]]),
        sm_scale=sm_scale,
        logits_soft_cap=cap,
    )
    weights = [math.exp(cap * math.tanh(0.7 * k * sm_scale / cap)) for k in (3.0, -1.0)]
    expected = (weights[0] * 10.0 + weights[1] * -4.0) / sum(weights)
    assert result.item() == pytest.approx(expected, rel=1e-12)


def test_window_of_one_sees_only_the_current_token() -> None:
    """Hugging Face convention: the window counts the current token, so W=1 returns V[i]."""
    batch = _batch("chunked", 4, 2, window=1)
    result = paged_attention_reference(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        **batch.metadata(),
        sm_scale=1.0,
        sliding_window=1,
    )
    own_values = [
        values[seq_len - query_len :]
        for values, seq_len, query_len in zip(
            batch.values, batch.spec.seq_lens, batch.spec.query_lens, strict=True
        )
    ]
    expected = torch.cat(own_values).repeat_interleave(2, dim=1)
    torch.testing.assert_close(result, expected, rtol=0, atol=1e-12)


def test_query_head_reads_kv_head_by_integer_division() -> None:
    """With values constant per KV head, query head h returns KV head h // G's constant."""
    batch = _batch("verify", 6, 3)
    value_cache = torch.arange(3, dtype=torch.float64).view(1, 1, 3, 1).expand_as(batch.value_cache)
    result = paged_attention_reference(
        batch.query, batch.key_cache, value_cache, **batch.metadata(), sm_scale=0.2
    )
    expected_heads = torch.tensor([0, 0, 1, 1, 2, 2], dtype=torch.float64)
    torch.testing.assert_close(result, expected_heads.view(1, 6, 1).expand_as(result))


class _OracleArguments(BatchMetadata):
    """The oracle's keyword arguments that both precisions share, typed per key."""

    sm_scale: float
    logits_soft_cap: float
    sliding_window: int


def test_compute_dtype_float32_is_close_to_float64() -> None:
    batch = _batch("prefill", 8, 2, head_size=64)
    arguments: _OracleArguments = {
        **batch.metadata(),
        "sm_scale": 0.125,
        "logits_soft_cap": 5.0,
        "sliding_window": 9,
    }
    result = paged_attention_reference(
        batch.query.float(),
        batch.key_cache.float(),
        batch.value_cache.float(),
        compute_dtype=torch.float32,
        **arguments,
    )
    expected = paged_attention_reference(
        batch.query, batch.key_cache, batch.value_cache, **arguments
    )
    assert result.dtype == torch.float32
    torch.testing.assert_close(result.double(), expected, rtol=1e-5, atol=1e-6)


class _MetadataOverrides(TypedDict, total=False):
    """Some of a batch's metadata, replaced to make the batch inconsistent."""

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor


METADATA_ERRORS: dict[str, tuple[_MetadataOverrides, str]] = {
    "query-start-loc-short-of-tokens": (
        dict(query_start_loc=torch.tensor([0, 3, 7])),
        "query_start_loc must run from 0 to num_tokens 8",
    ),
    "query-longer-than-sequence": (
        dict(seq_lens=torch.tensor([10, 4])),
        "every query length must lie in",
    ),
    "block-table-too-narrow": (
        dict(block_table=torch.zeros(2, 1, dtype=torch.int32)),
        "does not fit a block table of 1 blocks",
    ),
    "missing-request-row": (
        dict(block_table=torch.zeros(1, 4, dtype=torch.int32)),
        "block-table rows",
    ),
}


@pytest.mark.parametrize(
    ("overrides", "message"), list(METADATA_ERRORS.values()), ids=list(METADATA_ERRORS)
)
def test_inconsistent_metadata_raises(overrides: _MetadataOverrides, message: str) -> None:
    batch = make_paged_batch(
        BatchSpec((10, 5), (3, 5)),
        num_heads_q=2,
        num_kv_heads=1,
        head_size=8,
        block_size=4,
        dtype=torch.float64,
    )
    with pytest.raises(ValueError, match=message):
        paged_attention_reference(
            batch.query,
            batch.key_cache,
            batch.value_cache,
            **(batch.metadata() | overrides),
            sm_scale=1.0,
        )
