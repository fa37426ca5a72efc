"""Triton unified paged attention: one kernel family for prefill, decode and spec-decode verify.

Cache layout and batch description: see ``kernels.kv_cache_write`` and ``kernels.attention_oracle``.

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
* Only the key positions some row of the q-block can see are loaded (causal end, sliding-window
  start), through the block table, so cache slots outside them may hold anything.

Tile sizes, rows per program, warps, stages and segment counts are launch parameters
(``LaunchConfig``) chosen by ``choose_launch_config``; pass ``config=`` to tune them without
editing the kernels.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Literal

import torch
import triton
import triton.language as tl

from kernels.kv_cache_write import check_query_against_cache

MAX_3D_QUERY_LEN = 8
"""The longest query (decode, or verify of up to 7 drafts) the split-KV path serves."""
DEFAULT_NUM_SEGMENTS = 32
"""KV segments per (q-block, KV head) a builder should allocate scratch for (vLLM's is 16; a
few requests over long contexts need more to fill one wave on the H200: 16 x 32k at head 256
took 24)."""
MIN_LAUNCH_GRID_SIZE_2D = 128
"""Default 3D threshold numerator: ``seq_threshold_3d = 128 // num_kv_heads`` as in vLLM."""
MIN_SEGMENTS_3D = 4
"""Split-KV launches take the fewest whole waves that give every (q-block, KV head) at least
this many segments. Measured on the H200 (benchmarks.tune_attention, Gemma 4 head 256 and 512,
decode and verify at 64 x 8k and 16 x 32k, 4 to 32 segments): every fastest count was the one
that filled whole waves of resident programs (a launch of 1.3 waves ran up to 20 % slower than
one of 0.97), and one wave beat two: 6 segments against 12 for the head-256 decode, 4 against 8
for the verify (head 256: 167.9 against 172.1 us; head 512: 357.2 against 370.1 us)."""
H200_SMS = 132
H200_WAVE_SLOTS = 3 * H200_SMS
"""Programs the H200 holds at once for the head-256 decode kernel (168 registers per thread and
76 KB of shared memory allow 3 per SM, per Nsight Compute)."""
REGISTERS_PER_SM = 65536
"""32-bit registers per SM on every NVIDIA GPU since Maxwell."""

Path = Literal["2d", "3d"]

# The interpreter runs tl.dot through numpy, which mishandles bfloat16: operands are upcast to
# float32 there (after rounding P to the cache dtype, so the rounding matches the GPU path).
# triton.jit picks the interpreter when a kernel is defined, so the flag is read then too.
_INTERPRETED = bool(triton.knobs.runtime.interpret)
_LOG2E = math.log2(math.e)


class ScratchTooSmallError(ValueError):
    """The split-KV scratch does not cover this launch (it was sized for other heads or rows)."""


@dataclass(frozen=True, eq=False)
class SplitKVScratch:
    """Per-step scratch of the split-KV path, owned by an attention group's metadata builder.

    Shapes follow vLLM's ``softmax_segm_*`` buffers, all float32 and contiguous:
    ``segm_output`` [rows, num_heads_q, num_segments, head_size_padded], ``segm_max`` and
    ``segm_expsum`` [rows, num_heads_q, num_segments]. A launch needs ``rows >= num_tokens`` and
    exactly the query's head count, because the kernels index the buffers with it.
    """

    segm_output: torch.Tensor
    segm_max: torch.Tensor
    segm_expsum: torch.Tensor

    def __post_init__(self) -> None:
        if self.segm_output.dim() != 4:
            raise ValueError(
                "segm_output must be [rows, num_heads_q, num_segments, head_size_padded]; "
                f"got {tuple(self.segm_output.shape)}"
            )
        head_size_padded = self.segm_output.shape[3]
        if head_size_padded != triton.next_power_of_2(head_size_padded):
            raise ValueError(f"head_size_padded {head_size_padded} is not a power of two")
        for name in ("segm_max", "segm_expsum"):
            tensor = getattr(self, name)
            if tuple(tensor.shape) != tuple(self.segm_output.shape[:3]):
                raise ValueError(
                    f"{name} shape {tuple(tensor.shape)} must equal segm_output's leading "
                    f"[rows, num_heads_q, num_segments] = {tuple(self.segm_output.shape[:3])}"
                )
        for name in ("segm_output", "segm_max", "segm_expsum"):
            tensor = getattr(self, name)
            if tensor.dtype != torch.float32 or not tensor.is_contiguous():
                raise ValueError(f"{name} must be a contiguous float32 tensor")
            if tensor.device != self.segm_output.device:
                raise ValueError("the scratch tensors must share a device")

    @classmethod
    def allocate(
        cls,
        rows: int,
        num_heads_q: int,
        num_segments: int,
        head_size: int,
        device: torch.device | str,
    ) -> SplitKVScratch:
        """Uninitialised scratch for ``rows`` query tokens of ``num_heads_q`` heads."""
        if min(rows, num_heads_q, num_segments, head_size) < 1:
            raise ValueError(
                f"scratch sizes must be positive; got rows={rows}, num_heads_q={num_heads_q}, "
                f"num_segments={num_segments}, head_size={head_size}"
            )
        shape = (rows, num_heads_q, num_segments)
        return cls(
            segm_output=torch.empty(
                (*shape, triton.next_power_of_2(head_size)), dtype=torch.float32, device=device
            ),
            segm_max=torch.empty(shape, dtype=torch.float32, device=device),
            segm_expsum=torch.empty(shape, dtype=torch.float32, device=device),
        )

    @property
    def rows(self) -> int:
        return self.segm_output.shape[0]

    @property
    def num_heads_q(self) -> int:
        return self.segm_output.shape[1]

    @property
    def num_segments(self) -> int:
        return self.segm_output.shape[2]

    @property
    def head_size_padded(self) -> int:
        return self.segm_output.shape[3]


@dataclass(frozen=True)
class LaunchConfig:
    """The tunable launch parameters of one attention call.

    ``block_m``: rows (query tokens x grouped heads) per program, a power of two >= 16 and >=
    the group size. ``tile_size``: keys per inner-loop step, a power of two >= 16.
    ``num_segments``: KV segments of a split-KV launch (ignored by 2D), at most the scratch's.
    ``merge_heads_per_program``: query heads per program of the split-KV merge.
    """

    block_m: int
    tile_size: int
    num_warps: int
    num_stages: int
    num_segments: int = 1
    merge_heads_per_program: int = 1

    def __post_init__(self) -> None:
        for name in ("block_m", "tile_size"):
            value = getattr(self, name)
            if value < 16 or value != triton.next_power_of_2(value):
                raise ValueError(f"{name} must be a power of two >= 16; got {value}")
        if min(self.num_warps, self.num_stages, self.num_segments) < 1:
            raise ValueError(f"num_warps, num_stages and num_segments must be >= 1: {self}")
        heads = self.merge_heads_per_program
        if heads < 1 or heads != triton.next_power_of_2(heads):
            raise ValueError(f"merge_heads_per_program must be a power of two; got {heads}")

    def block_q(self, group_size: int) -> int:
        """Query tokens per program."""
        return self.block_m // group_size


def rows_per_program(group_size: int, max_query_len: int, head_size: int) -> int:
    """``block_m``: enough rows for every token of a short query (so verify reads KV once),
    capped by the accumulator's register footprint for wide heads, never below 16 or G."""
    head_size_padded = _dot_head_size(head_size)
    cap = min(128, max(16, 16384 // head_size_padded))
    wanted = min(cap, triton.next_power_of_2(group_size * max(max_query_len, 1)))
    return max(16, triton.next_power_of_2(group_size), wanted)


def choose_launch_config(
    *,
    num_heads_q: int,
    num_kv_heads: int,
    head_size: int,
    num_seqs: int,
    max_query_len: int,
    max_seq_len: int,
    path: Path,
    max_segments: int = DEFAULT_NUM_SEGMENTS,
    wave_slots: int = H200_WAVE_SLOTS,
) -> LaunchConfig:
    """The heuristic launch parameters.

    Decode and short verify are bandwidth-bound: 32 KiB of K and V per tile at head <= 256,
    two pipeline stages (measured on the H200). Prefill is compute-bound: wider q-blocks. Split-KV
    fills whole waves of ``wave_slots`` resident programs (``split_kv_segments``);
    ``unified_attention`` measures them from the compiled kernel.
    """
    group_size = num_heads_q // num_kv_heads
    head_size_padded = _dot_head_size(head_size)
    block_m = rows_per_program(group_size, max_query_len, head_size)
    bandwidth_bound = max_query_len <= MAX_3D_QUERY_LEN
    if bandwidth_bound:
        # Tuned on the H200 (benchmarks.tune_attention): 64-key tiles up to head 256, 32 at
        # head 512, four warps and two stages were fastest for decode, verify and draft alike.
        tile_size = 64 if head_size_padded <= 256 else 32
        num_warps = 4
    else:
        tile_size = min(64, max(16, 8192 // head_size_padded))
        num_warps = 8 if block_m * head_size_padded >= 16384 else 4
    num_stages = 2
    num_segments = 1
    if path == "3d":
        block_q = block_m // group_size
        num_segments = split_kv_segments(
            kv_programs=num_seqs * triton.cdiv(max_query_len, block_q) * num_kv_heads,
            num_tiles=triton.cdiv(max(max_seq_len, 1), tile_size),
            wave_slots=wave_slots,
            max_segments=max_segments,
        )
    # The interpreter pays per program, a GPU wants many small ones.
    merge_heads = triton.next_power_of_2(num_heads_q) if _INTERPRETED else 1
    return LaunchConfig(
        block_m, tile_size, num_warps, num_stages, max(num_segments, 1), merge_heads
    )


def split_kv_segments(
    *, kv_programs: int, num_tiles: int, wave_slots: int, max_segments: int
) -> int:
    """Segments per (q-block, KV head): the fewest whole waves of ``wave_slots`` programs that
    give each of the ``kv_programs`` at least ``MIN_SEGMENTS_3D`` segments, as many segments as
    those waves hold, capped by the scratch and by one tile per segment.

    A launch that spills a few programs into a last partial wave waits for them with most SMs
    idle; every program reads about the same bytes, so whole waves finish together.
    """
    kv_programs = max(kv_programs, 1)
    waves = triton.cdiv(MIN_SEGMENTS_3D * kv_programs, wave_slots)
    return max(1, min(waves * wave_slots // kv_programs, max_segments, num_tiles))


def select_path(
    *,
    num_seqs: int,
    max_query_len: int,
    num_heads_q: int,
    num_kv_heads: int,
    head_size: int,
    has_scratch: bool,
    path: Literal["auto", "2d", "3d"] = "auto",
    seq_threshold_3d: int | None = None,
) -> Path:
    """2D or split-KV 3D for this batch.

    "auto" picks 3D when scratch is given, ``max_query_len <= MAX_3D_QUERY_LEN`` (decode and
    short verify; vLLM takes 3D for decode only) and the 2D grid would be small:
    ``num_seqs * cdiv(max_query_len, block_q) <= seq_threshold_3d`` (default
    ``128 // num_kv_heads``). "3d" forces split-KV and raises where it cannot run.
    """
    if path == "2d":
        return "2d"
    if path not in ("auto", "3d"):
        raise ValueError(f"path must be 'auto', '2d' or '3d'; got {path!r}")
    allowed = has_scratch and max_query_len <= MAX_3D_QUERY_LEN
    if path == "3d":
        if not allowed:
            raise ValueError(
                "path='3d' needs split-KV scratch and max_query_len <= "
                f"{MAX_3D_QUERY_LEN}; got scratch={'yes' if has_scratch else 'none'}, "
                f"max_query_len={max_query_len}"
            )
        return "3d"
    if not allowed:
        return "2d"
    if seq_threshold_3d is None:
        seq_threshold_3d = max(1, MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads)
    group_size = num_heads_q // num_kv_heads
    block_q = rows_per_program(group_size, max_query_len, head_size) // group_size
    q_blocks = num_seqs * triton.cdiv(max_query_len, block_q)
    return "3d" if q_blocks <= seq_threshold_3d else "2d"


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
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Paged attention of ``query`` [num_tokens, num_heads_q, head_size] into ``output``.

    ``max_query_len`` and ``max_seq_len`` are host-side bounds of the batch (as in vLLM's
    metadata), so nothing here syncs the device; they must bound every request (the split-KV
    grid and segments are sized by them). Output rows of tokens past
    ``query_start_loc[-1]`` (CUDA-graph padding) are left untouched. Returns ``output``.
    """
    _check_inputs(query, key_cache, value_cache, output, query_start_loc, seq_lens, block_table)
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None; got {sliding_window}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be > 0 or None; got {logits_soft_cap}")
    if not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be finite; got {sm_scale}")
    num_tokens, num_heads_q, head_size = query.shape
    num_kv_heads = key_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return output
    if max_query_len < 1 or max_seq_len < max_query_len:
        raise ValueError(
            f"need 1 <= max_query_len <= max_seq_len; got {max_query_len} and {max_seq_len}"
        )

    chosen = select_path(
        num_seqs=num_seqs,
        max_query_len=max_query_len,
        num_heads_q=num_heads_q,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        has_scratch=scratch is not None,
        path=path,
        seq_threshold_3d=seq_threshold_3d,
    )
    auto_config = config is None
    if config is None:
        config = choose_launch_config(
            num_heads_q=num_heads_q,
            num_kv_heads=num_kv_heads,
            head_size=head_size,
            num_seqs=num_seqs,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            path=chosen,
            max_segments=scratch.num_segments if scratch is not None else DEFAULT_NUM_SEGMENTS,
        )
    group_size = num_heads_q // num_kv_heads
    if config.block_m < group_size:
        raise ValueError(f"block_m {config.block_m} is below the group size {group_size}")
    if chosen == "3d":
        assert scratch is not None
        segments = (scratch.segm_output, scratch.segm_max, scratch.segm_expsum)
        scratch_segments = scratch.num_segments
    else:
        segments = (output, output, output)  # unused by the 2D kernel
        scratch_segments = 1

    block_q = config.block_q(group_size)
    q_blocks_per_seq = triton.cdiv(max_query_len, block_q)
    grid_q_blocks = (
        num_seqs * q_blocks_per_seq if chosen == "3d" else num_tokens // block_q + num_seqs
    )
    qk_scale = sm_scale if logits_soft_cap is not None else sm_scale * _LOG2E

    def kernel_arguments(num_segments: int) -> list:
        return [
            output,
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            *segments,
            qk_scale,
            logits_soft_cap or 0.0,
            sliding_window or 0,
            num_seqs,
            num_segments,
            q_blocks_per_seq,
            query.stride(0),
            query.stride(1),
            output.stride(0),
            output.stride(1),
            *key_cache.stride()[:3],  # block, offset in block, head
            *value_cache.stride()[:3],
            block_table.stride(0),
        ]

    constexprs = dict(
        NUM_HEADS_Q=num_heads_q,
        GROUP_SIZE=group_size,
        HEAD_SIZE=head_size,
        HEAD_SIZE_PADDED=_dot_head_size(head_size),
        SCRATCH_ROW=triton.next_power_of_2(head_size),
        BLOCK_SIZE=key_cache.shape[1],
        TILE_SIZE=config.tile_size,
        BLOCK_M=config.block_m,
        BLOCK_Q=block_q,
        SCRATCH_SEGMENTS=scratch_segments,
        USE_SOFTCAP=logits_soft_cap is not None,
        USE_SLIDING_WINDOW=sliding_window is not None,
        SPLIT_KV=chosen == "3d",
        DOT_IN_FP32=_INTERPRETED,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if chosen == "3d":
        assert scratch is not None
        if auto_config:
            num_segments = split_kv_segments(
                kv_programs=grid_q_blocks * num_kv_heads,
                num_tiles=triton.cdiv(max_seq_len, config.tile_size),
                wave_slots=_wave_slots(kernel_arguments(1), constexprs, query.device),
                max_segments=scratch.num_segments,
            )
            config = replace(config, num_segments=num_segments)
        check_scratch(scratch, query, config.num_segments)
    grid_segments = config.num_segments if chosen == "3d" else 1
    _unified_attention_kernel[(grid_q_blocks, num_kv_heads, grid_segments)](
        *kernel_arguments(grid_segments), **constexprs
    )
    if chosen == "3d":
        merge_heads = config.merge_heads_per_program
        _merge_segments_kernel[(num_tokens, triton.cdiv(num_heads_q, merge_heads))](
            output,
            *segments,
            query_start_loc,
            num_seqs,
            grid_segments,
            output.stride(0),
            output.stride(1),
            NUM_HEADS_Q=num_heads_q,
            HEADS_PER_PROGRAM=merge_heads,
            SCRATCH_SEGMENTS=scratch_segments,
            SEGMENTS_PADDED=triton.next_power_of_2(scratch_segments),
            HEAD_SIZE=head_size,
            HEAD_SIZE_PADDED=triton.next_power_of_2(head_size),
            num_warps=4,
        )
    return output


def resident_programs_per_sm(
    *,
    registers_per_thread: int,
    shared_bytes: int,
    num_warps: int,
    max_threads_per_sm: int,
    shared_bytes_per_sm: int,
    warp_size: int = 32,
) -> int:
    """Programs of a compiled kernel one SM holds at once: the tightest of its register file
    (allocated per warp in 256-register units), shared memory (1 KiB reserved per program) and
    thread limits. Nsight Compute's "Block Limit" figures follow the same rules."""
    registers_per_warp = triton.cdiv(registers_per_thread * warp_size, 256) * 256
    by_registers = REGISTERS_PER_SM // (registers_per_warp * num_warps)
    by_shared = shared_bytes_per_sm // (shared_bytes + 1024)
    by_threads = max_threads_per_sm // (num_warps * warp_size)
    return max(1, min(by_registers, by_shared, by_threads))


_WAVE_SLOTS: dict[tuple, int] = {}


def _wave_slots(arguments: list, constexprs: dict, device: torch.device) -> int:
    """Programs of this kernel variant the device runs at once. On a GPU: SMs times resident
    programs, from the compiled kernel's registers and shared memory (compiled ahead of its
    first launch, as Triton's softmax tutorial does, and cached per variant). Under the
    interpreter: one program per CPU core."""
    if device.type != "cuda":
        return os.cpu_count() or 1
    key = (device.index, arguments[1].dtype, *constexprs.values())  # one dict literal: fixed order
    if key not in _WAVE_SLOTS:
        kernel = _unified_attention_kernel.warmup(*arguments, grid=(1,), **constexprs)
        kernel._init_handles()
        properties = torch.cuda.get_device_properties(device)
        resident = resident_programs_per_sm(
            registers_per_thread=kernel.n_regs,
            shared_bytes=kernel.metadata.shared,
            num_warps=constexprs["num_warps"],
            max_threads_per_sm=properties.max_threads_per_multi_processor,
            shared_bytes_per_sm=properties.shared_memory_per_multiprocessor,
        )
        _WAVE_SLOTS[key] = properties.multi_processor_count * resident
    return _WAVE_SLOTS[key]


def _dot_head_size(head_size: int) -> int:
    """The head dimension the kernel computes with: a power of two, and >= 16 for tl.dot."""
    return max(16, triton.next_power_of_2(head_size))


def check_scratch(scratch: SplitKVScratch, query: torch.Tensor, num_segments: int) -> None:
    """Raise ScratchTooSmallError unless ``scratch`` covers a split-KV launch for ``query``
    with ``num_segments`` segments: the kernels index it by the query's head count and token."""
    num_tokens, num_heads_q, head_size = query.shape
    problems = []
    if scratch.num_heads_q != num_heads_q:
        problems.append(f"num_heads_q: scratch {scratch.num_heads_q}, query {num_heads_q}")
    if scratch.rows < num_tokens:
        problems.append(f"rows: scratch {scratch.rows}, needed {num_tokens} tokens")
    if scratch.num_segments < num_segments:
        problems.append(f"segments: scratch {scratch.num_segments}, launch {num_segments}")
    if scratch.head_size_padded != triton.next_power_of_2(head_size):
        problems.append(
            f"head_size_padded: scratch {scratch.head_size_padded}, "
            f"needed {triton.next_power_of_2(head_size)}"
        )
    if scratch.segm_output.device != query.device:
        problems.append(f"device: scratch {scratch.segm_output.device}, query {query.device}")
    if problems:
        raise ScratchTooSmallError(
            "split-KV scratch does not cover this launch (" + "; ".join(problems) + "); size it "
            "by the attention group's num_heads_q and at least the step's query tokens"
        )


def _check_inputs(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> None:
    """Shape, dtype and layout checks that need no device sync."""
    check_query_against_cache(query, key_cache, value_cache)
    if output.shape != query.shape:
        raise ValueError(f"output shape {tuple(output.shape)} != query shape {tuple(query.shape)}")
    if not (query.dtype == key_cache.dtype == value_cache.dtype):
        raise ValueError(
            f"query, key_cache and value_cache must share a dtype; got {query.dtype}, "
            f"{key_cache.dtype}, {value_cache.dtype}"
        )
    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported dtype {query.dtype}")
    named = {"query": query, "output": output, "key_cache": key_cache, "value_cache": value_cache}
    for name, tensor in named.items():
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its head dimension")
    num_seqs = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    if (
        num_seqs < 0
        or query_start_loc.shape != (num_seqs + 1,)
        or block_table.dim() != 2
        or block_table.shape[0] < num_seqs
    ):
        raise ValueError(
            "need seq_lens [num_seqs], query_start_loc [num_seqs + 1] and block_table "
            f"[num_seqs, max_blocks]; got {tuple(seq_lens.shape)}, "
            f"{tuple(query_start_loc.shape)}, {tuple(block_table.shape)}"
        )
    indices = {"seq_lens": seq_lens, "query_start_loc": query_start_loc, "block_table": block_table}
    for name, tensor in indices.items():
        if tensor.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be int32 or int64; got {tensor.dtype}")


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
def _soft_cap(scores, cap):
    """``cap * tanh(scores / cap)``, written with exp2 (no tanh in the interpreter)."""
    doubled = tl.exp2(scores * (2.0 * 1.4426950408889634 / cap))
    return cap * (1.0 - 2.0 / (doubled + 1.0))


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
):
    """One (q-block, KV head[, segment]) program; see the module docstring."""
    q_block = tl.program_id(0)
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
    acc = tl.zeros([BLOCK_M, HEAD_SIZE_PADDED], dtype=tl.float32)
    tile_offsets = tl.arange(0, TILE_SIZE)
    block_table_row = block_table_ptr + request.to(tl.int64) * stride_block_table
    for tile in range(tile_start, tile_end):
        key_pos = tile * TILE_SIZE + tile_offsets
        key_valid = (key_pos >= kv_start) & (key_pos < kv_end)
        physical_block = tl.load(
            block_table_row + key_pos // BLOCK_SIZE, mask=key_valid, other=0
        ).to(tl.int64)
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
        v = tl.load(  # [TILE_SIZE, HEAD_SIZE_PADDED]
            value_cache_ptr
            + physical_block[:, None] * stride_value_block
            + in_block[:, None] * stride_value_offset
            + kv_head * stride_value_head
            + dims[None, :],
            mask=key_valid[:, None] & dim_mask[None, :],
            other=0.0,
        )
        if DOT_IN_FP32:
            k = k.to(tl.float32)

        # Scores in base-2 log units: qk_scale carries log2(e) unless the soft cap needs
        # natural units first.
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
        if USE_SOFTCAP:
            scores = _soft_cap(scores, soft_cap) * 1.4426950408889634
        visible = row_valid[:, None] & key_valid[None, :] & (key_pos[None, :] <= query_pos[:, None])
        if USE_SLIDING_WINDOW:
            visible = visible & (query_pos[:, None] - key_pos[None, :] < sliding_window)
        scores = tl.where(visible, scores, float("-inf"))

        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        # A row with nothing visible yet keeps max -inf; subtract 0 so exp2 gives 0, not NaN.
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.exp2(scores - safe_max[:, None])
        rescale = tl.exp2(running_max - safe_max)
        running_sum = running_sum * rescale + tl.sum(probs, axis=1)
        probs = probs.to(v.dtype)
        if DOT_IN_FP32:
            probs = probs.to(tl.float32)
            v = v.to(tl.float32)
        acc = tl.dot(probs, v, acc * rescale[:, None], input_precision=DOT_PRECISION)
        running_max = new_max

    if SPLIT_KV:
        segm_row = (token * NUM_HEADS_Q + head) * SCRATCH_SEGMENTS + segment
        tl.store(
            segm_output_ptr + segm_row[:, None] * SCRATCH_ROW + dims[None, :],
            acc,
            mask=row_valid[:, None] & dim_mask[None, :],
        )
        tl.store(segm_max_ptr + segm_row, running_max, mask=row_valid)
        tl.store(segm_expsum_ptr + segm_row, running_sum, mask=row_valid)
    else:
        out = acc / tl.where(running_sum > 0.0, running_sum, 1.0)[:, None]
        tl.store(
            output_ptr
            + token[:, None] * stride_output_token
            + head[:, None] * stride_output_head
            + dims[None, :],
            out.to(output_ptr.dtype.element_ty),
            mask=row_valid[:, None] & dim_mask[None, :],
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
