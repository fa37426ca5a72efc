"""The paged KV-cache layout every backend, op and the engine share (vLLM's NHD layout):

    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size], two separate tensors
    (they may be views of one [num_blocks, 2, block_size, num_kv_heads, head_size] tensor; only
    the head dimension has to be contiguous).

Token position ``p`` of request ``r`` lives in block ``block_table[r, p // block_size]`` at offset
``p % block_size``. A token's *slot* is ``block_id * block_size + offset``: the index of its row
in the cache viewed as ``[num_blocks * block_size, num_kv_heads, head_size]``. ``slot_mapping``
gives one slot per new token; ``-1`` marks a padding token (CUDA-graph padding, a skipped draft)
whose key and value are not written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PADDING_SLOT = -1


def check_query_against_cache(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> None:
    """Queries [num_tokens, num_heads_q, head_size] fit caches of the layout above
    (same head size, query heads a multiple of KV heads): shared by every kernel."""
    if query.dim() != 3:
        raise ValueError(f"query must be [num_tokens, num_heads_q, head_size]; got {query.shape}")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            "key_cache and value_cache must be [num_blocks, block_size, num_kv_heads, head_size] "
            f"alike; got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    num_heads_q, head_size = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != head_size:
        raise ValueError(f"query head size {head_size} != cache head size {key_cache.shape[3]}")
    if num_heads_q % num_kv_heads:
        raise ValueError(
            f"num_heads_q {num_heads_q} is not a multiple of num_kv_heads {num_kv_heads}"
        )
