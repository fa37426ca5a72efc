"""Triton unified attention (2D and split-KV 3D) against the float64 oracle.

The small matrix (fp32 and fp16, small batches; on the CPU under the Triton interpreter, or
on the suite's device when that is a GPU) is a covering design: the Gemma 4 MTP shapes (8,1),
(4,1), (8,2), (4,2) x head sizes 256 and 512 fully, crossed with decode, verify and chunked
prefill; the other head layouts with head sizes 64 and 128 over every batch kind; block size,
sliding window, soft cap and dtype rotate so that each kind meets every value. The GPU matrix
runs every head layout x head size x dtype (bf16 included) at larger batch sizes. Outputs
start as NaN and must come back fully written; the caches hold NaN wherever no query may
look. The builder never clears its split-KV scratch, so one test starts it NaN-poisoned or
holding an earlier pass's partial results, and the output must not depend on either.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import product

import pytest
import torch

from attngroup.kernels.ops.split_kv_scratch import SplitKVScratch
from attngroup.kernels.ops.triton_launch_config import (
    DEFAULT_NUM_SEGMENTS,
    LaunchConfig,
    LaunchKind,
    choose_launch_config,
)
from attngroup.kernels.ops.triton_unified_attention import unified_attention
from attngroup.suites.kernels.batches import (
    BATCHES_CPU,
    BATCHES_GPU,
    SPLIT_KV_KINDS,
    BatchSpec,
    PagedBatch,
    assert_within_bound,
    gpu_only,
    make_paged_batch,
)

pytestmark = pytest.mark.kernels

GEMMA4_HEADS = ((8, 1), (4, 1), (8, 2), (4, 2))
OTHER_HEADS = ((32, 8), (16, 4), (6, 2))
BLOCK_SIZES = (16, 32, 64)
WINDOWS = (None, 24, 5)
SOFT_CAP = 10.0
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Case:
    """One kernel launch compared with the oracle."""

    on_gpu: bool
    num_heads_q: int
    num_kv_heads: int
    head_size: int
    block_size: int
    kind: str
    dtype: torch.dtype
    path: LaunchKind
    sliding_window: int | None = None
    soft_cap: float | None = None

    def __str__(self) -> str:
        parts = [f"hq{self.num_heads_q}-hkv{self.num_kv_heads}-d{self.head_size}"]
        parts.append(f"bs{self.block_size}-{self.kind}")
        if self.sliding_window is not None:
            parts.append(f"swa{self.sliding_window}")
        if self.soft_cap is not None:
            parts.append(f"cap{self.soft_cap:g}")
        parts.append(f"{DTYPE_NAMES[self.dtype]}-{self.path}")
        return ("gpu-" if self.on_gpu else "") + "-".join(parts)

    @property
    def sm_scale(self) -> float:
        """Gemma's 1.0 with a soft cap (so the cap bites), else 1/sqrt(head_size)."""
        return 1.0 if self.soft_cap is not None else self.head_size**-0.5

    def batch(self, suite_device: torch.device) -> PagedBatch:
        """The case's batch: GPU-sized ones on CUDA, small ones on the suite's device."""
        batches = BATCHES_GPU if self.on_gpu else BATCHES_CPU
        return make_paged_batch(
            batches[self.kind],
            num_heads_q=self.num_heads_q,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            block_size=self.block_size,
            dtype=self.dtype,
            device="cuda" if self.on_gpu else suite_device,
            seed=zlib.crc32(str(self).encode()),
            sliding_window=self.sliding_window,
        )


def _rotated_cases(
    on_gpu: bool, combos: list[tuple[tuple[int, int], int, str, torch.dtype]]
) -> list[Case]:
    """Cases for (heads, head size, kind, dtype) combos; split-KV kinds run both paths.

    Window, block size and soft cap rotate with the count ``turn`` of the combo's batch kind
    so far: window ``turn % 3`` and block size ``(turn + turn // 3) % 3`` form a Latin square
    over 9 turns, the cap flips every 3, so each kind meets every value and pair."""
    cases: list[Case] = []
    seen_kind: Counter[str] = Counter()
    for (num_heads_q, num_kv_heads), head_size, kind, dtype in combos:
        turn = seen_kind[kind]
        seen_kind[kind] += 1
        paths: tuple[LaunchKind, ...] = ("2d", "3d") if kind in SPLIT_KV_KINDS else ("2d",)
        cases.extend(
            Case(
                on_gpu=on_gpu,
                num_heads_q=num_heads_q,
                num_kv_heads=num_kv_heads,
                head_size=head_size,
                block_size=BLOCK_SIZES[(turn + turn // 3) % 3],
                kind=kind,
                dtype=dtype,
                path=path,
                sliding_window=WINDOWS[turn % len(WINDOWS)],
                soft_cap=SOFT_CAP if (turn // 3) % 2 else None,
            )
            for path in paths
        )
    return cases


def _cpu_cases() -> list[Case]:
    dtypes = (torch.float32, torch.float16)
    combos = [
        (heads, head_size, kind, dtypes[index % 2])
        for index, (heads, head_size, kind) in enumerate(
            product(GEMMA4_HEADS, (256, 512), ("decode", "verify", "chunked"))
        )
    ]
    combos += [
        (heads, head_size, kind, dtypes[index % 2])
        for index, (heads, head_size, kind) in enumerate(
            product(OTHER_HEADS, (64, 128), ("decode", "prefill", "chunked", "verify", "verify9"))
        )
    ]
    # Head sizes that are not powers of two (padded dims) or below tl.dot's minimum of 16.
    combos += [((8, 1), 96, "prefill", torch.float32), ((4, 2), 8, "verify", torch.float16)]
    return _rotated_cases(False, combos)


def _gpu_cases() -> list[Case]:
    kinds = tuple(BATCHES_GPU)
    combos = [
        (heads, head_size, kinds[index % len(kinds)], dtype)
        for index, (heads, head_size) in enumerate(
            product(GEMMA4_HEADS + OTHER_HEADS, (64, 128, 256, 512))
        )
        for dtype in (torch.bfloat16, torch.float16, torch.float32)
    ]
    return _rotated_cases(True, combos)


def _param(case: Case):
    marks = [pytest.mark.gpu, gpu_only] if case.on_gpu else []
    return pytest.param(case, id=str(case), marks=marks)


def _reference(batch: PagedBatch, case: Case) -> torch.Tensor:
    expected = batch.oracle(
        sm_scale=case.sm_scale, sliding_window=case.sliding_window, logits_soft_cap=case.soft_cap
    )
    assert expected.isfinite().all(), "the oracle itself read a poisoned slot"
    return expected


def _allocate_scratch(batch: PagedBatch, case: Case) -> SplitKVScratch:
    """Split-KV scratch for ``batch``'s tokens at the case's heads, as a builder sizes it."""
    return SplitKVScratch.allocate(
        batch.spec.num_tokens,
        case.num_heads_q,
        DEFAULT_NUM_SEGMENTS,
        case.head_size,
        batch.query.device,
    )


def _run(
    batch: PagedBatch,
    case: Case,
    path: LaunchKind,
    config: LaunchConfig | None = None,
    scratch: SplitKVScratch | None = None,
) -> torch.Tensor:
    """The kernel's output for ``batch``, after checking every element was written; 3D runs
    on ``scratch`` when given, else on freshly allocated scratch."""
    spec = batch.spec
    output = torch.full_like(batch.query, float("nan"))
    if path == "3d" and scratch is None:
        scratch = _allocate_scratch(batch, case)
    unified_attention(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        output,
        **batch.metadata(),
        max_query_len=spec.max_query_len,
        max_seq_len=spec.max_seq_len,
        sm_scale=case.sm_scale,
        sliding_window=case.sliding_window,
        logits_soft_cap=case.soft_cap,
        scratch=scratch,
        path=path,
        config=config,
    )
    unwritten = int(output.isnan().sum())
    assert unwritten == 0, f"{unwritten} output elements are NaN (unwritten or poisoned reads)"
    return output


@pytest.mark.parametrize("case", [_param(c) for c in _cpu_cases() + _gpu_cases()])
def test_unified_attention_matches_oracle(case: Case, device: torch.device) -> None:
    batch = case.batch(device)
    output = _run(batch, case, case.path)
    assert_within_bound(output, _reference(batch, case), case.dtype)


def _split_kv_param(
    on_gpu: bool,
    heads: tuple[int, int],
    head_size: int,
    kind: str,
    dtype: torch.dtype,
    window: int | None,
    num_segments: int,
):
    case = Case(on_gpu, *heads, head_size, 16, kind, dtype, "3d", sliding_window=window)
    marks = [pytest.mark.gpu, gpu_only] if on_gpu else []
    return pytest.param(case, num_segments, id=f"{case}-seg{num_segments}", marks=marks)


SPLIT_KV_CASES = [
    _split_kv_param(False, (8, 1), 256, "decode", torch.float32, None, 16),
    _split_kv_param(False, (4, 1), 512, "verify", torch.float32, None, 3),
    _split_kv_param(False, (8, 2), 256, "verify", torch.float16, 24, 1),
    _split_kv_param(False, (32, 8), 64, "decode", torch.float32, 5, 4),
    _split_kv_param(False, (6, 2), 128, "verify", torch.float32, None, 7),
    _split_kv_param(True, (8, 1), 512, "decode64", torch.bfloat16, None, 16),
    _split_kv_param(True, (4, 2), 256, "verify", torch.bfloat16, 512, 5),
    _split_kv_param(True, (32, 8), 128, "decode", torch.float32, None, 16),
]


def _heuristic(case: Case, batch: PagedBatch, path: LaunchKind) -> LaunchConfig:
    """The launcher's heuristic launch configuration for this case's batch on ``path``."""
    return choose_launch_config(
        num_heads_q=case.num_heads_q,
        num_kv_heads=case.num_kv_heads,
        head_size=case.head_size,
        num_seqs=batch.spec.num_reqs,
        max_query_len=batch.spec.max_query_len,
        max_seq_len=batch.spec.max_seq_len,
        path=path,
    )


@pytest.mark.parametrize(("case", "num_segments"), SPLIT_KV_CASES)
def test_split_kv_matches_2d(case: Case, num_segments: int, device: torch.device) -> None:
    """3D with a forced segment count (16-key tiles, so segments split real work, and with
    16 segments some are empty) equals 2D with the same tiles."""
    batch = case.batch(device)
    heuristic = _heuristic(case, batch, "3d")
    output_2d = _run(batch, case, "2d", replace(heuristic, tile_size=16))
    output_3d = _run(batch, case, "3d", replace(heuristic, tile_size=16, num_segments=num_segments))
    assert_within_bound(output_3d, output_2d, case.dtype, "3D vs 2D relative error")


SPLIT_KV_TILE = 16
"""Keys per tile of the scratch-state tests: each segment of the earlier pass holds one tile."""


def _poison_with_nan(scratch: SplitKVScratch, case: Case, config: LaunchConfig) -> None:
    """What uninitialised memory may hold: NaN in every slot."""
    for tensor in (scratch.segm_output, scratch.segm_max, scratch.segm_expsum):
        tensor.fill_(float("nan"))


def _leave_an_earlier_pass(scratch: SplitKVScratch, case: Case, config: LaunchConfig) -> None:
    """What an earlier pass (another layer, the previous step) leaves: finite partial
    results in every segment of every row, from full attention (no window to empty a
    segment) over requests of one tile per segment."""
    assert config.num_segments is not None, "the scratch-state tests force the segment count"
    earlier = make_paged_batch(
        BatchSpec.decode(*(config.num_segments * SPLIT_KV_TILE,) * scratch.rows),
        num_heads_q=case.num_heads_q,
        num_kv_heads=case.num_kv_heads,
        head_size=case.head_size,
        block_size=case.block_size,
        dtype=case.dtype,
        device=scratch.segm_output.device,
        seed=zlib.crc32(f"{case}-earlier-pass".encode()),
    )
    _run(earlier, replace(case, sliding_window=None), "3d", config, scratch)
    assert scratch.segm_max[:, :, : config.num_segments].isfinite().all()


ScratchState = Callable[[SplitKVScratch, Case, LaunchConfig], None]
SCRATCH_STATES: dict[str, ScratchState] = {
    "nan-poisoned": _poison_with_nan,
    "stale-from-earlier-pass": _leave_an_earlier_pass,
}


SCRATCH_STATE_CASES = [
    pytest.param(*param.values, state, id=f"{param.id}-{state}", marks=param.marks)
    for param in SPLIT_KV_CASES
    for state in SCRATCH_STATES
]


@pytest.mark.parametrize(("case", "num_segments", "state"), SCRATCH_STATE_CASES)
def test_split_kv_ignores_what_the_scratch_held(
    case: Case, num_segments: int, state: str, device: torch.device
) -> None:
    """The builder's scratch is never cleared between passes, so every segment of every row
    must be written, an empty one (a short request beside a long one, a sliding window) as
    max -inf and sum 0, or the merge reads what an earlier pass left (TensorRT-LLM #18755:
    FlashInfer's split-KV scratch not reset per pass)."""
    batch = case.batch(device)
    config = replace(
        _heuristic(case, batch, "3d"), tile_size=SPLIT_KV_TILE, num_segments=num_segments
    )
    scratch = _allocate_scratch(batch, case)
    SCRATCH_STATES[state](scratch, case, config)
    output = _run(batch, case, "3d", config, scratch)
    assert_within_bound(output, _reference(batch, case), case.dtype)


def _variant_param(
    on_gpu: bool,
    heads: tuple[int, int],
    head_size: int,
    kind: str,
    dtype: torch.dtype,
    path: LaunchKind,
    window: int | None,
    variant: dict,
):
    case = Case(on_gpu, *heads, head_size, 16, kind, dtype, path, sliding_window=window)
    marks = [pytest.mark.gpu, gpu_only] if on_gpu else []
    name = "-".join(f"{key}{int(value)}" for key, value in variant.items())
    return pytest.param(case, variant, id=f"{case}-{name}", marks=marks)


VALUE_SPLIT = {"value_splits": 2}
PREFETCH = {"prefetch_block_table": True, "tile_size": 16}
TMA = {"tma_kv": True, "tile_size": 16}
REGISTER_CAP = {"max_registers": 128}
LAUNCH_VARIANT_CASES = [
    _variant_param(False, (8, 1), 512, "verify", torch.float32, "3d", None, VALUE_SPLIT),
    _variant_param(False, (4, 2), 512, "decode", torch.float16, "3d", 5, {"value_splits": 4}),
    _variant_param(False, (8, 1), 256, "chunked", torch.float32, "2d", 24, VALUE_SPLIT),
    _variant_param(False, (8, 2), 256, "verify", torch.float32, "3d", 24, PREFETCH),
    _variant_param(False, (6, 2), 128, "chunked", torch.float16, "2d", None, PREFETCH),
    _variant_param(False, (4, 1), 96, "verify", torch.float32, "3d", None, PREFETCH | VALUE_SPLIT),
    _variant_param(False, (8, 1), 512, "verify", torch.float32, "3d", 24, TMA),
    _variant_param(False, (4, 2), 256, "decode", torch.float16, "3d", None, TMA),
    _variant_param(False, (8, 1), 256, "chunked", torch.float32, "2d", 5, TMA),
    _variant_param(False, (8, 2), 256, "verify", torch.float32, "2d", None, TMA | PREFETCH),
    _variant_param(False, (4, 1), 128, "decode", torch.float16, "3d", None, TMA | PREFETCH),
    _variant_param(False, (6, 2), 128, "verify", torch.float32, "3d", None, TMA | VALUE_SPLIT),
    _variant_param(False, (4, 2), 256, "decode", torch.float16, "3d", None, TMA | REGISTER_CAP),
    _variant_param(True, (8, 1), 512, "decode64", torch.bfloat16, "3d", None, VALUE_SPLIT),
    _variant_param(True, (8, 1), 512, "verify", torch.bfloat16, "3d", None, TMA),
    _variant_param(True, (4, 2), 512, "decode64", torch.bfloat16, "3d", 512, TMA),
    _variant_param(True, (8, 1), 256, "verify", torch.bfloat16, "3d", 24, TMA),
    _variant_param(True, (8, 1), 256, "verify", torch.bfloat16, "3d", None, TMA | PREFETCH),
    _variant_param(True, (8, 2), 256, "decode64", torch.bfloat16, "3d", None, TMA),
    _variant_param(
        True, (4, 2), 256, "decode64", torch.bfloat16, "3d", None, TMA | PREFETCH | REGISTER_CAP
    ),
    _variant_param(True, (32, 8), 128, "prefill", torch.bfloat16, "2d", 24, TMA),
    _variant_param(True, (4, 2), 512, "verify", torch.bfloat16, "3d", 512, {"value_splits": 4}),
    _variant_param(True, (8, 1), 256, "verify", torch.float32, "3d", None, PREFETCH | VALUE_SPLIT),
    _variant_param(True, (32, 8), 128, "prefill", torch.float16, "2d", 24, PREFETCH),
]


@pytest.mark.parametrize(("case", "variant"), LAUNCH_VARIANT_CASES)
def test_launch_variants_match_oracle(case: Case, variant: dict, device: torch.device) -> None:
    """The value split (programs owning a slice of V's columns), the block-table prefetch, the
    tensor-descriptor loads of K and V and a register cap (spills) compute the same attention
    as the oracle, segments fitted to waves as the launcher does."""
    batch = case.batch(device)
    heuristic = _heuristic(case, batch, case.path)
    config = replace(heuristic, num_segments=None, **variant)
    output = _run(batch, case, case.path, config)
    assert_within_bound(output, _reference(batch, case), case.dtype)
