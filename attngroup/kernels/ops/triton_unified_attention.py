"""Triton unified paged attention: one kernel family for prefill, decode and spec-decode verify.

Cache layout and batch description: see ``attngroup.kernels.cache_layout`` and ``attngroup.kernels.attention_oracle``.

How the work is cut:

* GQA packing. A program owns one KV head and a *q-block*: ``block_q`` consecutive query tokens
  of one request times the ``G = num_heads_q // num_kv_heads`` query heads that read that KV
  head. Row ``m`` of the program is token ``m // G``, head ``kv_head * G + m % G``; the
  ``block_m >= 16`` rows feed one ``tl.dot`` per KV tile, so each K/V tile is read once per
  (q-block, KV head): verify with q_len <= 8 reads the KV once, like decode.
* 2D path, grid ``(q-blocks, num_kv_heads)``: each program scans its whole key range with an
  online softmax and writes the normalised output.
* 3D (split-KV) path, grid ``(q-blocks, num_kv_heads, segments)``: each program scans one
  segment of the key range and writes an unnormalised partial output, its running max (in
  base-2 log units) and its exp-sum to the caller's ``SplitKVScratch``; a fused merge kernel,
  grid ``(tokens, num_heads_q)``, combines the segments. It serves decode and short verify
  (``max_query_len <= 8``), where the 2D grid has too few programs to fill the GPU.
* The 2D q-block grid axis is the host-side upper bound ``num_tokens // block_q + num_seqs``
  (vLLM's trick), so a launch needs no device sync; programs find their request by binary
  search over ``query_start_loc`` and surplus programs exit. The split-KV path serves short
  queries only, so its axis is exact: ``cdiv(max_query_len, block_q)`` q-blocks per request,
  found by division (no search, and no idle programs taking a slot in the waves: decode at
  G = 8 used to launch a third of its programs only for them to exit).
* Value split (``VALUE_SPLITS`` > 1, wide heads): the ``VALUE_SPLITS`` programs of one
  (q-block, KV head[, segment]) are neighbours on grid axis 0; each reads all of K (the
  neighbours' reads of the same tile meet in L2) and computes the same softmax, but owns
  ``HEAD_SIZE_PADDED / VALUE_SPLITS`` columns of V and of the output, so its float32
  accumulator, the register cost that limits occupancy at head 512, shrinks by that factor.
  FlashInfer's FA2 kernel splits the same way across the warps of one CTA.
* Block-table prefetch (``PREFETCH_BLOCK_TABLE``): a tile's physical block numbers are read
  in the iteration before it, so the K and V loads of a tile depend on no load of their own
  iteration and Triton's pipeliner can give them more than one shared-memory buffer.
* Only the key positions some row of the q-block can see are loaded (causal end, sliding-window
  start), through the block table, so cache slots outside them may hold anything.

Every decision of a call (path, grids, tile sizes, rows per program, warps, stages, segment
counts, compile-time constants) is made by ``attngroup.kernels.ops.triton_launch_plan.plan_launch`` without a
device; this module holds the kernels and ``launch``, which turns a plan into kernel calls.
Pass ``config=`` (a ``attngroup.kernels.ops.triton_launch_config.LaunchConfig``) to tune without editing the
kernels.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from attngroup.kernels.ops.split_kv_scratch import SplitKVScratch
from attngroup.kernels.ops.triton_launch_config import MAX_3D_QUERY_LEN, LaunchConfig
from attngroup.kernels.ops.triton_launch_plan import AttentionTensors, LaunchPlan, plan_launch
from attngroup.kernels.ops.triton_occupancy import measure_wave_slots


def unified_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    *,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    sm_scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    scratch: SplitKVScratch | None = None,
    path: Literal["auto", "2d", "3d"] = "auto",
    seq_threshold_3d: int | None = None,
    max_3d_query_len: int = MAX_3D_QUERY_LEN,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Paged attention of ``query`` [num_tokens, num_heads_q, head_size] into ``output``.

    ``max_query_len`` and ``max_seq_len`` are host-side bounds of the batch (as in vLLM's
    metadata), so nothing here syncs the device; they must bound every request (the split-KV
    grid and segments are sized by them). Output rows of tokens past
    ``query_start_loc[-1]`` (CUDA-graph padding) are left untouched. Returns ``output``.
    """
    tensors = AttentionTensors(
        query, key_cache, value_cache, output, query_start_loc, seq_lens, block_table, scratch
    )
    plan = plan_launch(
        tensors,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        sm_scale=sm_scale,
        wave_slots=partial(wave_slots_of, tensors),
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        path=path,
        seq_threshold_3d=seq_threshold_3d,
        max_3d_query_len=max_3d_query_len,
        config=config,
    )
    if plan is not None:
        launch(plan, tensors)
    return output


def launch(plan: LaunchPlan, tensors: AttentionTensors) -> None:
    """Run ``plan`` on ``tensors``: the attention kernel, then on the split-KV path the merge."""
    attention = plan.attention
    _unified_attention_kernel[attention.grid](
        *_attention_arguments(plan, tensors), **attention.constexprs, **attention.options
    )
    if plan.merge is not None:
        _merge_segments_kernel[plan.merge.grid](
            *_merge_arguments(plan, tensors), **plan.merge.constexprs, **plan.merge.options
        )


def wave_slots_of(tensors: AttentionTensors, plan: LaunchPlan) -> int:
    """The occupancy probe of ``plan_launch``: programs of the planned attention kernel the
    tensors' device runs at once (compiles the kernel variant once on a GPU)."""
    return measure_wave_slots(
        _unified_attention_kernel,
        _attention_arguments(plan, tensors),
        plan.attention.constexprs,
        plan.attention.options,
        tensors.query.device,
    )


def kernel_resources(plan: LaunchPlan, tensors: AttentionTensors) -> tuple[int, int]:
    """Registers per thread and shared-memory bytes of the planned attention kernel (compiles
    it on a GPU if needed), for benchmark reports."""
    compiled = _unified_attention_kernel.warmup(
        *_attention_arguments(plan, tensors),
        grid=(1,),
        **plan.attention.constexprs,
        **plan.attention.options,
    )
    compiled._init_handles()
    return compiled.n_regs, compiled.metadata.shared


def _segment_buffers(plan: LaunchPlan, tensors: AttentionTensors) -> tuple[torch.Tensor, ...]:
    """The split-KV scratch buffers; the 2D kernel never touches them, so it gets the output."""
    scratch = tensors.scratch
    if plan.path == "2d":
        return (tensors.output,) * 3
    assert scratch is not None  # plan_launch plans split-KV only with scratch
    return (scratch.segm_output, scratch.segm_max, scratch.segm_expsum)


def _cache_arguments(plan: LaunchPlan, tensors: AttentionTensors) -> tuple:
    """The key and value caches as the kernel takes them: pointers, or (``tma_kv``) tensor
    descriptors whose box is one page of one KV head (V: one value part's columns)."""
    if not plan.config.tma_kv:
        return tensors.key_cache, tensors.value_cache
    # The plan refused tma_kv unless the head size is a power of two (its padded width).
    _, page, _, width = tensors.key_cache.shape
    return tuple(
        TensorDescriptor(
            cache,
            [cache.shape[0], cache.shape[1], cache.shape[2] * cache.shape[3]],
            [cache.stride(0), cache.stride(1), 1],
            [1, page, box],
        )
        for cache, box in (
            (tensors.key_cache, width),
            (tensors.value_cache, width // plan.config.value_splits),
        )
    )


def _merge_arguments(plan: LaunchPlan, tensors: AttentionTensors) -> list:
    """The merge kernel's runtime arguments, in its signature's order."""
    output = tensors.output
    return [
        output,
        *_segment_buffers(plan, tensors),
        tensors.query_start_loc,
        plan.num_seqs,
        plan.num_segments,
        output.stride(0),
        output.stride(1),
    ]


def _attention_arguments(plan: LaunchPlan, tensors: AttentionTensors) -> list:
    """The attention kernel's runtime arguments, in its signature's order."""
    query, output = tensors.query, tensors.output
    return [
        output,
        query,
        *_cache_arguments(plan, tensors),
        tensors.block_table,
        tensors.seq_lens,
        tensors.query_start_loc,
        *_segment_buffers(plan, tensors),
        plan.qk_scale,
        plan.soft_cap,
        plan.sliding_window,
        plan.num_seqs,
        plan.num_segments,
        plan.q_blocks_per_seq,
        query.stride(0),
        query.stride(1),
        output.stride(0),
        output.stride(1),
        *tensors.key_cache.stride()[:3],  # block, offset in block, head
        *tensors.value_cache.stride()[:3],
        tensors.block_table.stride(0),
    ]


@triton.jit
def _find_request(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """The request that owns global q-block ``q_block``: the last ``r`` whose first q-block,
    ``query_start_loc[r] // BLOCK_Q + r``, is at most ``q_block``."""
    low: tl.int32 = 0
    high = num_seqs
    while low < high:
        mid = (low + high) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block:
            low = mid + 1
        else:
            high = mid
    return low - 1


@triton.jit
def _physical_blocks(block_table_row, key_pos, kv_start, kv_end, BLOCK_SIZE: tl.constexpr):
    """[keys]: the cache block of each key position; 0 (never read) outside [kv_start, kv_end)."""
    valid = (key_pos >= kv_start) & (key_pos < kv_end)
    return tl.load(block_table_row + key_pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)


@triton.jit
def _soft_cap(scores, cap):
    """``cap * tanh(scores / cap)``, written with exp2 (no tanh in the interpreter)."""
    doubled = tl.exp2(scores * (2.0 * 1.4426950408889634 / cap))
    return cap * (1.0 - 2.0 / (doubled + 1.0))


@triton.jit
def _visible(
    row_valid, key_valid, key_pos, query_pos, sliding_window, USE_SLIDING_WINDOW: tl.constexpr
):
    """[rows, keys]: which keys a query row attends to (causal, within its window)."""
    visible = row_valid[:, None] & key_valid[None, :] & (key_pos[None, :] <= query_pos[:, None])
    if USE_SLIDING_WINDOW:
        visible = visible & (query_pos[:, None] - key_pos[None, :] < sliding_window)
    return visible


@triton.jit
def _online_softmax_step(scores, running_max, running_sum):
    """One tile of the online softmax in base 2: the tile's unnormalised probabilities,
    the factor that rescales what the earlier tiles summed, and the new running max and sum."""
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    # A row with nothing visible yet keeps max -inf; subtract 0 so exp2 gives 0, not NaN.
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    probs = tl.exp2(scores - safe_max[:, None])
    rescale = tl.exp2(running_max - safe_max)
    return probs, rescale, new_max, running_sum * rescale + tl.sum(probs, axis=1)


@triton.jit
def _tma_tile(
    key_desc,
    value_desc,
    page,
    kv_head,
    value_part,
    TILE_SIZE: tl.constexpr,
    HEAD_SIZE_PADDED: tl.constexpr,
    VALUE_WIDTH: tl.constexpr,
):
    """K [TILE_SIZE, HEAD_SIZE_PADDED] and this value part's V [TILE_SIZE,
    VALUE_WIDTH] of cache block ``page``, through the caches' tensor descriptors (columns past the head
    size come back as zeros)."""
    k = key_desc.load([page, 0, kv_head * HEAD_SIZE_PADDED]).reshape(TILE_SIZE, HEAD_SIZE_PADDED)
    v = value_desc.load([page, 0, kv_head * HEAD_SIZE_PADDED + value_part * VALUE_WIDTH])
    return k, v.reshape(TILE_SIZE, VALUE_WIDTH)


@triton.jit
def _attend_tile(
    q,
    k,
    v,
    key_pos,
    kv_start,
    kv_end,
    row_valid,
    query_pos,
    qk_scale,
    soft_cap,
    sliding_window,
    acc,
    running_max,
    running_sum,
    USE_SOFTCAP: tl.constexpr,
    USE_SLIDING_WINDOW: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    K_ROWS: tl.constexpr = False,
):
    """One KV tile into the online softmax: scores of the rows against K (transposed), the
    invisible ones masked, and the probabilities' product with V added to the accumulator."""
    if DOT_IN_FP32:
        k = k.to(tl.float32)
    # Scores in base-2 log units: qk_scale carries log2(e) unless the soft cap needs
    # natural units first.
    if K_ROWS:  # k is [keys, head] and q comes transposed: K's tile feeds the dot unmoved
        scores = tl.trans(tl.dot(k, q, input_precision=DOT_PRECISION)) * qk_scale
    else:
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
    if USE_SOFTCAP:
        scores = _soft_cap(scores, soft_cap) * 1.4426950408889634
    key_valid = (key_pos >= kv_start) & (key_pos < kv_end)
    visible = _visible(row_valid, key_valid, key_pos, query_pos, sliding_window, USE_SLIDING_WINDOW)
    scores = tl.where(visible, scores, float("-inf"))
    probs, rescale, running_max, running_sum = _online_softmax_step(
        scores, running_max, running_sum
    )
    probs = probs.to(v.dtype)
    if DOT_IN_FP32:
        probs = probs.to(tl.float32)
        v = v.to(tl.float32)
    acc = tl.dot(probs, v, acc * rescale[:, None], input_precision=DOT_PRECISION)
    return acc, running_max, running_sum


@triton.jit(do_not_specialize=["num_seqs", "num_segments", "q_blocks_per_seq"])
def _unified_attention_kernel(
    output_ptr,
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    segm_output_ptr,
    segm_max_ptr,
    segm_expsum_ptr,
    qk_scale,
    soft_cap,
    sliding_window,
    num_seqs,
    num_segments,
    q_blocks_per_seq,
    stride_query_token,
    stride_query_head,
    stride_output_token,
    stride_output_head,
    stride_key_block,
    stride_key_offset,
    stride_key_head,
    stride_value_block,
    stride_value_offset,
    stride_value_head,
    stride_block_table,
    NUM_HEADS_Q: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_SIZE_PADDED: tl.constexpr,
    SCRATCH_ROW: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    SCRATCH_SEGMENTS: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_SLIDING_WINDOW: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    VALUE_SPLITS: tl.constexpr,
    PREFETCH_BLOCK_TABLE: tl.constexpr,
    TMA_KV: tl.constexpr,
):
    """One (q-block, KV head[, segment], value part) program; see the module docstring."""
    q_block = tl.program_id(0) // VALUE_SPLITS
    value_part = tl.program_id(0) % VALUE_SPLITS
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    if SPLIT_KV:  # exact grid: q_blocks_per_seq programs per request
        request = q_block // q_blocks_per_seq
    else:
        request = _find_request(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + request)
    q_len = tl.load(query_start_loc_ptr + request + 1) - q_start
    if SPLIT_KV:
        first_local = (q_block % q_blocks_per_seq) * BLOCK_Q
    else:
        first_local = (q_block - (q_start // BLOCK_Q + request)) * BLOCK_Q
    if first_local >= q_len:
        return
    context_len = tl.load(seq_lens_ptr + request) - q_len

    rows = tl.arange(0, BLOCK_M)
    token_local = first_local + rows // GROUP_SIZE
    head = kv_head * GROUP_SIZE + rows % GROUP_SIZE
    row_valid = (rows < BLOCK_Q * GROUP_SIZE) & (token_local < q_len)
    token = (q_start + token_local).to(tl.int64)
    query_pos = context_len + token_local
    dims = tl.arange(0, HEAD_SIZE_PADDED)
    dim_mask = dims < HEAD_SIZE
    value_dims = value_part * (HEAD_SIZE_PADDED // VALUE_SPLITS) + tl.arange(
        0, HEAD_SIZE_PADDED // VALUE_SPLITS
    )
    value_mask = value_dims < HEAD_SIZE

    q = tl.load(
        query_ptr
        + token[:, None] * stride_query_token
        + head[:, None] * stride_query_head
        + dims[None, :],
        mask=row_valid[:, None] & dim_mask[None, :],
        other=0.0,
    )
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    # Keys some row of this q-block sees: [kv_start, kv_end).
    kv_end = context_len + tl.minimum(first_local + BLOCK_Q, q_len)
    kv_start = 0
    if USE_SLIDING_WINDOW:
        kv_start = tl.maximum(context_len + first_local - sliding_window + 1, 0)
    tile_start = kv_start // TILE_SIZE
    tile_end = (kv_end + TILE_SIZE - 1) // TILE_SIZE
    if SPLIT_KV:
        tiles_per_segment = (tile_end - tile_start + num_segments - 1) // num_segments
        tile_start = tile_start + segment * tiles_per_segment
        tile_end = tl.minimum(tile_start + tiles_per_segment, tile_end)

    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_SIZE_PADDED // VALUE_SPLITS], dtype=tl.float32)
    tile_offsets = tl.arange(0, TILE_SIZE)
    block_table_row = block_table_ptr + request.to(tl.int64) * stride_block_table
    if TMA_KV:
        # One page per tile (TILE_SIZE == BLOCK_SIZE), K and V fetched by the tensor-memory
        # accelerator into shared memory. Tiles wholly inside [kv_start, kv_end) run in the
        # pipelined loop; the at most two partial tiles at the edges (outside it, cache slots
        # may hold anything, NaN included) zero V's invalid rows after the load.
        q_t = tl.trans(q)
        first_full = tl.minimum(
            tl.maximum((kv_start + TILE_SIZE - 1) // TILE_SIZE, tile_start), tile_end
        )
        last_full = tl.minimum(tl.maximum(kv_end // TILE_SIZE, first_full), tile_end)
        # With PREFETCH_BLOCK_TABLE the page numbers are read one tile ahead, which lets the
        # pipeliner give the descriptor loads num_stages - 1 buffers (one without it).
        if PREFETCH_BLOCK_TABLE:
            next_page = tl.load(block_table_row + tl.minimum(first_full, tile_end - 1))
        for tile in range(first_full, last_full):
            if PREFETCH_BLOCK_TABLE:
                page = next_page.to(tl.int32)
                next_page = tl.load(block_table_row + tl.minimum(tile + 1, tile_end - 1))
            else:
                page = tl.load(block_table_row + tile).to(tl.int32)
            k, v = _tma_tile(
                key_cache_ptr, value_cache_ptr, page, kv_head, value_part,
                TILE_SIZE, HEAD_SIZE_PADDED, HEAD_SIZE_PADDED // VALUE_SPLITS,
            )  # fmt: skip
            acc, running_max, running_sum = _attend_tile(
                q_t, k, v, tile * TILE_SIZE + tile_offsets, kv_start, kv_end, row_valid,
                query_pos, qk_scale, soft_cap, sliding_window, acc, running_max, running_sum,
                USE_SOFTCAP, USE_SLIDING_WINDOW, DOT_IN_FP32, DOT_PRECISION, True,
            )  # fmt: skip
        # The partial tiles: the one before first_full and the one at last_full, if in range.
        for edge in tl.static_range(2):
            tile = first_full - 1 + edge * (last_full - first_full + 1)
            if (tile >= tile_start) & (tile < tile_end):
                k, v = _tma_tile(
                    key_cache_ptr, value_cache_ptr, tl.load(block_table_row + tile).to(tl.int32),
                    kv_head, value_part,
                    TILE_SIZE, HEAD_SIZE_PADDED, HEAD_SIZE_PADDED // VALUE_SPLITS,
                )  # fmt: skip
                key_pos = tile * TILE_SIZE + tile_offsets
                v = tl.where(((key_pos >= kv_start) & (key_pos < kv_end))[:, None], v, 0.0)
                acc, running_max, running_sum = _attend_tile(
                    q_t, k, v, key_pos, kv_start, kv_end, row_valid, query_pos, qk_scale,
                    soft_cap, sliding_window, acc, running_max, running_sum,
                    USE_SOFTCAP, USE_SLIDING_WINDOW, DOT_IN_FP32, DOT_PRECISION, True,
                )  # fmt: skip
    else:
        if PREFETCH_BLOCK_TABLE:
            next_block = _physical_blocks(
                block_table_row, tile_start * TILE_SIZE + tile_offsets, kv_start, kv_end,
                BLOCK_SIZE,
            )  # fmt: skip
        for tile in range(tile_start, tile_end):
            key_pos = tile * TILE_SIZE + tile_offsets
            key_valid = (key_pos >= kv_start) & (key_pos < kv_end)
            if PREFETCH_BLOCK_TABLE:
                physical_block = next_block
                next_block = _physical_blocks(
                    block_table_row, key_pos + TILE_SIZE, kv_start, kv_end, BLOCK_SIZE
                )
            else:
                physical_block = _physical_blocks(
                    block_table_row, key_pos, kv_start, kv_end, BLOCK_SIZE
                )
            in_block = key_pos % BLOCK_SIZE
            k = tl.load(  # [HEAD_SIZE_PADDED, TILE_SIZE]: K transposed
                key_cache_ptr
                + physical_block[None, :] * stride_key_block
                + in_block[None, :] * stride_key_offset
                + kv_head * stride_key_head
                + dims[:, None],
                mask=dim_mask[:, None] & key_valid[None, :],
                other=0.0,
            )
            v = tl.load(  # [TILE_SIZE, HEAD_SIZE_PADDED // VALUE_SPLITS]: this part's columns
                value_cache_ptr
                + physical_block[:, None] * stride_value_block
                + in_block[:, None] * stride_value_offset
                + kv_head * stride_value_head
                + value_dims[None, :],
                mask=key_valid[:, None] & value_mask[None, :],
                other=0.0,
            )
            acc, running_max, running_sum = _attend_tile(
                q, k, v, key_pos, kv_start, kv_end, row_valid, query_pos, qk_scale, soft_cap,
                sliding_window, acc, running_max, running_sum,
                USE_SOFTCAP, USE_SLIDING_WINDOW, DOT_IN_FP32, DOT_PRECISION,
            )  # fmt: skip

    if SPLIT_KV:
        segm_row = (token * NUM_HEADS_Q + head) * SCRATCH_SEGMENTS + segment
        tl.store(
            segm_output_ptr + segm_row[:, None] * SCRATCH_ROW + value_dims[None, :],
            acc,
            mask=row_valid[:, None] & value_mask[None, :],
        )
        # Every value part computed the same max and sum; the first one writes them (a branch
        # on the scalar: Triton 3.9's interpreter refuses a block mask ANDed with a scalar bool).
        if value_part == 0:
            tl.store(segm_max_ptr + segm_row, running_max, mask=row_valid)
            tl.store(segm_expsum_ptr + segm_row, running_sum, mask=row_valid)
    else:
        out = acc / tl.where(running_sum > 0.0, running_sum, 1.0)[:, None]
        tl.store(
            output_ptr
            + token[:, None] * stride_output_token
            + head[:, None] * stride_output_head
            + value_dims[None, :],
            out.to(output_ptr.dtype.element_ty),
            mask=row_valid[:, None] & value_mask[None, :],
        )


@triton.jit(do_not_specialize=["num_seqs", "num_segments"])
def _merge_segments_kernel(
    output_ptr,
    segm_output_ptr,
    segm_max_ptr,
    segm_expsum_ptr,
    query_start_loc_ptr,
    num_seqs,
    num_segments,
    stride_output_token,
    stride_output_head,
    NUM_HEADS_Q: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    SCRATCH_SEGMENTS: tl.constexpr,
    SEGMENTS_PADDED: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_SIZE_PADDED: tl.constexpr,
):
    """Log-sum-exp merge of the segments of one token's query heads into the output.

    The segments' partial outputs are summed one segment at a time: a [heads, segments,
    head_size] tile would hold SCRATCH_SEGMENTS x head_size floats per head in registers
    (64 KiB at 32 segments and head 512), most of them masked off."""
    token = tl.program_id(0)
    if token >= tl.load(query_start_loc_ptr + num_seqs):
        return
    heads = tl.program_id(1) * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)
    head_mask = heads < NUM_HEADS_Q
    segs = tl.arange(0, SEGMENTS_PADDED)
    mask = head_mask[:, None] & (segs < num_segments)[None, :]
    dims = tl.arange(0, HEAD_SIZE_PADDED)
    dim_mask = dims < HEAD_SIZE
    first_row = (token.to(tl.int64) * NUM_HEADS_Q + heads) * SCRATCH_SEGMENTS  # segment 0's

    seg_max = tl.load(
        segm_max_ptr + first_row[:, None] + segs[None, :], mask=mask, other=float("-inf")
    )
    overall_max = tl.max(seg_max, axis=1)
    overall_max = tl.where(overall_max == float("-inf"), 0.0, overall_max)  # masked heads
    weight = tl.exp2(seg_max - overall_max[:, None])  # empty segments weigh 0
    expsum = tl.load(segm_expsum_ptr + first_row[:, None] + segs[None, :], mask=mask, other=0.0)
    total = tl.sum(expsum * weight, axis=1)
    out = tl.zeros([HEADS_PER_PROGRAM, HEAD_SIZE_PADDED], dtype=tl.float32)
    for segment in range(num_segments):
        row = first_row + segment
        segment_weight = tl.exp2(
            tl.load(segm_max_ptr + row, mask=head_mask, other=float("-inf")) - overall_max
        )
        partial = tl.load(
            segm_output_ptr + row[:, None] * HEAD_SIZE_PADDED + dims[None, :],
            mask=head_mask[:, None] & dim_mask[None, :],
            other=0.0,
        )
        out += partial * segment_weight[:, None]
    out = out / tl.where(head_mask, total, 1.0)[:, None]
    tl.store(
        output_ptr
        + token.to(tl.int64) * stride_output_token
        + heads[:, None] * stride_output_head
        + dims[None, :],
        out.to(output_ptr.dtype.element_ty),
        mask=head_mask[:, None] & dim_mask[None, :],
    )
