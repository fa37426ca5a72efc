"""vLLM's own Triton unified attention as a benchmark peer ("vllm-triton"), never an engine backend.

The kernel is not part of this repository: ``scripts/fetch_vllm_triton_kernel.sh``
extracts vLLM 0.34.0's ``triton_unified_attention.py`` and its
``triton_attention_helpers.py`` from the released wheel into an ignored folder
(``$VLLM_TRITON_KERNEL_DIR``, default ``.vllm-triton`` in the repository root).
Those two files import a few small pieces of vLLM (its environment flags,
logger, platform object, ``triton_utils`` and the ``KVQuantMode`` enum); they
are loaded here behind stand-ins for exactly those names, installed in
``sys.modules`` only while the files import, so no vLLM install is needed and
none is shadowed.

The builder sizes the split-KV scratch the way vLLM's ``TritonAttentionMetadataBuilder``
does on an H200 without CUDA graphs: ``seq_threshold_3D = 128 // num_kv_heads``,
16 softmax segments, rows for ``min(seq_threshold_3D, max_num_seqs)`` requests of
``min(max_query_len, 8)`` tokens (a speculative verify of k drafts has k + 1).
The backend is deliberately absent from ``attngroup.kernels.registry``: users cannot pick
it for the engine; the benchmarks and the kernel suite name it directly.
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

from attngroup.kernels.backend import AttentionBackend, AttentionImpl, AttentionMetadataBuilder
from attngroup.kernels.backends.common import check_launch_shapes, describe_builder
from attngroup.kernels.metadata import CommonAttentionMetadata

VLLM_VERSION = "0.34.0"
KERNEL_DIR_VARIABLE = "VLLM_TRITON_KERNEL_DIR"
KERNEL_FILE = "triton_unified_attention.py"
HELPERS_FILE = "triton_attention_helpers.py"
OPS_PACKAGE = "vllm.v1.attention.ops"
MIN_LAUNCH_GRID_SIZE_2D = 128  # vllm/v1/attention/backends/triton_attn.py
NUM_PAR_SOFTMAX_SEGMENTS = 16  # same file; 64 only on SM120
MAX_3D_QUERY_LEN = 8  # triton_unified_attention.py: longer queries always run 2D


class VllmKernelMissingError(RuntimeError):
    """The fetched kernel is not there (run scripts/fetch_vllm_triton_kernel.sh)."""


def kernel_dir() -> Path:
    """Where scripts/fetch_vllm_triton_kernel.sh put the kernel: ``.vllm-triton`` in the
    repository root (attngroup/benchmarks/ is two levels below it) unless the variable says."""
    default = Path(__file__).resolve().parents[2] / ".vllm-triton"
    return Path(os.environ.get(KERNEL_DIR_VARIABLE, default))


def missing_reason() -> str | None:
    """Why the fetched kernel cannot be loaded, or None when its files are there."""
    folder = kernel_dir()
    absent = [name for name in (KERNEL_FILE, HELPERS_FILE) if not (folder / name).is_file()]
    if absent:
        return (
            f"vLLM {VLLM_VERSION}'s Triton kernel is not fetched ({', '.join(absent)} missing in "
            f"{folder}): run scripts/fetch_vllm_triton_kernel.sh on a machine with network"
        )
    return None


class KVQuantMode(enum.IntEnum):
    """vllm.v1.kv_cache_interface.KVQuantMode, the members the kernel compares against."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


class _Platform:
    """The few ``vllm.platforms.current_platform`` queries the kernel makes, on CUDA or CPU."""

    @staticmethod
    def is_rocm() -> bool:
        return torch.version.hip is not None

    @staticmethod
    def is_cuda() -> bool:
        return torch.cuda.is_available() and torch.version.hip is None

    @staticmethod
    def fp8_dtype() -> torch.dtype:
        return torch.float8_e4m3fn

    @classmethod
    def is_device_capability_family(cls, family: int) -> bool:
        if not cls.is_cuda():
            return False
        major, _ = torch.cuda.get_device_capability()
        return major * 10 == family


class _Logger(logging.LoggerAdapter):
    def debug_once(self, message: str, *args: Any) -> None:
        self.debug(message, *args)


def _stand_ins() -> dict[str, types.ModuleType]:
    """Modules named as vLLM's, holding only what the two kernel files import."""
    import triton
    import triton.language as tl

    modules = {}
    for name in ("vllm", "vllm.v1", "vllm.v1.attention", OPS_PACKAGE):
        package = types.ModuleType(name)
        package.__path__ = []  # a package, so that submodule imports resolve through sys.modules
        modules[name] = package
    stand_ins = [
        _module("vllm.envs", VLLM_BATCH_INVARIANT=False),
        _module("vllm.logger", init_logger=lambda name: _Logger(logging.getLogger(name), {})),
        _module("vllm.platforms", current_platform=_Platform()),
        _module("vllm.triton_utils", tl=tl, triton=triton),
        _module("vllm.v1.kv_cache_interface", KVQuantMode=KVQuantMode),
    ]
    modules.update((module.__name__, module) for module in stand_ins)
    return modules


def _module(name: str, **attributes: object) -> types.ModuleType:
    """A module holding ``attributes``, set through its namespace: a bare ``ModuleType``
    declares none of these names, so assigning them as attributes does not type-check."""
    module = types.ModuleType(name)
    vars(module).update(attributes)
    return module


@contextmanager
def _vllm_names(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    """``modules`` in sys.modules for the duration, whatever stood there restored after."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _load(name: str, path: Path, modules: dict[str, types.ModuleType]) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    modules[name] = module
    with _vllm_names(modules):
        spec.loader.exec_module(module)
    return module


@cache
def vllm_unified_attention() -> Any:
    """vLLM's ``unified_attention`` function from the fetched files (loaded once)."""
    reason = missing_reason()
    if reason is not None:
        raise VllmKernelMissingError(reason)
    folder = kernel_dir()
    modules = _stand_ins()
    _load(f"{OPS_PACKAGE}.triton_attention_helpers", folder / HELPERS_FILE, modules)
    kernel = _load(f"{OPS_PACKAGE}.triton_unified_attention", folder / KERNEL_FILE, modules)
    return kernel.unified_attention


def split_kv_path(metadata: VllmTritonMetadata, num_heads_q: int, num_kv_heads: int) -> str:
    """ "3d" (split-KV) or "2d": the choice ``unified_attention`` makes for this batch on an
    H200 (the SM100-only large-head tuning and batch invariance left out, as they are off)."""
    common = metadata.common
    group = num_heads_q // num_kv_heads
    block_q = (16 if group <= 16 else 1 << (group - 1).bit_length()) // group
    q_blocks = common.num_reqs * -(-common.max_query_len // block_q)
    use_3d = (
        common.max_query_len <= MAX_3D_QUERY_LEN
        and q_blocks <= metadata.seq_threshold_3d
        and metadata.scratch.max.shape[0] >= common.num_actual_tokens
    )
    return "3d" if use_3d else "2d"


@dataclass(frozen=True)
class SoftmaxScratch:
    """vLLM's split-KV scratch: per query token, head and segment (float32)."""

    output: torch.Tensor  # [rows, num_heads_q, segments, head_size_padded]
    max: torch.Tensor  # [rows, num_heads_q, segments]
    expsum: torch.Tensor  # [rows, num_heads_q, segments]


@dataclass(frozen=True)
class VllmTritonMetadata:
    common: CommonAttentionMetadata
    seq_threshold_3d: int
    scratch: SoftmaxScratch


class VllmTritonMetadataBuilder(AttentionMetadataBuilder):
    """vLLM's TritonAttentionMetadataBuilder sizing (eager, not SM120)."""

    def __init__(self, kv_cache_spec, layers, device, **options: Any) -> None:
        super().__init__(kv_cache_spec, layers, device, **options)
        self.seq_threshold_3d = MIN_LAUNCH_GRID_SIZE_2D // self.num_heads_kv
        rows = min(self.seq_threshold_3d, self.max_num_seqs) * min(
            self.max_query_len, MAX_3D_QUERY_LEN
        )
        head_size_padded = 1 << (self.head_size - 1).bit_length()
        shape = (rows, self.num_heads_q, NUM_PAR_SOFTMAX_SEGMENTS)
        self.scratch = SoftmaxScratch(
            output=torch.empty(*shape, head_size_padded, dtype=torch.float32, device=self.device),
            max=torch.empty(shape, dtype=torch.float32, device=self.device),
            expsum=torch.empty(shape, dtype=torch.float32, device=self.device),
        )

    def build(self, common: CommonAttentionMetadata) -> VllmTritonMetadata:
        return VllmTritonMetadata(common, self.seq_threshold_3d, self.scratch)

    def describe(self) -> dict:
        return describe_builder(
            self,
            VllmTritonPeerBackend.name,
            seq_threshold_3d=self.seq_threshold_3d,
            scratch_rows=self.scratch.max.shape[0],
            segments=NUM_PAR_SOFTMAX_SEGMENTS,
        )


class VllmTritonImpl(AttentionImpl):
    """One layer through vLLM's ``unified_attention``, called as vLLM's TritonAttentionImpl does."""

    def forward(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: VllmTritonMetadata,
        output: torch.Tensor,
    ) -> torch.Tensor:
        common = metadata.common
        check_launch_shapes(query, key_cache, output, common, self.layer)
        layer = self.layer
        window = (-1, -1) if layer.sliding_window is None else (layer.sliding_window - 1, 0)
        num_tokens = common.num_actual_tokens
        if num_tokens:
            vllm_unified_attention()(
                q=query[:num_tokens],
                k=key_cache,
                v=value_cache,
                out=output[:num_tokens],
                cu_seqlens_q=common.query_start_loc,
                max_seqlen_q=common.max_query_len,
                seqused_k=common.seq_lens,
                max_seqlen_k=common.max_seq_len,
                softmax_scale=layer.sm_scale,
                causal=True,
                window_size=window,
                block_table=common.block_table,
                softcap=layer.logits_soft_cap or 0.0,
                q_descale=None,
                k_descale=None,
                v_descale=None,
                seq_threshold_3D=metadata.seq_threshold_3d,
                num_par_softmax_segments=NUM_PAR_SOFTMAX_SEGMENTS,
                softmax_segm_output=metadata.scratch.output,
                softmax_segm_max=metadata.scratch.max,
                softmax_segm_expsum=metadata.scratch.expsum,
            )
        return output


class VllmTritonPeerBackend(AttentionBackend):
    name = "vllm-triton"
    supported_head_sizes = (64, 128, 256, 512)
    supported_dtypes = (torch.float32, torch.float16, torch.bfloat16)
    supported_block_sizes = (16, 32, 64)

    @classmethod
    def get_builder_cls(cls) -> type[VllmTritonMetadataBuilder]:
        return VllmTritonMetadataBuilder

    @classmethod
    def get_impl_cls(cls) -> type[VllmTritonImpl]:
        return VllmTritonImpl

    @classmethod
    def is_available(cls, device: torch.device | str) -> bool:
        """Needs the fetched kernel files, and a CUDA device or Triton's interpreter."""
        if missing_reason() is not None:
            return False
        on_cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
        return on_cuda or os.environ.get("TRITON_INTERPRET") == "1"
