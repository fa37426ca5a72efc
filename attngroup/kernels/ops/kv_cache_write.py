"""Writing new keys and values into the paged KV cache, laid out as ``attngroup.kernels.cache_layout``
says: one Triton program scatters a block of tokens."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attngroup.kernels.cache_layout import PADDING_SLOT
from attngroup.kernels.ops import COMPILER_OPTIONS


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    validate: bool = False,
) -> None:
    """Scatter ``key``/``value`` [num_tokens, num_kv_heads, head_size] into the caches.

    The first ``slot_mapping.shape[0]`` tokens are written (``key`` may hold more rows, as a
    CUDA-graph-padded batch does). Slots other than -1 must lie in ``[0, num_blocks *
    block_size)``; the kernel never writes outside the cache, and ``validate=True`` turns a bad
    slot into a ValueError (it reads ``slot_mapping`` on the host, so it syncs the device).
    """
    _check_shapes(key, value, key_cache, value_cache, slot_mapping)
    num_tokens = slot_mapping.shape[0]
    num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
    num_slots = num_blocks * block_size
    if validate:
        _check_slots(slot_mapping, num_slots)
    if num_tokens == 0:
        return
    heads_padded = triton.next_power_of_2(num_kv_heads)
    head_size_padded = triton.next_power_of_2(head_size)
    tokens_per_program = _tokens_per_program(heads_padded * head_size_padded)
    _write_kv_cache_kernel[(triton.cdiv(num_tokens, tokens_per_program),)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        num_slots,
        num_tokens,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *key_cache.stride()[:3],  # block, offset in block, head
        *value_cache.stride()[:3],
        NUM_KV_HEADS=num_kv_heads,
        NUM_KV_HEADS_PADDED=heads_padded,
        BLOCK_SIZE=block_size,
        HEAD_SIZE=head_size,
        HEAD_SIZE_PADDED=head_size_padded,
        TOKENS=tokens_per_program,
        **COMPILER_OPTIONS,
    )


def _tokens_per_program(elements_per_token: int) -> int:
    """Tokens one program copies: all KV heads of up to 16 tokens, at most
    16k elements of each of K and V in flight. Few, wide programs matter most
    under the Triton interpreter, where each program costs milliseconds."""
    tokens = 16
    while tokens > 1 and tokens * elements_per_token > 16384:
        tokens //= 2
    return tokens


def _check_shapes(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            "key_cache and value_cache must both be [num_blocks, block_size, num_kv_heads, "
            f"head_size]; got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    expected = tuple(key_cache.shape[2:])
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dim() != 3 or tuple(tensor.shape[1:]) != expected:
            raise ValueError(
                f"{name} must be [num_tokens, num_kv_heads, head_size] = [*, {expected[0]}, "
                f"{expected[1]}] to match the cache; got {tuple(tensor.shape)}"
            )
        if tensor.dtype != key_cache.dtype:
            raise ValueError(
                f"{name} dtype {tensor.dtype} differs from the cache's {key_cache.dtype}"
            )
    named = {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache}
    for name, tensor in named.items():
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its head dimension")
    if value_cache.dtype != key_cache.dtype:
        raise ValueError("key_cache and value_cache must share a dtype")
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"slot_mapping must be a 1-D int32/int64 tensor; got {slot_mapping.dtype} "
            f"{tuple(slot_mapping.shape)}"
        )
    if slot_mapping.shape[0] > key.shape[0] or value.shape[0] != key.shape[0]:
        raise ValueError(
            f"slot_mapping has {slot_mapping.shape[0]} tokens but key has {key.shape[0]} and "
            f"value {value.shape[0]} rows"
        )


def _check_slots(slot_mapping: torch.Tensor, num_slots: int) -> None:
    bad = slot_mapping[(slot_mapping < PADDING_SLOT) | (slot_mapping >= num_slots)]
    if bad.numel():
        raise ValueError(
            f"slot_mapping holds slots outside [0, {num_slots}) other than padding "
            f"({PADDING_SLOT}): {bad[:8].tolist()}"
        )


@triton.jit(do_not_specialize=["num_tokens"])
def _write_kv_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    num_slots,
    num_tokens,
    stride_key_token,
    stride_key_head,
    stride_value_token,
    stride_value_head,
    stride_key_cache_block,
    stride_key_cache_offset,
    stride_key_cache_head,
    stride_value_cache_block,
    stride_value_cache_offset,
    stride_value_cache_head,
    NUM_KV_HEADS: tl.constexpr,
    NUM_KV_HEADS_PADDED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_SIZE_PADDED: tl.constexpr,
    TOKENS: tl.constexpr,
):
    """One program copies TOKENS tokens x all KV heads of key and value;
    slot -1 (padding) and out-of-range slots are skipped."""
    tokens = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    in_batch = tokens < num_tokens
    slots = tl.load(slot_mapping_ptr + tokens, mask=in_batch, other=-1).to(tl.int64)
    valid = in_batch & (slots >= 0) & (slots < num_slots)
    block = (slots // BLOCK_SIZE)[:, None, None]
    offset = (slots % BLOCK_SIZE)[:, None, None]
    heads = tl.arange(0, NUM_KV_HEADS_PADDED)[None, :, None]
    dims = tl.arange(0, HEAD_SIZE_PADDED)[None, None, :]
    mask = valid[:, None, None] & (heads < NUM_KV_HEADS) & (dims < HEAD_SIZE)
    token64 = tokens.to(tl.int64)[:, None, None]

    key_rows = tl.load(
        key_ptr + token64 * stride_key_token + heads * stride_key_head + dims, mask=mask
    )
    tl.store(
        key_cache_ptr
        + block * stride_key_cache_block
        + offset * stride_key_cache_offset
        + heads * stride_key_cache_head
        + dims,
        key_rows,
        mask=mask,
    )
    value_rows = tl.load(
        value_ptr + token64 * stride_value_token + heads * stride_value_head + dims, mask=mask
    )
    tl.store(
        value_cache_ptr
        + block * stride_value_cache_block
        + offset * stride_value_cache_offset
        + heads * stride_value_cache_head
        + dims,
        value_rows,
        mask=mask,
    )
