"""The launch plan of Triton unified attention: every decision of a call, made without a device.

``plan_launch`` checks the inputs, picks the 2D or split-KV (3D) path, the launch parameters
(``LaunchConfig``), the grids, the kernels' compile-time constants and what the split-KV
scratch must cover, and returns them as a frozen ``LaunchPlan``;
``attngroup.kernels.ops.triton_unified_attention.launch`` only turns a plan into kernel calls. Planning
reads tensor shapes, dtypes, strides and devices, never their data, and compiles nothing: the
one device-dependent input, how many programs fill a wave, comes from an injected
``wave_slots`` probe (``attngroup.kernels.ops.triton_occupancy.measure_wave_slots`` on a GPU, a number in
tests). ``ConstexprSignature`` reads a kernel's ``tl.constexpr`` parameters from its
signature, so a test holds the plan's constants to the kernels'.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Literal, Protocol

import torch

from attngroup.kernels.cache_layout import check_query_against_cache
from attngroup.kernels.metadata import cdiv
from attngroup.kernels.ops import COMPILER_OPTIONS
from attngroup.kernels.ops.split_kv_scratch import ScratchNeeds, SplitKVScratch, check_scratch
from attngroup.kernels.ops.triton_launch_config import (
    DEFAULT_NUM_SEGMENTS,
    INTERPRETED,
    MAX_3D_QUERY_LEN,
    LaunchConfig,
    LaunchKind,
    choose_launch_config,
    dot_head_size,
    next_power_of_2,
    select_path,
    split_kv_segments,
)

MERGE_NUM_WARPS = 4
_LOG2E = math.log2(math.e)


@dataclass(frozen=True, eq=False)
class AttentionTensors:
    """The tensors of one attention call. Planning reads their shapes, dtypes, strides and
    devices; only ``launch`` hands them to the kernels."""

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    output: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    scratch: SplitKVScratch | None = None


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel call: its grid, its ``tl.constexpr`` arguments by name (every one of the
    kernel's without a default; see ``ConstexprSignature``) and Triton's launch options
    (``COMPILER_OPTIONS``, ``num_warps``, ``num_stages``; ``maxnreg`` under a register cap)."""

    grid: tuple[int, ...]
    constexprs: Mapping[str, object]
    options: Mapping[str, int]


@dataclass(frozen=True)
class LaunchPlan:
    """Everything ``launch`` needs beyond the tensors: the path, the attention kernel's launch,
    the split-KV merge's (3D only), what the scratch must cover (3D only), and the kernel's
    runtime scalars."""

    path: LaunchKind
    config: LaunchConfig
    attention: KernelLaunch
    merge: KernelLaunch | None
    scratch_needs: ScratchNeeds | None
    num_seqs: int
    q_blocks_per_seq: int
    qk_scale: float
    soft_cap: float
    sliding_window: int

    @property
    def num_segments(self) -> int:
        """KV segments per (q-block, KV head) this launch runs: 1 on the 2D path."""
        return self.attention.grid[2]


WaveSlots = Callable[[LaunchPlan], int]
"""Programs of a plan's attention kernel that the device runs at once: the occupancy probe
(``attngroup.kernels.ops.triton_occupancy.measure_wave_slots`` on a GPU), injected so planning stays pure."""


@dataclass(frozen=True)
class _Call:
    """The host-side facts of one call that the plan is made from."""

    num_tokens: int
    num_heads_q: int
    num_kv_heads: int
    head_size: int
    block_size: int
    num_seqs: int
    max_query_len: int
    max_seq_len: int
    scratch_segments: int
    dtype: torch.dtype
    device: torch.device
    sm_scale: float
    sliding_window: int | None
    logits_soft_cap: float | None
    cache_strides: tuple[tuple[int, ...], ...] = ()  # the key cache's, the value cache's

    @property
    def group_size(self) -> int:
        return self.num_heads_q // self.num_kv_heads


def plan_launch(
    tensors: AttentionTensors,
    *,
    max_query_len: int,
    max_seq_len: int,
    sm_scale: float,
    wave_slots: WaveSlots,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    path: Literal["auto", "2d", "3d"] = "auto",
    seq_threshold_3d: int | None = None,
    max_3d_query_len: int = MAX_3D_QUERY_LEN,
    config: LaunchConfig | None = None,
) -> LaunchPlan | None:
    """The launch of one ``unified_attention`` call, or None when the batch has no tokens.

    Raises ValueError on bad input and ScratchTooSmallError when the split-KV scratch does not
    cover the launch, before anything runs. With ``config=None``, or a config whose
    ``num_segments`` is None, a split-KV launch asks ``wave_slots`` once for the wave size of
    its attention kernel and fills whole waves.
    """
    _check_inputs(tensors)
    _check_scalars(sm_scale, sliding_window, logits_soft_cap)
    num_tokens, num_heads_q, head_size = tensors.query.shape
    num_seqs = tensors.seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return None
    if max_query_len < 1 or max_seq_len < max_query_len:
        raise ValueError(
            f"need 1 <= max_query_len <= max_seq_len; got {max_query_len} and {max_seq_len}"
        )
    scratch = tensors.scratch
    call = _Call(
        num_tokens=num_tokens,
        num_heads_q=num_heads_q,
        num_kv_heads=tensors.key_cache.shape[2],
        head_size=head_size,
        block_size=tensors.key_cache.shape[1],
        num_seqs=num_seqs,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        scratch_segments=scratch.num_segments if scratch is not None else DEFAULT_NUM_SEGMENTS,
        dtype=tensors.query.dtype,
        device=tensors.query.device,
        sm_scale=sm_scale,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        cache_strides=(tensors.key_cache.stride(), tensors.value_cache.stride()),
    )
    chosen = select_path(
        num_seqs=num_seqs,
        max_query_len=max_query_len,
        num_heads_q=num_heads_q,
        num_kv_heads=call.num_kv_heads,
        head_size=head_size,
        has_scratch=scratch is not None,
        path=path,
        seq_threshold_3d=seq_threshold_3d,
        max_3d_query_len=max_3d_query_len,
    )
    fill_waves = config is None or config.num_segments is None
    config = config or _heuristic_config(call, chosen)
    if config.num_segments is None:  # one segment until the wave probe has answered
        config = replace(config, num_segments=1)
    plan = _assemble(call, chosen, config)
    if chosen == "3d":
        assert scratch is not None  # select_path returns "3d" only with scratch
        if fill_waves:
            plan = _assemble(call, chosen, _fill_waves(call, plan, wave_slots(plan)))
        assert plan.scratch_needs is not None  # _assemble states them for every split-KV plan
        check_scratch(scratch, plan.scratch_needs)
    return plan


class JitKernel(Protocol):
    """What ``ConstexprSignature`` reads of a ``@triton.jit`` kernel (compiled or
    interpreted): the Python function it wraps."""

    fn: Callable[..., object]


@dataclass(frozen=True)
class ConstexprSignature:
    """The ``tl.constexpr`` parameters of a ``@triton.jit`` function, read from its signature
    (compiled or interpreted; annotations may be strings under postponed evaluation):
    ``required`` ones every launch passes, ``optional`` ones with a default."""

    required: frozenset[str]
    optional: frozenset[str]

    @classmethod
    def of(cls, kernel: JitKernel) -> ConstexprSignature:
        parameters = inspect.signature(kernel.fn).parameters.values()
        constexprs = [p for p in parameters if _is_constexpr(p.annotation)]
        return cls(
            required=frozenset(p.name for p in constexprs if p.default is p.empty),
            optional=frozenset(p.name for p in constexprs if p.default is not p.empty),
        )

    def mismatches(self, passed: Iterable[str]) -> list[str]:
        """What a launch passing ``passed`` as constexprs gets wrong: required ones it misses
        and names that are no constexpr of the kernel (Triton ignores those silently)."""
        passed = set(passed)
        missing = [f"missing {name}" for name in sorted(self.required - passed)]
        unknown = sorted(passed - self.required - self.optional)
        return missing + [f"not a constexpr of the kernel: {name}" for name in unknown]


def _is_constexpr(annotation: object) -> bool:
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return name.rsplit(".", 1)[-1] == "constexpr"


def _heuristic_config(call: _Call, path: LaunchKind) -> LaunchConfig:
    tma_readable = _tma_refusal(call, call.block_size) is None
    return choose_launch_config(
        num_heads_q=call.num_heads_q,
        num_kv_heads=call.num_kv_heads,
        head_size=call.head_size,
        num_seqs=call.num_seqs,
        max_query_len=call.max_query_len,
        max_seq_len=call.max_seq_len,
        path=path,
        max_segments=call.scratch_segments,
        tma_page_size=call.block_size if tma_readable else None,
    )


def _fill_waves(call: _Call, plan: LaunchPlan, wave_slots: int) -> LaunchConfig:
    """The plan's config with the segment count that fills whole waves of ``wave_slots``."""
    segments = split_kv_segments(
        kv_programs=plan.attention.grid[0] * call.num_kv_heads,
        num_tiles=cdiv(call.max_seq_len, plan.config.tile_size),
        wave_slots=wave_slots,
        max_segments=call.scratch_segments,
    )
    return replace(plan.config, num_segments=segments)


def _assemble(call: _Call, path: LaunchKind, config: LaunchConfig) -> LaunchPlan:
    if config.block_m < call.group_size:
        raise ValueError(f"block_m {config.block_m} is below the group size {call.group_size}")
    value_width = dot_head_size(call.head_size) // config.value_splits
    if value_width < 16:
        raise ValueError(
            f"value_splits {config.value_splits} leaves {value_width} columns of the "
            f"{dot_head_size(call.head_size)}-wide head per program; tl.dot needs >= 16"
        )
    if config.tma_kv and (refusal := _tma_refusal(call, config.tile_size)) is not None:
        raise ValueError(refusal)
    split_kv = path == "3d"
    block_q = config.block_q(call.group_size)
    q_blocks_per_seq = cdiv(call.max_query_len, block_q)
    # Split-KV grids are exact; the 2D one is vLLM's host-side bound (surplus programs exit).
    if split_kv:
        grid_q_blocks = call.num_seqs * q_blocks_per_seq
    else:
        grid_q_blocks = call.num_tokens // block_q + call.num_seqs
    num_segments = config.num_segments if split_kv else 1
    assert num_segments is not None  # plan_launch resolves the segment count before assembling
    attention = KernelLaunch(
        # A q-block's value parts are neighbours on axis 0, so their K reads meet in L2.
        grid=(grid_q_blocks * config.value_splits, call.num_kv_heads, num_segments),
        constexprs=_attention_constexprs(call, config, split_kv),
        options=MappingProxyType(_attention_options(config)),
    )
    needs = None
    if split_kv:
        needs = ScratchNeeds(
            rows=call.num_tokens,
            num_heads_q=call.num_heads_q,
            num_segments=num_segments,
            head_size_padded=next_power_of_2(call.head_size),
            device=call.device,
        )
    return LaunchPlan(
        path=path,
        config=config,
        attention=attention,
        merge=_merge_launch(call, config) if split_kv else None,
        scratch_needs=needs,
        num_seqs=call.num_seqs,
        q_blocks_per_seq=q_blocks_per_seq,
        # Scores run in base-2 log units unless the soft cap needs natural units first.
        qk_scale=call.sm_scale if call.logits_soft_cap is not None else call.sm_scale * _LOG2E,
        soft_cap=call.logits_soft_cap or 0.0,
        sliding_window=call.sliding_window or 0,
    )


def _attention_constexprs(
    call: _Call, config: LaunchConfig, split_kv: bool
) -> Mapping[str, object]:
    return MappingProxyType(
        {
            "NUM_HEADS_Q": call.num_heads_q,
            "GROUP_SIZE": call.group_size,
            "HEAD_SIZE": call.head_size,
            "HEAD_SIZE_PADDED": dot_head_size(call.head_size),
            "SCRATCH_ROW": next_power_of_2(call.head_size),
            "BLOCK_SIZE": call.block_size,
            "TILE_SIZE": config.tile_size,
            "BLOCK_M": config.block_m,
            "BLOCK_Q": config.block_q(call.group_size),
            "SCRATCH_SEGMENTS": call.scratch_segments if split_kv else 1,
            "USE_SOFTCAP": call.logits_soft_cap is not None,
            "USE_SLIDING_WINDOW": call.sliding_window is not None,
            "SPLIT_KV": split_kv,
            "DOT_IN_FP32": INTERPRETED,
            "DOT_PRECISION": "ieee" if call.dtype == torch.float32 else "tf32",
            "VALUE_SPLITS": config.value_splits,
            "PREFETCH_BLOCK_TABLE": config.prefetch_block_table,
            "TMA_KV": config.tma_kv,
        }
    )


def _attention_options(config: LaunchConfig) -> dict[str, int]:
    """Triton's launch options of the attention kernel (``maxnreg`` only where capped)."""
    options = {**COMPILER_OPTIONS, "num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.max_registers is not None:
        options["maxnreg"] = config.max_registers
    return options


def _tma_refusal(call: _Call, tile_size: int) -> str | None:
    """Why tensor-descriptor loads of K and V cannot read this call's caches in tiles of
    ``tile_size`` keys, or None. They need one page per tile; a power-of-two head size with
    the heads of a slot side by side (the descriptor sees a slot's heads as one row, a head as
    a box of it); strides of multiples of 16 bytes (the descriptor's rule)."""
    if call.head_size != dot_head_size(call.head_size):
        return f"tma_kv needs a power-of-two head size >= 16; got {call.head_size}"
    if any(strides[2] != call.head_size for strides in call.cache_strides):
        return f"tma_kv needs the heads of a cache slot side by side; strides {call.cache_strides}"
    if tile_size != call.block_size:
        return (
            f"tma_kv loads one page per tile: tile_size {tile_size} must equal the "
            f"cache's block size {call.block_size}"
        )
    if any(
        stride * call.dtype.itemsize % 16
        for strides in call.cache_strides
        for stride in strides[:-1]
    ):
        return f"tma_kv needs cache strides of multiples of 16 bytes; got {call.cache_strides}"
    return None


def _merge_launch(call: _Call, config: LaunchConfig) -> KernelLaunch:
    """The split-KV merge: one program per (token, ``merge_heads_per_program`` query heads)."""
    heads = config.merge_heads_per_program
    return KernelLaunch(
        grid=(call.num_tokens, cdiv(call.num_heads_q, heads)),
        constexprs=MappingProxyType(
            {
                "NUM_HEADS_Q": call.num_heads_q,
                "HEADS_PER_PROGRAM": heads,
                "SCRATCH_SEGMENTS": call.scratch_segments,
                "SEGMENTS_PADDED": next_power_of_2(call.scratch_segments),
                "HEAD_SIZE": call.head_size,
                "HEAD_SIZE_PADDED": next_power_of_2(call.head_size),
            }
        ),
        options=MappingProxyType({**COMPILER_OPTIONS, "num_warps": MERGE_NUM_WARPS}),
    )


def _check_scalars(
    sm_scale: float, sliding_window: int | None, logits_soft_cap: float | None
) -> None:
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None; got {sliding_window}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be > 0 or None; got {logits_soft_cap}")
    if not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be finite; got {sm_scale}")


def _check_inputs(tensors: AttentionTensors) -> None:
    """Shape, dtype and layout checks that need no device sync."""
    query, key_cache, value_cache, output = (
        tensors.query,
        tensors.key_cache,
        tensors.value_cache,
        tensors.output,
    )
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
    _check_batch_indices(tensors.query_start_loc, tensors.seq_lens, tensors.block_table)


def _check_batch_indices(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor
) -> None:
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
