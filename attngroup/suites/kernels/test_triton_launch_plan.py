"""The launch plan of Triton unified attention, made on the CPU without a kernel or a GPU.

The tensors live on PyTorch's ``meta`` device: they have shapes, dtypes and strides but no
storage, so a plan that read their data (or launched anything on them) would fail. The
occupancy probe is a recorded stand-in; the expected grids and segment counts below follow
from the heuristics' documented rules, worked out in each case's comment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
import torch
import triton
import triton.language as tl

from attngroup.kernels.ops import COMPILER_OPTIONS
from attngroup.kernels.ops.split_kv_scratch import ScratchTooSmallError, SplitKVScratch
from attngroup.kernels.ops.triton_launch_config import (
    DEFAULT_NUM_SEGMENTS,
    TUNED_BANDWIDTH_OPTIONS,
    TUNED_TMA_OPTIONS,
    LaunchConfig,
    choose_launch_config,
    dot_head_size,
    next_power_of_2,
    tuned_options,
)
from attngroup.kernels.ops.triton_launch_plan import (
    AttentionTensors,
    ConstexprSignature,
    LaunchPlan,
    plan_launch,
)
from attngroup.kernels.ops.triton_occupancy import H200_SMS
from attngroup.kernels.ops.triton_unified_attention import (
    _merge_segments_kernel,
    _unified_attention_kernel,
)

pytestmark = pytest.mark.kernels

META = torch.device("meta")


@dataclass(frozen=True)
class Batch:
    """A uniform batch: ``num_seqs`` requests of ``query_len`` new tokens after a context."""

    num_seqs: int
    query_len: int
    num_heads_q: int
    num_kv_heads: int
    head_size: int
    context_len: int
    scratch_segments: int | None = DEFAULT_NUM_SEGMENTS
    block_size: int = 16
    dtype: torch.dtype = torch.float16

    @property
    def num_tokens(self) -> int:
        return self.num_seqs * self.query_len

    @property
    def max_seq_len(self) -> int:
        return self.context_len + self.query_len

    def tensors(self) -> AttentionTensors:
        query = torch.empty(
            self.num_tokens, self.num_heads_q, self.head_size, dtype=self.dtype, device=META
        )
        blocks_per_seq = triton.cdiv(self.max_seq_len, self.block_size)
        cache_shape = (
            self.num_seqs * blocks_per_seq,
            self.block_size,
            self.num_kv_heads,
            self.head_size,
        )
        scratch = None
        if self.scratch_segments is not None:
            scratch = SplitKVScratch.allocate(
                self.num_tokens, self.num_heads_q, self.scratch_segments, self.head_size, META
            )
        return AttentionTensors(
            query=query,
            key_cache=torch.empty(cache_shape, dtype=self.dtype, device=META),
            value_cache=torch.empty(cache_shape, dtype=self.dtype, device=META),
            output=torch.empty_like(query),
            query_start_loc=torch.empty(self.num_seqs + 1, dtype=torch.int32, device=META),
            seq_lens=torch.empty(self.num_seqs, dtype=torch.int32, device=META),
            block_table=torch.empty(self.num_seqs, blocks_per_seq, dtype=torch.int32, device=META),
            scratch=scratch,
        )


class RecordingProbe:
    """The occupancy probe of a plan: answers ``slots`` and records the plans it was shown."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.plans: list[LaunchPlan] = []

    def __call__(self, plan: LaunchPlan) -> int:
        self.plans.append(plan)
        return self.slots


def _plan(batch: Batch, probe: RecordingProbe, **overrides) -> LaunchPlan | None:
    arguments = {
        "max_query_len": batch.query_len,
        "max_seq_len": batch.max_seq_len,
        "sm_scale": batch.head_size**-0.5,
        "wave_slots": probe,
        **overrides,
    }
    return plan_launch(batch.tensors(), **arguments)


@dataclass(frozen=True)
class Expected:
    """The plan's path, attention grid, rows per program (block_m) and keys per tile."""

    path: str
    grid: tuple[int, int, int]
    block_m: int
    tile_size: int


THREE_PER_SM = 3 * H200_SMS
TWO_PER_SM = 2 * H200_SMS

PLANS = {
    # G = 8, head 256: block_m = 16 rows (the G rows of one token, padded to 16), so block_q =
    # 2 and one q-block per request; 4 KV programs fill one 396-slot wave at 99 segments,
    # capped at the scratch's 32. Head-256 tiles on 16-key pages are the pages
    # (TUNED_TMA_OPTIONS).
    "decode-4x8k-d256": (
        Batch(4, 1, 8, 1, 256, 8192),
        THREE_PER_SM,
        Expected("3d", (4, 1, 32), 16, 16),
    ),
    # 64 KV programs: one wave of 396 slots holds 6 segments each, of 264 slots 4 (the
    # measured optima of test_triton_launcher's MEASURED_SEGMENT_OPTIMA). On 32-key pages
    # one-token head-256 tiles are 32 keys (TUNED_BANDWIDTH_OPTIONS).
    "decode-64x8k-3-per-sm": (
        Batch(64, 1, 8, 1, 256, 8192, block_size=32),
        THREE_PER_SM,
        Expected("3d", (64, 1, 6), 16, 32),
    ),
    "decode-64x8k-2-per-sm": (
        Batch(64, 1, 8, 1, 256, 8192, block_size=32),
        TWO_PER_SM,
        Expected("3d", (64, 1, 4), 16, 32),
    ),
    # Verify of 3 drafts: 4 tokens x G = 8 is 32 rows, one q-block per request; 16-key pages.
    "verify4-4x8k-d256": (
        Batch(4, 4, 8, 1, 256, 8192),
        THREE_PER_SM,
        Expected("3d", (4, 1, 32), 32, 16),
    ),
    # The same on 32-key pages: the heuristic's 64-key tiles.
    "verify4-4x8k-d256-page-32": (
        Batch(4, 4, 8, 1, 256, 8192, block_size=32),
        THREE_PER_SM,
        Expected("3d", (4, 1, 32), 32, 64),
    ),
    # Head 512 caps block_m at 32 rows, 4 tokens of G = 8: 8 tokens need two q-blocks per
    # request; tiles are the 16-key pages (TUNED_TMA_OPTIONS); 8 KV programs take 33 segments
    # of a 264-slot wave, capped at 32.
    "verify8-2x4k-d512-2kv": (
        Batch(2, 8, 16, 2, 512, 4096),
        TWO_PER_SM,
        Expected("3d", (4, 2, 32), 32, 16),
    ),
    # The same on 32-key pages: the heuristic's 32-key tiles at head 512.
    "verify8-2x4k-d512-2kv-page-32": (
        Batch(2, 8, 16, 2, 512, 4096, block_size=32),
        TWO_PER_SM,
        Expected("3d", (4, 2, 32), 32, 32),
    ),
    # A short context caps segments at one 64-key tile each: 100 + 1 keys make 2 tiles.
    "decode-short-context-tile-cap": (
        Batch(2, 1, 4, 1, 128, 100),
        THREE_PER_SM,
        Expected("3d", (2, 1, 2), 16, 64),
    ),
    # 200 tokens of prefill: block_m 128 rows = 16 tokens of G = 8; the 2D grid's q-block
    # axis is the host bound 200 // 16 + 2 requests = 14.
    "prefill-2x100-d64": (
        Batch(2, 100, 8, 1, 64, 200),
        THREE_PER_SM,
        Expected("2d", (14, 1, 1), 128, 64),
    ),
    # Without scratch decode runs 2D: 4 tokens // block_q 2 + 4 requests = 6 q-blocks.
    "decode-no-scratch": (
        Batch(4, 1, 8, 1, 256, 8192, scratch_segments=None),
        THREE_PER_SM,
        Expected("2d", (6, 1, 1), 16, 16),
    ),
    # 17 requests of G = 4 and 8 KV heads pass the 2D threshold 128 // 8 = 16.
    "decode-over-threshold": (
        Batch(17, 1, 32, 8, 128, 1024),
        THREE_PER_SM,
        Expected("2d", (17 // 4 + 17, 8, 1), 16, 64),
    ),
}


@pytest.fixture(params=list(PLANS.values()), ids=list(PLANS))
def planned(request: pytest.FixtureRequest) -> tuple[Batch, RecordingProbe, LaunchPlan, Expected]:
    batch, slots, expected = request.param
    probe = RecordingProbe(slots)
    plan = _plan(batch, probe)
    assert plan is not None
    return batch, probe, plan, expected


def test_plan_path_grid_and_tiles(planned) -> None:
    _, _, plan, expected = planned
    assert plan.path == expected.path
    assert plan.attention.grid == expected.grid
    assert plan.num_segments == expected.grid[2]
    assert (plan.config.block_m, plan.config.tile_size) == (expected.block_m, expected.tile_size)


def test_split_kv_plans_merge_and_scratch_needs(planned) -> None:
    batch, _, plan, _ = planned
    if plan.path == "2d":
        assert plan.merge is None and plan.scratch_needs is None
        return
    heads = plan.config.merge_heads_per_program
    assert plan.merge is not None and plan.scratch_needs is not None
    assert plan.merge.grid == (batch.num_tokens, triton.cdiv(batch.num_heads_q, heads))
    needs = plan.scratch_needs
    assert (needs.rows, needs.num_heads_q, needs.num_segments) == (
        batch.num_tokens,
        batch.num_heads_q,
        plan.num_segments,
    )
    assert needs.head_size_padded == triton.next_power_of_2(batch.head_size)
    assert needs.device == META


def test_probe_sees_the_variant_that_launches(planned) -> None:
    """A heuristic split-KV plan asks the probe once, about the kernel variant it launches;
    a 2D plan never asks."""
    _, probe, plan, _ = planned
    if plan.path == "2d":
        assert probe.plans == []
        return
    (probed,) = probe.plans
    assert probed.attention.constexprs == plan.attention.constexprs
    assert probed.attention.options == plan.attention.options


def test_every_kernel_states_the_compiler_options(planned) -> None:
    """FP fusion is set on each launch, not left to a Triton default that 3.10 turns off."""
    _, _, plan, _ = planned
    launches = [plan.attention] if plan.merge is None else [plan.attention, plan.merge]
    for launch in launches:
        assert COMPILER_OPTIONS.items() <= launch.options.items()


def test_constexprs_are_exactly_the_kernels(planned) -> None:
    """Fails when a kernel gains a tl.constexpr the plan does not set, or loses one it does."""
    _, _, plan, _ = planned
    attention = ConstexprSignature.of(_unified_attention_kernel)
    assert attention.mismatches(plan.attention.constexprs) == []
    if plan.merge is not None:
        merge = ConstexprSignature.of(_merge_segments_kernel)
        assert merge.mismatches(plan.merge.constexprs) == []


@triton.jit
def _toy_kernel(x_ptr, n, BLOCK: tl.constexpr, USE_MASK: tl.constexpr, WIDE: tl.constexpr = False):
    tl.store(x_ptr + tl.arange(0, BLOCK), n, mask=USE_MASK and not WIDE)


def test_constexpr_signature_reads_required_and_optional() -> None:
    signature = ConstexprSignature.of(_toy_kernel)
    assert signature == ConstexprSignature(
        required=frozenset({"BLOCK", "USE_MASK"}), optional=frozenset({"WIDE"})
    )


@pytest.mark.parametrize(
    ("passed", "mismatches"),
    [
        ({"BLOCK", "USE_MASK"}, []),
        ({"BLOCK", "USE_MASK", "WIDE"}, []),
        ({"BLOCK"}, ["missing USE_MASK"]),
        (
            {"BLOCK", "USE_MASK", "n", "TILE"},
            ["not a constexpr of the kernel: TILE", "not a constexpr of the kernel: n"],
        ),
    ],
    ids=["required-only", "with-optional", "missing", "runtime-arg-and-unknown"],
)
def test_constexpr_mismatches(passed: set[str], mismatches: list[str]) -> None:
    assert ConstexprSignature.of(_toy_kernel).mismatches(passed) == mismatches


@pytest.mark.parametrize(
    ("soft_cap", "dtype", "qk_scale_factor", "precision"),
    [
        (None, torch.float16, math.log2(math.e), "tf32"),
        (30.0, torch.float16, 1.0, "tf32"),
        (None, torch.float32, math.log2(math.e), "ieee"),
    ],
    ids=["fp16-base2-scores", "fp16-soft-cap-natural-units", "fp32-ieee-dot"],
)
def test_scalars_and_precision(
    soft_cap: float | None, dtype: torch.dtype, qk_scale_factor: float, precision: str
) -> None:
    batch = Batch(2, 1, 8, 1, 64, 300, dtype=dtype)
    plan = _plan(batch, RecordingProbe(THREE_PER_SM), logits_soft_cap=soft_cap, sliding_window=24)
    assert plan is not None
    assert plan.qk_scale == pytest.approx(batch.head_size**-0.5 * qk_scale_factor)
    assert plan.soft_cap == (soft_cap or 0.0)
    assert plan.sliding_window == 24
    constexprs = plan.attention.constexprs
    assert constexprs["DOT_PRECISION"] == precision
    assert constexprs["USE_SOFTCAP"] is (soft_cap is not None)
    assert constexprs["USE_SLIDING_WINDOW"] is True


def test_given_config_is_kept_and_skips_the_probe() -> None:
    batch = Batch(4, 1, 8, 1, 256, 8192)
    probe = RecordingProbe(THREE_PER_SM)
    config = LaunchConfig(block_m=16, tile_size=32, num_warps=8, num_stages=3, num_segments=5)
    plan = _plan(batch, probe, config=config)
    assert plan is not None
    assert plan.config == config
    assert plan.attention.grid == (4, 1, 5)
    assert dict(plan.attention.options) == {**COMPILER_OPTIONS, "num_warps": 8, "num_stages": 3}
    assert probe.plans == []


def test_a_register_cap_becomes_tritons_maxnreg() -> None:
    batch = Batch(4, 1, 8, 1, 256, 8192)
    config = LaunchConfig(16, 32, 4, 3, 5, max_registers=168)
    plan = _plan(batch, RecordingProbe(THREE_PER_SM), config=config)
    assert plan is not None
    assert dict(plan.attention.options) == {
        **COMPILER_OPTIONS,
        "num_warps": 4,
        "num_stages": 3,
        "maxnreg": 168,
    }


@pytest.mark.parametrize("cap", [16, 256], ids=["below-24", "above-255"])
def test_a_register_cap_outside_the_hardware_range_is_refused(cap: int) -> None:
    with pytest.raises(ValueError, match=r"max_registers must be in 24\.\.255"):
        LaunchConfig(16, 32, 4, 3, max_registers=cap)


def test_empty_batch_plans_nothing() -> None:
    probe = RecordingProbe(THREE_PER_SM)
    assert _plan(Batch(0, 1, 8, 1, 64, 10, scratch_segments=None), probe) is None
    assert probe.plans == []


def test_scratch_shortfall_raises_at_planning() -> None:
    batch = Batch(4, 1, 8, 1, 256, 8192, scratch_segments=4)
    config = LaunchConfig(block_m=16, tile_size=64, num_warps=4, num_stages=2, num_segments=8)
    with pytest.raises(ScratchTooSmallError, match="segments: scratch 4, launch 8"):
        _plan(batch, RecordingProbe(THREE_PER_SM), path="3d", config=config)


@pytest.mark.parametrize(("num_heads_q", "stages"), [(4, 3), (8, 2)], ids=["group-2", "group-4"])
def test_a_group_sizes_own_tuned_entry_wins(num_heads_q: int, stages: int) -> None:
    """Head 512, one token: the entry for two query heads per KV head applies to them only."""
    config = choose_launch_config(
        num_heads_q=num_heads_q,
        num_kv_heads=2,
        head_size=512,
        num_seqs=16,
        max_query_len=1,
        max_seq_len=32768,
        path="3d",
    )
    assert config.num_stages == stages
    assert tuned_options(256, False, 2) == TUNED_BANDWIDTH_OPTIONS[(256, False, None)]


@pytest.mark.parametrize(
    ("batch", "tensor_descriptors"),
    [
        pytest.param(Batch(4, 1, 8, 1, 256, 8192), True, id="decode-page-16"),
        pytest.param(Batch(4, 1, 4, 2, 256, 8192), True, id="draft-2-heads-per-kv-head-page-16"),
        pytest.param(Batch(4, 4, 8, 1, 256, 8192), True, id="verify-page-16"),
        pytest.param(Batch(4, 1, 8, 1, 256, 8192, block_size=32), False, id="decode-page-32"),
        pytest.param(Batch(4, 4, 8, 1, 256, 8192, block_size=32), False, id="verify-page-32"),
        pytest.param(Batch(4, 1, 8, 1, 192, 8192), False, id="decode-head-192"),
        pytest.param(Batch(4, 1, 8, 1, 512, 8192), True, id="decode-head-512-page-16"),
        pytest.param(Batch(4, 4, 8, 2, 512, 8192), True, id="verify-head-512-page-16"),
        pytest.param(
            Batch(4, 4, 8, 2, 512, 8192, block_size=32), False, id="verify-head-512-page-32"
        ),
    ],
)
def test_tensor_descriptor_entry_only_where_they_read_the_cache(
    batch: Batch, tensor_descriptors: bool
) -> None:
    """Heads 256 and 512: the TUNED_TMA_OPTIONS entry where tensor descriptors read one page
    per tile; elsewhere (other pages, a head padded to 256) the pointer loads' entry, not a
    refusal."""
    plan = _plan(batch, RecordingProbe(THREE_PER_SM))
    assert plan is not None
    several_tokens = batch.query_len > 1
    group_size = batch.num_heads_q // batch.num_kv_heads
    assert plan.config.tma_kv is tensor_descriptors
    assert plan.attention.constexprs["TMA_KV"] is tensor_descriptors
    if tensor_descriptors:
        general = TUNED_TMA_OPTIONS[(batch.head_size, several_tokens, None)]
        entry = TUNED_TMA_OPTIONS.get((batch.head_size, several_tokens, group_size), general)
        assert {name: getattr(plan.config, name) for name in entry} == entry
        # Only the e4b draft's shape (head 256, one token, 2 heads per KV head) is capped.
        capped = (batch.head_size, several_tokens, group_size) == (256, False, 2)
        assert plan.config.max_registers == (168 if capped else None)
        assert ("maxnreg" in plan.attention.options) is capped
    else:
        assert plan.config.tile_size > 16
        pointer_entry = tuned_options(
            dot_head_size(batch.head_size), several_tokens, group_size, tma_page_size=None
        )
        assert all(getattr(plan.config, name) == value for name, value in pointer_entry.items())


TMA_CONFIG = LaunchConfig(block_m=16, tile_size=16, num_warps=4, num_stages=2, tma_kv=True)


@pytest.mark.parametrize(
    ("batch", "config", "message"),
    [
        pytest.param(Batch(4, 1, 8, 2, 96, 512), TMA_CONFIG, "power-of-two head", id="head-96"),
        pytest.param(
            Batch(4, 1, 8, 2, 128, 512, block_size=32), TMA_CONFIG, "tile_size 16", id="tile"
        ),
    ],
)
def test_tensor_descriptor_loads_refuse_what_they_cannot_read(
    batch: Batch, config: LaunchConfig, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _plan(batch, RecordingProbe(THREE_PER_SM), path="2d", config=config)
    plan = _plan(replace(batch, head_size=128, block_size=16), RecordingProbe(1), config=config)
    assert plan is not None and plan.attention.constexprs["TMA_KV"] is True


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 255, 256, 257, 4097])
def test_next_power_of_2_agrees_with_triton(n: int) -> None:
    assert next_power_of_2(n) == triton.next_power_of_2(n)
