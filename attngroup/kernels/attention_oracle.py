"""The numerical oracle: paged attention computed plainly, in float64 by default.

It reads the cache the same way the kernels do (through the block table; layout in
``attngroup.kernels.cache_layout``) but with ordinary torch ops, one request at a time, so it is
slow and easy to check by eye. It gathers only the key positions some query of a request can
see, so cache slots outside them (unused blocks, the tail of the last block, blocks that slid
out of a window) may hold anything, NaN included.

Semantics (vLLM's batch description): the query tokens of request ``r`` are the last
``query_len_r`` positions of its sequence; a query at position ``i`` sees key position ``j``
when ``j <= i`` and, with a sliding window ``W`` (Hugging Face convention, the window counts
the current token), ``i - W < j``. Scores are ``sm_scale * q.k``, then soft-capped
(``c * tanh(s / c)``), then masked. Query head ``h`` reads kv head
``h // (num_heads_q // num_kv_heads)``.
"""

from __future__ import annotations

import torch

from attngroup.kernels.cache_layout import check_query_against_cache


def paged_attention_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    *,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Attention of ``query`` [num_tokens, num_heads_q, head_size] over the paged cache.

    Returns [num_tokens, num_heads_q, head_size] in ``compute_dtype``.
    """
    check_query_against_cache(query, key_cache, value_cache)
    _check_step(query.shape[0], key_cache.shape[1], query_start_loc, seq_lens, block_table)
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None; got {sliding_window}")
    if logits_soft_cap is not None and logits_soft_cap <= 0:
        raise ValueError(f"logits_soft_cap must be > 0 or None; got {logits_soft_cap}")

    block_size = key_cache.shape[1]
    group_size = query.shape[1] // key_cache.shape[2]
    starts = query_start_loc.tolist()
    lengths = seq_lens.tolist()
    output = torch.empty(query.shape, dtype=compute_dtype, device=query.device)
    for request, seq_len in enumerate(lengths):
        q_start, q_end = starts[request], starts[request + 1]
        if q_end == q_start:
            continue
        first_query_pos = seq_len - (q_end - q_start)
        first_key_pos = (
            0 if sliding_window is None else max(0, first_query_pos - sliding_window + 1)
        )
        key_pos = torch.arange(first_key_pos, seq_len, device=query.device)
        blocks = block_table[request, key_pos // block_size].long()
        offsets = key_pos % block_size
        keys = key_cache[blocks, offsets].to(compute_dtype).repeat_interleave(group_size, dim=1)
        values = value_cache[blocks, offsets].to(compute_dtype).repeat_interleave(group_size, dim=1)

        scores = torch.einsum("qhd,khd->hqk", query[q_start:q_end].to(compute_dtype), keys)
        scores = scores * sm_scale
        if logits_soft_cap is not None:
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
        query_pos = torch.arange(first_query_pos, seq_len, device=query.device)[:, None]
        visible = key_pos[None, :] <= query_pos
        if sliding_window is not None:
            visible &= query_pos - key_pos[None, :] < sliding_window
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        output[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, values)
    return output


def _check_step(
    num_tokens: int,
    block_size: int,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> None:
    """Reject a step whose per-request tensors disagree, with a message that names the problem."""
    num_reqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_reqs + 1,) or block_table.shape[0] != num_reqs:
        raise ValueError(
            f"{num_reqs} seq_lens need query_start_loc of {num_reqs + 1} entries and "
            f"{num_reqs} block-table rows; got {tuple(query_start_loc.shape)} and "
            f"{tuple(block_table.shape)}"
        )
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    if int(query_start_loc[0]) != 0 or int(query_start_loc[-1]) != num_tokens:
        raise ValueError(
            f"query_start_loc must run from 0 to num_tokens {num_tokens}; "
            f"got {query_start_loc.tolist()}"
        )
    if bool((query_lens < 0).any()) or bool((query_lens > seq_lens).any()):
        raise ValueError(
            f"every query length must lie in [0, seq_len]; query lengths {query_lens.tolist()}, "
            f"seq_lens {seq_lens.tolist()}"
        )
    capacity = block_table.shape[1] * block_size
    if num_reqs and int(seq_lens.max()) > capacity:
        raise ValueError(
            f"a sequence of {int(seq_lens.max())} tokens does not fit a block table of "
            f"{block_table.shape[1]} blocks of {block_size}"
        )
