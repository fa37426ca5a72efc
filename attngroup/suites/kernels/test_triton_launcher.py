"""The unified-attention launcher: path selection, the split-KV scratch guard, input checks.

A scratch that does not fit the launch (sized for another head count, too few rows) must be
refused before any kernel runs: the output and the scratch keep their poison bits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pytest
import torch

from attngroup.kernels.attention_oracle import paged_attention_reference
from attngroup.kernels.ops import triton_occupancy
from attngroup.kernels.ops.split_kv_scratch import ScratchTooSmallError, SplitKVScratch
from attngroup.kernels.ops.triton_launch_config import (
    DEFAULT_NUM_SEGMENTS,
    MAX_3D_QUERY_LEN,
    MIN_SEGMENTS_3D,
    LaunchConfig,
    LaunchKind,
    choose_launch_config,
    select_path,
    split_kv_segments,
)
from attngroup.kernels.ops.triton_occupancy import H200_SMS, resident_programs_per_sm
from attngroup.kernels.ops.triton_unified_attention import unified_attention
from attngroup.suites.kernels.batches import (
    BATCHES_CPU,
    RELATIVE_ERROR_BOUND,
    BatchSpec,
    PagedBatch,
    gpu_only,
    make_paged_batch,
    relative_error,
)

pytestmark = pytest.mark.kernels


@dataclass(frozen=True)
class PathQuery:
    """The arguments of ``select_path``."""

    num_seqs: int
    max_query_len: int
    num_heads_q: int
    num_kv_heads: int
    head_size: int
    has_scratch: bool = True
    path: str = "auto"
    seq_threshold_3d: int | None = None


# Thresholds default to 128 // num_kv_heads. A request's q-blocks are cdiv(max_query_len,
# block_m // G) with block_m = min(cap, next_pow2(G * max_query_len)), cap 64 rows at head
# size 256 and 32 at 512.
PATH_TABLE = {
    "decode-gemma-e2b": (PathQuery(4, 1, 8, 1, 256), "3d"),
    "decode-no-scratch": (PathQuery(4, 1, 8, 1, 256, has_scratch=False), "2d"),
    "verify8-one-q-block": (PathQuery(4, 8, 8, 1, 256), "3d"),
    "verify9-too-long": (PathQuery(4, 9, 8, 1, 256), "2d"),
    "prefill": (PathQuery(2, 512, 8, 1, 256), "2d"),
    "decode-at-threshold-32q8kv": (PathQuery(16, 1, 32, 8, 128), "3d"),
    "decode-over-threshold-32q8kv": (PathQuery(17, 1, 32, 8, 128), "2d"),
    "verify8-d512-two-q-blocks-at-threshold": (PathQuery(64, 8, 8, 1, 512), "3d"),
    "verify8-d512-two-q-blocks-over-threshold": (PathQuery(65, 8, 8, 1, 512), "2d"),
    "custom-threshold": (PathQuery(8, 1, 4, 2, 256, seq_threshold_3d=4), "2d"),
    "forced-2d-with-scratch": (PathQuery(4, 1, 8, 1, 256, path="2d"), "2d"),
    "forced-3d-over-threshold": (PathQuery(500, 1, 8, 1, 256, path="3d"), "3d"),
}


@pytest.mark.parametrize(("query", "expected"), PATH_TABLE.values(), ids=PATH_TABLE)
def test_select_path(query: PathQuery, expected: str) -> None:
    assert select_path(**asdict(query)) == expected


@pytest.mark.parametrize(
    ("max_query_len", "has_scratch"),
    [(1, False), (MAX_3D_QUERY_LEN + 1, True)],
    ids=["no-scratch", "query-too-long"],
)
def test_select_path_refuses_forced_3d(max_query_len: int, has_scratch: bool) -> None:
    with pytest.raises(ValueError, match="path='3d' needs split-KV scratch"):
        select_path(
            num_seqs=2,
            max_query_len=max_query_len,
            num_heads_q=8,
            num_kv_heads=1,
            head_size=256,
            has_scratch=has_scratch,
            path="3d",
        )


@pytest.mark.parametrize(
    ("num_heads_q", "num_kv_heads", "head_size"),
    [(8, 1, 256), (4, 1, 256), (8, 2, 512), (4, 2, 512), (32, 8, 128)],
    ids=["hq8-hkv1-d256", "hq4-hkv1-d256", "hq8-hkv2-d512", "hq4-hkv2-d512", "hq32-hkv8-d128"],
)
@pytest.mark.parametrize("max_query_len", [1, 4, 8])
def test_verify_reads_kv_once_per_request(
    num_heads_q: int, num_kv_heads: int, head_size: int, max_query_len: int
) -> None:
    """Every token of a short verify and its grouped heads share one program, so each KV tile
    is loaded once per (request, KV head), up to the head-size register cap."""
    config = choose_launch_config(
        num_heads_q=num_heads_q,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        num_seqs=64,
        max_query_len=max_query_len,
        max_seq_len=8192,
        path="3d",
    )
    group_size = num_heads_q // num_kv_heads
    rows_needed = group_size * max_query_len
    cap = 16384 // head_size
    if rows_needed <= cap:
        assert config.block_q(group_size) >= max_query_len
    assert config.block_m >= max(16, group_size)
    assert config.num_segments is not None, "a 3D launch config carries its segment count"
    assert 1 <= config.num_segments <= DEFAULT_NUM_SEGMENTS


@pytest.mark.parametrize(
    ("num_heads_q", "num_kv_heads", "head_size"),
    [(64, 1, 512), (128, 1, 256), (128, 2, 512), (256, 1, 128)],
    ids=["hq64-hkv1-d512", "hq128-hkv1-d256", "hq128-hkv2-d512", "hq256-hkv1-d128"],
)
@pytest.mark.parametrize("max_query_len", [1, 4, 64])
@pytest.mark.parametrize("path", ["2d", "3d"])
def test_a_group_wider_than_the_register_cap_still_fits_one_program(
    num_heads_q: int, num_kv_heads: int, head_size: int, max_query_len: int, path: LaunchKind
) -> None:
    """MQA-like groups of more query heads per KV head than the head size's register cap
    (16384 // head) allows rows: a program's rows must still hold one whole group, or the
    q-block holds ``block_m // G == 0`` tokens (vLLM PR #23424: BLOCK_M fixed at 16, a
    division by zero for more than 16 query heads per KV head)."""
    config = choose_launch_config(
        num_heads_q=num_heads_q,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        num_seqs=4,
        max_query_len=max_query_len,
        max_seq_len=4096,
        path=path,
    )
    group_size = num_heads_q // num_kv_heads
    assert group_size > 16384 // head_size, "the case must exceed the register cap"
    assert config.block_m >= group_size, (
        f"block_m {config.block_m} rows cannot hold the {group_size} query heads of one KV head"
    )
    assert config.block_q(group_size) >= 1


# The fastest segment counts of attngroup.benchmarks.tuning.sweep on the H200 (4 to 32 segments swept)
# and of the one-wave A/B (h200-2026-12-04-e4b-one-wave-ab.txt, 2 and 3 against the launcher's):
# (KV programs = q-blocks x KV heads, tiles of the context, wave slots, fastest segments).
MEASURED_SEGMENT_OPTIMA = {
    "e2b-d256-decode-64x8k": (64, 128, 3 * H200_SMS, 6),
    "e2b-d256-decode-16x32k": (16, 512, 3 * H200_SMS, 24),
    "e4b-d256-decode-64x8k": (128, 512, 3 * H200_SMS, 3),
    "e4b-d256-draft-64x8k": (128, 512, 2 * H200_SMS, 2),
    "e4b-d512-decode-64x8k": (128, 512, 2 * H200_SMS, 2),
    "e4b-d256-decode-16x32k": (32, 512, 3 * H200_SMS, 12),
    "e2b-d512-decode-64x8k": (64, 256, 2 * H200_SMS, 4),
    "e2b-d512-decode-16x32k": (16, 1024, 2 * H200_SMS, 16),
    "e2b-d256-verify-64x8k": (64, 128, 2 * H200_SMS, 4),
    "e2b-d512-verify-64x8k": (64, 256, 2 * H200_SMS, 4),
    "e2b-d512-verify-16x32k": (16, 1024, 2 * H200_SMS, 16),
}


@pytest.mark.parametrize(
    ("kv_programs", "num_tiles", "wave_slots", "fastest"),
    list(MEASURED_SEGMENT_OPTIMA.values()),
    ids=list(MEASURED_SEGMENT_OPTIMA),
)
def test_split_kv_segments_pick_the_measured_fastest(
    kv_programs: int, num_tiles: int, wave_slots: int, fastest: int
) -> None:
    segments = split_kv_segments(
        kv_programs=kv_programs, num_tiles=num_tiles, wave_slots=wave_slots, max_segments=32
    )
    assert segments == fastest


@pytest.mark.parametrize("kv_programs", [1, 7, 16, 64, 100, 128, 500, 4096])
@pytest.mark.parametrize("wave_slots", [2, 264, 396])
def test_split_kv_segments_fill_whole_waves(kv_programs: int, wave_slots: int) -> None:
    """Uncapped, the launch fills its waves to within one segment's programs, and every
    (q-block, KV head) gets at least MIN_SEGMENTS_3D segments."""
    segments = split_kv_segments(
        kv_programs=kv_programs, num_tiles=10**6, wave_slots=wave_slots, max_segments=10**6
    )
    programs = kv_programs * segments
    waves = -(-programs // wave_slots)
    assert segments >= MIN_SEGMENTS_3D
    assert waves * wave_slots - programs < kv_programs
    assert (waves - 1) * wave_slots < MIN_SEGMENTS_3D * kv_programs


@pytest.mark.parametrize(
    ("max_segments", "num_tiles", "expected"), [(4, 100, 4), (32, 3, 3), (32, 0, 1)]
)
def test_split_kv_segments_respect_scratch_and_tiles(
    max_segments: int, num_tiles: int, expected: int
) -> None:
    segments = split_kv_segments(
        kv_programs=16, num_tiles=num_tiles, wave_slots=396, max_segments=max_segments
    )
    assert segments == expected


# Nsight Compute on the H200 (attngroup/benchmarks/results/*ncu*): registers per thread, dynamic shared
# memory per program and its "Block Limit" (4 warps; 2048 threads and 228 KiB per SM).
NSIGHT_OCCUPANCY = {
    "d256-decode": (168, 75_780, 3),
    "d512-verify": (255, 100_350, 2),
}


@pytest.mark.parametrize(
    ("registers", "shared_bytes", "block_limit"),
    list(NSIGHT_OCCUPANCY.values()),
    ids=list(NSIGHT_OCCUPANCY),
)
def test_resident_programs_match_nsight(
    registers: int, shared_bytes: int, block_limit: int
) -> None:
    resident = resident_programs_per_sm(
        registers_per_thread=registers,
        shared_bytes=shared_bytes,
        num_warps=4,
        max_threads_per_sm=2048,
        shared_bytes_per_sm=228 * 1024,
    )
    assert resident == block_limit


@pytest.mark.gpu
@gpu_only
def test_wave_slots_come_from_the_compiled_kernel() -> None:
    """The split-KV launch sizes its waves from the compiled kernel: a positive number of
    programs per SM, no more than the SM's thread limit allows."""
    device = torch.device("cuda")
    batch = _batch(BatchSpec.decode(4, 700, 900, 1200), device=device)
    scratch = SplitKVScratch.allocate(4, 8, DEFAULT_NUM_SEGMENTS, 64, device)
    triton_occupancy._WAVE_SLOTS.clear()
    output = torch.full_like(batch.query, float("nan"))
    _launch(batch, output, scratch=scratch, path="3d")
    (slots,) = triton_occupancy._WAVE_SLOTS.values()
    properties = torch.cuda.get_device_properties(device)
    sms = properties.multi_processor_count
    assert slots % sms == 0
    assert 1 <= slots // sms <= properties.max_threads_per_multi_processor // 128
    assert not output.isnan().any()


def _batch(
    spec: BatchSpec,
    num_heads_q: int = 8,
    num_kv_heads: int = 1,
    device: torch.device | str = "cpu",
) -> PagedBatch:
    return make_paged_batch(
        spec,
        device=device,
        num_heads_q=num_heads_q,
        num_kv_heads=num_kv_heads,
        head_size=64,
        block_size=16,
        dtype=torch.float32,
        seed=7,
    )


def _launch(batch: PagedBatch, output: torch.Tensor, **overrides) -> torch.Tensor:
    arguments = {
        "max_query_len": batch.spec.max_query_len,
        "max_seq_len": batch.spec.max_seq_len,
        "sm_scale": batch.head_size**-0.5,
        **batch.metadata(),
        **overrides,
    }
    return unified_attention(batch.query, batch.key_cache, batch.value_cache, output, **arguments)


SCRATCH_MISMATCHES = {
    # The Gemma 4 MTP hazard: one builder's scratch, sized for the 4-head draft, serves the
    # 8-head target (and the other way round).
    "draft-scratch-target-query": (8, dict(num_heads_q=4), "num_heads_q: scratch 4, query 8"),
    "target-scratch-draft-query": (4, dict(num_heads_q=8), "num_heads_q: scratch 8, query 4"),
    "too-few-rows": (8, dict(rows=3), "rows: scratch 3, needed 4 tokens"),
    "head-size": (8, dict(head_size=128), "head_size_padded: scratch 128, needed 64"),
    "segments": (8, dict(num_segments=2), "segments: scratch 2, launch 4"),
}


@pytest.mark.parametrize("path", ["auto", "3d"])
@pytest.mark.parametrize(
    ("num_heads_q", "scratch_sizes", "message"),
    list(SCRATCH_MISMATCHES.values()),
    ids=list(SCRATCH_MISMATCHES),
)
def test_scratch_mismatch_raises_before_any_launch(
    num_heads_q: int, scratch_sizes: dict, message: str, path: str, device: torch.device
) -> None:
    batch = _batch(BatchSpec.decode(1, 17, 40, 95), num_heads_q=num_heads_q, device=device)
    sizes = {"rows": 4, "num_heads_q": num_heads_q, "num_segments": 8, "head_size": 64}
    scratch = SplitKVScratch.allocate(**(sizes | scratch_sizes), device=device)
    for tensor in (scratch.segm_output, scratch.segm_max, scratch.segm_expsum):
        tensor.view(torch.int32).fill_(0x7FC0DEAD)
    poison_bits = [t.clone() for t in (scratch.segm_output, scratch.segm_max, scratch.segm_expsum)]
    output = torch.full_like(batch.query, float("nan"))
    config = LaunchConfig(block_m=16, tile_size=16, num_warps=4, num_stages=2, num_segments=4)

    with pytest.raises(ScratchTooSmallError, match=message):
        _launch(batch, output, scratch=scratch, path=path, config=config)

    assert output.isnan().all(), "the output was written before the scratch check"
    for tensor, before in zip(
        (scratch.segm_output, scratch.segm_max, scratch.segm_expsum), poison_bits, strict=True
    ):
        assert torch.equal(tensor.view(torch.int32), before.view(torch.int32))


@pytest.mark.parametrize("path", ["2d", "3d"])
def test_padding_tokens_are_left_untouched(path: LaunchKind, device: torch.device) -> None:
    """Rows past query_start_loc[-1] (CUDA-graph padding) are neither read nor written."""
    batch = _batch(BATCHES_CPU["verify"], device=device)
    num_tokens = batch.spec.num_tokens
    padded_query = torch.cat([batch.query, torch.randn(5, *batch.query.shape[1:], device=device)])
    output = torch.full_like(padded_query, float("nan"))
    scratch = SplitKVScratch.allocate(num_tokens + 5, 8, DEFAULT_NUM_SEGMENTS, 64, device)
    unified_attention(
        padded_query,
        batch.key_cache,
        batch.value_cache,
        output,
        **batch.metadata(),
        max_query_len=batch.spec.max_query_len,
        max_seq_len=batch.spec.max_seq_len,
        sm_scale=0.125,
        scratch=scratch,
        path=path,
    )
    expected = paged_attention_reference(
        batch.query, batch.key_cache, batch.value_cache, **batch.metadata(), sm_scale=0.125
    )
    assert output[num_tokens:].isnan().all()
    assert relative_error(output[:num_tokens], expected) < RELATIVE_ERROR_BOUND[torch.float32]


def _bad_inputs() -> dict[str, tuple[dict, str]]:
    batch = _batch(BatchSpec.decode(5, 9))
    return {
        "window-zero": (dict(sliding_window=0), "sliding_window must be >= 1"),
        "negative-soft-cap": (dict(logits_soft_cap=-1.0), "logits_soft_cap must be > 0"),
        "nan-scale": (dict(sm_scale=float("nan")), "sm_scale must be finite"),
        "max-seq-len-below-query": (dict(max_seq_len=0), "max_query_len <= max_seq_len"),
        "wrong-path": (dict(path="4d"), "path must be 'auto', '2d' or '3d'"),
        "float-block-table": (
            dict(block_table=batch.block_table.float()),
            "block_table must be int32 or int64",
        ),
        "short-query-start-loc": (
            dict(query_start_loc=batch.query_start_loc[:-1]),
            r"query_start_loc \[num_seqs \+ 1\]",
        ),
        "block-m-below-group": (
            dict(config=LaunchConfig(block_m=16, tile_size=16, num_warps=4, num_stages=1)),
            "block_m 16 is below the group size 32",
        ),
    }


@pytest.mark.parametrize(
    ("overrides", "message"), list(_bad_inputs().values()), ids=list(_bad_inputs())
)
def test_bad_arguments_raise(overrides: dict, message: str) -> None:
    num_heads_q = 32 if "config" in overrides else 8
    batch = _batch(BatchSpec.decode(5, 9), num_heads_q=num_heads_q)
    output = torch.full_like(batch.query, float("nan"))
    with pytest.raises(ValueError, match=message):
        _launch(batch, output, **overrides)
    assert output.isnan().all()


def _bad_tensors() -> dict[str, tuple[str, torch.Tensor, str]]:
    batch = _batch(BatchSpec.decode(5, 9), num_kv_heads=2)
    return {
        "dtype-mismatch": ("query", batch.query.half(), "must share a dtype"),
        "heads-not-multiple": ("query", torch.randn(2, 3, 64), "not a multiple of num_kv_heads"),
        "head-size-mismatch": ("query", torch.randn(2, 8, 32), "query head size 32 != cache"),
        "output-shape": ("output", torch.empty(2, 8, 32), "output shape"),
        "strided-head-dim": ("output", torch.empty(2, 8, 128)[..., ::2], "output must be contig"),
    }


@pytest.mark.parametrize(
    ("argument", "tensor", "message"), list(_bad_tensors().values()), ids=list(_bad_tensors())
)
def test_bad_tensors_raise(argument: str, tensor: torch.Tensor, message: str) -> None:
    batch = _batch(BatchSpec.decode(5, 9), num_kv_heads=2)
    tensors = {"query": batch.query, "output": torch.empty_like(batch.query)} | {argument: tensor}
    if argument == "query":
        tensors["output"] = torch.empty_like(tensor)
    with pytest.raises(ValueError, match=message):
        unified_attention(
            tensors["query"],
            batch.key_cache,
            batch.value_cache,
            tensors["output"],
            **batch.metadata(),
            max_query_len=1,
            max_seq_len=9,
            sm_scale=1.0,
        )


@pytest.mark.parametrize(
    "fields",
    [dict(block_m=8), dict(tile_size=24), dict(num_segments=0), dict(merge_heads_per_program=3)],
    ids=["block-m-8", "tile-24", "no-segments", "merge-heads-3"],
)
def test_launch_config_rejects_bad_values(fields: dict) -> None:
    with pytest.raises(ValueError):
        LaunchConfig(**({"block_m": 16, "tile_size": 16, "num_warps": 4, "num_stages": 2} | fields))
