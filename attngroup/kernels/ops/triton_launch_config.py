"""Launch parameters of Triton unified attention: the path, tiles, rows and segment counts.

Pure heuristics over the batch's host-side sizes (no tensors, no device): ``select_path``
picks 2D or split-KV (3D), ``choose_launch_config`` the tunable ``LaunchConfig`` and
``split_kv_segments`` a segment count that fills whole waves. ``attngroup.kernels.ops.triton_launch_plan``
applies them to one call; pass ``config=`` there (or to ``unified_attention``) to tune
without editing the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import triton

from attngroup.kernels.metadata import cdiv
from attngroup.kernels.ops.triton_occupancy import H200_WAVE_SLOTS

MAX_3D_QUERY_LEN = 8
"""The longest query (decode, or verify of up to 7 drafts) the split-KV path serves."""
DEFAULT_NUM_SEGMENTS = 32
"""KV segments per (q-block, KV head) a builder should allocate scratch for (vLLM's is 16; a
few requests over long contexts need more to fill one wave on the H200: 16 x 32k at head 256
took 24)."""
MIN_LAUNCH_GRID_SIZE_2D = 128
"""Default 3D threshold numerator: ``seq_threshold_3d = 128 // num_kv_heads`` as in vLLM."""
MIN_SEGMENTS_3D = 2
"""Split-KV launches take the fewest whole waves that give every (q-block, KV head) at least
this many segments. Measured on the H200 (attngroup.benchmarks.tuning.sweep, Gemma 4 head 256 and 512,
decode and verify at 64 x 8k and 16 x 32k, 4 to 32 segments): every fastest count was the one
that filled whole waves of resident programs (a launch of 1.3 waves ran up to 20 % slower than
one of 0.97), and one wave beat two: 6 segments against 12 for the head-256 decode, 4 against 8
for the verify (head 256: 167.9 against 172.1 us; head 512: 357.2 against 370.1 us). Below 4
too (``attngroup.benchmarks.tuning.ab``, ``h200-2026-12-04-e4b-one-wave-ab.txt``): the e4b's 128
(request, KV head) programs at 64 x 8k on tensor descriptors ran one wave of 2 segments at head
512 (decode 503.3 against 509.2 us for two waves of 4, verify 507.0 against 516.6, draft 506.8
against 510.4) and of 3 at head 256 (decode 260.5 against 263.5, verify 262.3 against 269.2;
the draft, 2 per SM, 270.4 against 272.2 at 2). Llama at 16 x 32k keeps its one wave of 5
(96 registers and 38 KiB: 5 per SM; 2 and 3 segments ran 1.12-1.49x slower,
``h200-2026-12-04-llama-segments-ab.txt``)."""
LaunchKind = Literal["2d", "3d"]
"""The kernel launch: one program per (q-block, KV head) over the whole sequence (2D), or
split-KV segments merged afterwards (3D); vLLM calls the choice the path."""
TUNED_BANDWIDTH_OPTIONS: dict[tuple[int, bool, int | None], dict[str, Any]] = {
    (256, False, None): {
        "tile_size": 32,
        "num_warps": 4,
        "num_stages": 3,
        "value_splits": 1,
        "prefetch_block_table": True,
    },
    (512, False, 2): {"num_stages": 3},
}
"""``LaunchConfig`` fields that replace the heuristic's for decode and short verify, by
(padded head size, more than one query token per request, group size or None for any), where
a same-process A/B on the H200 (``attngroup.benchmarks.tuning.ab``) found a variant faster on
every measured case of that key; an entry for one group size wins over the one for any
(``tuned_options``); other keys keep the heuristic, and ``TUNED_TMA_OPTIONS`` replaces an
entry where tensor descriptors can read the cache. Head 256, one token (decode, draft):
32-key tiles, block numbers read one tile ahead and three stages, which lets Triton's
pipeliner double-buffer K and V in the shared memory one 64-key tile took (e2b decode 145.7
against 148.5 us, e4b decode 265.5 against 267.6;
``attngroup/benchmarks/results/h200-2026-12-04-kernel-ab.txt``). Head 512, one token, two
query heads per KV head (the e4b draft): three stages, 236 registers per thread against 217
(525.6 against 553.4 us at 16 x 32k, 527.3 against 556.3 at 64 x 8k); at four or eight query
heads per KV head three stages reach 255 registers and run 4-6 % slower (e2b draft 295.9
against 283.5 us, e4b decode 566.6 against 534.5, e2b decode 294.3 against 277.0;
``h200-2026-12-04-tma-ab.txt``). With pointer loads nothing measured faster for verify (same
files)."""


_TMA_PAGE_TILES = {
    "tile_size": 16,
    "num_warps": 4,
    "num_stages": 3,
    "value_splits": 1,
    "prefetch_block_table": True,
    "tma_kv": True,
}
TUNED_TMA_OPTIONS: dict[tuple[int, bool, int | None], dict[str, Any]] = {
    **{
        (head_size_padded, several_tokens, None): dict(_TMA_PAGE_TILES)
        for head_size_padded in (256, 512)
        for several_tokens in (False, True)
    },
    (256, False, 2): {**_TMA_PAGE_TILES, "max_registers": 168},
}
"""Entries keyed as ``TUNED_BANDWIDTH_OPTIONS`` that replace its entry for a cache whose pages
tensor descriptors can load one per tile (the tile is the page: the entry applies when the
page size equals its ``tile_size``; ``triton_launch_plan`` checks the layout). Head 256,
decode, draft and verify: K and V fetched by the tensor-memory accelerator one 16-key page at a
time, the page numbers read one tile ahead and three stages, so Triton's pipeliner keeps two
pages of K and V in flight in 40-49 KiB of shared memory where the pointer loads took 73-84 KiB
for one buffer. Same-process A/B on the H200 (``attngroup.benchmarks.tuning.ab``,
``attngroup/benchmarks/results/h200-2026-12-04-tma-prefetch-ab.txt``), against the launcher's
choice of the time: e2b verify 149.7 against 166.6 us at 64 x 8k and 150.1 against 167.4 at
16 x 32k, e4b verify 270.2 against 276.9 and 261.7 against 268.2, e2b decode 142.2 against
147.3, e4b decode 263.7 against 270.4; four and six stages were slower than three on every case.
Head 512, the same entry: 255 registers (the offline compile spills 184 bytes) and still faster
than every pointer-load variant on the five 64 x 8k cases measured
(``h200-2026-12-04-head512-tma-prefetch-ab.txt``): e2b verify 274.7 against 361.0 us, e2b
decode 263.2 against 279.9, e4b decode 508.0 against 540.1, e4b verify 516.4 against 547.5, e4b
draft 511.7 against 534.0 (its entry above); eight warps on pointer loads, which compile to
98-128 registers, ran 1.37-1.56x slower. Head 256, one token, two query heads per KV head (the
e4b draft): the same entry capped at 168 registers, where it compiles to 154 instead of 195 and
holds 3 programs per SM instead of 2 (``h200-2026-12-05-registers-ab.txt``: 260.8 against 270.5
us at 64 x 8k, 261.6 against 270.8 at 16 x 32k; a cap of 128, 1.7-1.8 % slower than 168; on the
decode, four query heads per KV head at 168 registers already, the cap of 168 measured level,
1.002x)."""


def _table_entry(
    table: dict[tuple[int, bool, int | None], dict[str, Any]],
    head_size_padded: int,
    several_tokens: bool,
    group_size: int,
) -> dict[str, Any]:
    """A table's entry for the group size, else its entry for any group size, else none."""
    general = table.get((head_size_padded, several_tokens, None), {})
    return table.get((head_size_padded, several_tokens, group_size), general)


def tuned_options(
    head_size_padded: int,
    several_tokens: bool,
    group_size: int,
    tma_page_size: int | None = None,
) -> dict[str, Any]:
    """The tuned options of a bandwidth-bound launch: the ``TUNED_TMA_OPTIONS`` entry when the
    cache's pages (``tma_page_size``, None when tensor descriptors cannot read the cache) are
    its tiles, else the ``TUNED_BANDWIDTH_OPTIONS`` entry, else none."""
    tma = _table_entry(TUNED_TMA_OPTIONS, head_size_padded, several_tokens, group_size)
    if tma and tma["tile_size"] == tma_page_size:
        return tma
    return _table_entry(TUNED_BANDWIDTH_OPTIONS, head_size_padded, several_tokens, group_size)


# The interpreter runs tl.dot through numpy, which mishandles bfloat16: operands are upcast to
# float32 there (after rounding P to the cache dtype, so the rounding matches the GPU path).
# triton.jit picks the interpreter when a kernel is defined, so the flag is read then too.
INTERPRETED = bool(triton.knobs.runtime.interpret)


@dataclass(frozen=True)
class LaunchConfig:
    """The tunable launch parameters of one attention call.

    ``block_m``: rows (query tokens x grouped heads) per program, a power of two >= 16 and >=
    the group size. ``tile_size``: keys per inner-loop step, a power of two >= 16.
    ``num_segments``: KV segments of a split-KV launch (ignored by 2D), at most the scratch's;
    None: as many as fill whole waves of the compiled kernel (what the heuristic does).
    ``merge_heads_per_program``: query heads per program of the split-KV merge.
    ``value_splits``: programs that share one q-block's softmax, each owning that fraction of
    V's (padded) head dimension; a power of two leaving >= 16 columns each.
    ``prefetch_block_table``: read each tile's block numbers one iteration ahead.
    ``tma_kv``: load K and V through tensor descriptors (Hopper's tensor-memory accelerator),
    one page per tile: ``tile_size`` must equal the cache's block size.
    ``max_registers``: Triton's ``maxnreg``, a cap on registers per thread that buys another
    resident program per SM at the price of spills (None: the compiler's choice).
    """

    block_m: int
    tile_size: int
    num_warps: int
    num_stages: int
    num_segments: int | None = 1
    merge_heads_per_program: int = 1
    value_splits: int = 1
    prefetch_block_table: bool = False
    tma_kv: bool = False
    max_registers: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_m", "tile_size"):
            value = getattr(self, name)
            if value < 16 or value != next_power_of_2(value):
                raise ValueError(f"{name} must be a power of two >= 16; got {value}")
        segments = 1 if self.num_segments is None else self.num_segments
        if min(self.num_warps, self.num_stages, segments) < 1:
            raise ValueError(f"num_warps, num_stages and num_segments must be >= 1: {self}")
        for name in ("merge_heads_per_program", "value_splits"):
            value = getattr(self, name)
            if value < 1 or value != next_power_of_2(value):
                raise ValueError(f"{name} must be a power of two; got {value}")
        if self.max_registers is not None and not 24 <= self.max_registers <= 255:
            raise ValueError(f"max_registers must be in 24..255; got {self.max_registers}")

    def block_q(self, group_size: int) -> int:
        """Query tokens per program."""
        return self.block_m // group_size


def next_power_of_2(n: int) -> int:
    """The least power of two >= ``n`` (``n >= 1``), in plain Python: Triton's own is a
    JIT-callable wrapper costing microseconds per call on the host side of every launch."""
    return 1 << (n - 1).bit_length()


def dot_head_size(head_size: int) -> int:
    """The head dimension the kernel computes with: a power of two, and >= 16 for tl.dot."""
    return max(16, next_power_of_2(head_size))


def rows_per_program(group_size: int, max_query_len: int, head_size: int) -> int:
    """``block_m``: enough rows for every token of a short query (so verify reads KV once),
    capped by the accumulator's register footprint for wide heads, never below 16 or G."""
    head_size_padded = dot_head_size(head_size)
    cap = min(128, max(16, 16384 // head_size_padded))
    wanted = min(cap, next_power_of_2(group_size * max(max_query_len, 1)))
    return max(16, next_power_of_2(group_size), wanted)


def choose_launch_config(
    *,
    num_heads_q: int,
    num_kv_heads: int,
    head_size: int,
    num_seqs: int,
    max_query_len: int,
    max_seq_len: int,
    path: LaunchKind,
    max_segments: int = DEFAULT_NUM_SEGMENTS,
    wave_slots: int = H200_WAVE_SLOTS,
    tma_page_size: int | None = None,
) -> LaunchConfig:
    """The heuristic launch parameters.

    Decode and short verify are bandwidth-bound: 32 KiB of K and V per tile at head <= 256,
    two pipeline stages (measured on the H200). Prefill is compute-bound: wider q-blocks. Split-KV
    fills whole waves of ``wave_slots`` resident programs (``split_kv_segments``);
    ``plan_launch`` asks its probe for them. ``tma_page_size``: the cache's page size when
    tensor descriptors can load its pages (``plan_launch`` checks the layout), else None.
    """
    group_size = num_heads_q // num_kv_heads
    head_size_padded = dot_head_size(head_size)
    block_m = rows_per_program(group_size, max_query_len, head_size)
    bandwidth_bound = max_query_len <= MAX_3D_QUERY_LEN
    if bandwidth_bound:
        # Tuned on the H200 (attngroup.benchmarks.tuning.sweep): 64-key tiles up to head 256, 32 at
        # head 512, four warps and two stages were fastest for decode, verify and draft alike.
        tile_size = 64 if head_size_padded <= 256 else 32
        num_warps = 4
    else:
        tile_size = min(64, max(16, 8192 // head_size_padded))
        num_warps = 8 if block_m * head_size_padded >= 16384 else 4
    # The interpreter pays per program, a GPU wants many small ones.
    merge_heads = next_power_of_2(num_heads_q) if INTERPRETED else 1
    config = LaunchConfig(block_m, tile_size, num_warps, 2, 1, merge_heads)
    if bandwidth_bound:
        config = replace(
            config,
            **tuned_options(head_size_padded, max_query_len > 1, group_size, tma_page_size),
        )
    if path == "3d":
        block_q = config.block_q(group_size)
        num_segments = split_kv_segments(
            kv_programs=num_seqs
            * cdiv(max_query_len, block_q)
            * num_kv_heads
            * config.value_splits,
            num_tiles=cdiv(max(max_seq_len, 1), config.tile_size),
            wave_slots=wave_slots,
            max_segments=max_segments,
        )
        config = replace(config, num_segments=num_segments)
    return config


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
    waves = cdiv(MIN_SEGMENTS_3D * kv_programs, wave_slots)
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
    max_3d_query_len: int = MAX_3D_QUERY_LEN,
) -> LaunchKind:
    """2D or split-KV 3D for this batch.

    "auto" picks 3D when scratch is given, ``max_query_len <= max_3d_query_len`` (decode and
    short verify; vLLM takes 3D for decode only; a builder passes the longest query its
    scratch rows were sized for, so a short prefill chunk runs 2D) and the 2D grid would be
    small: ``num_seqs * cdiv(max_query_len, block_q) <= seq_threshold_3d`` (default
    ``128 // num_kv_heads``). "3d" forces split-KV and raises where it cannot run.
    """
    if path == "2d":
        return "2d"
    if path not in ("auto", "3d"):
        raise ValueError(f"path must be 'auto', '2d' or '3d'; got {path!r}")
    longest_3d_query = min(max_3d_query_len, MAX_3D_QUERY_LEN)
    allowed = has_scratch and max_query_len <= longest_3d_query
    if path == "3d":
        if not allowed:
            raise ValueError(
                "path='3d' needs split-KV scratch and max_query_len <= "
                f"{longest_3d_query}; got scratch={'yes' if has_scratch else 'none'}, "
                f"max_query_len={max_query_len}"
            )
        return "3d"
    if not allowed:
        return "2d"
    if seq_threshold_3d is None:
        seq_threshold_3d = max(1, MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads)
    group_size = num_heads_q // num_kv_heads
    block_q = rows_per_program(group_size, max_query_len, head_size) // group_size
    q_blocks = num_seqs * cdiv(max_query_len, block_q)
    return "3d" if q_blocks <= seq_threshold_3d else "2d"
