"""The Triton backend ("triton"): unified paged attention with a split-KV scratch per group.

The builder owns the one piece of head-sized state, the split-KV (3D) scratch
``[rows, num_heads_q, num_segments, next_pow2(head_size)]``, sized like vLLM
0.34's ``TritonAttentionMetadataBuilder``: ``rows = min(seq_threshold_3d,
max_num_seqs) * min(max_query_len, 8)`` with ``seq_threshold_3d = 128 //
num_kv_heads`` and 16 segments. A query longer than ``min(max_query_len, 8)`` (a
short prefill chunk) runs 2D, so the rows hold every split-KV launch. The kernel
launcher refuses a scratch whose head count or rows do not fit the launch
(``ScratchTooSmallError``), so a builder shared by layers of different head counts
fails loudly on the 3D path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from attngroup.kernels.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionLayerParams,
    AttentionMetadataBuilder,
    KVCacheGeometry,
)
from attngroup.kernels.backends.common import check_launch_shapes, describe_builder
from attngroup.kernels.metadata import CommonAttentionMetadata
from attngroup.kernels.ops.split_kv_scratch import SplitKVScratch
from attngroup.kernels.ops.triton_launch_config import (
    DEFAULT_NUM_SEGMENTS,
    MAX_3D_QUERY_LEN,
    MIN_LAUNCH_GRID_SIZE_2D,
)
from attngroup.kernels.ops.triton_unified_attention import unified_attention


@dataclass(frozen=True)
class TritonAttentionMetadata:
    common: CommonAttentionMetadata
    scratch: SplitKVScratch
    seq_threshold_3d: int
    max_3d_query_len: int  # the longest query the scratch rows hold; longer ones run 2D


class TritonAttentionMetadataBuilder(AttentionMetadataBuilder):
    def __init__(
        self,
        kv_cache_spec: KVCacheGeometry,
        layers: Sequence[AttentionLayerParams],
        device: torch.device,
        **options: Any,
    ) -> None:
        super().__init__(kv_cache_spec, layers, device, **options)
        self.seq_threshold_3d = max(1, MIN_LAUNCH_GRID_SIZE_2D // self.num_heads_kv)
        self.max_3d_query_len = min(self.max_query_len, MAX_3D_QUERY_LEN)
        rows = min(self.seq_threshold_3d, self.max_num_seqs) * self.max_3d_query_len
        self.scratch = SplitKVScratch.allocate(
            rows, self.num_heads_q, DEFAULT_NUM_SEGMENTS, self.head_size, self.device
        )

    def build(self, common: CommonAttentionMetadata) -> TritonAttentionMetadata:
        return TritonAttentionMetadata(
            common=common,
            scratch=self.scratch,
            seq_threshold_3d=self.seq_threshold_3d,
            max_3d_query_len=self.max_3d_query_len,
        )

    def describe(self) -> dict:
        scratch = self.scratch
        return describe_builder(
            self,
            TritonAttentionBackend.name,
            seq_threshold_3d=self.seq_threshold_3d,
            num_segments=scratch.num_segments,
            head_size_padded=scratch.head_size_padded,
            scratch_shapes={
                "segm_output": list(scratch.segm_output.shape),
                "segm_max": list(scratch.segm_max.shape),
                "segm_expsum": list(scratch.segm_expsum.shape),
            },
        )


class TritonAttentionImpl(AttentionImpl):
    def forward(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: TritonAttentionMetadata,
        output: torch.Tensor,
    ) -> torch.Tensor:
        common = metadata.common
        check_launch_shapes(query, key_cache, output, common, self.layer)
        num_tokens = common.num_actual_tokens
        unified_attention(
            query[:num_tokens],
            key_cache,
            value_cache,
            output[:num_tokens],
            query_start_loc=common.query_start_loc,
            seq_lens=common.seq_lens,
            block_table=common.block_table,
            max_query_len=common.max_query_len,
            max_seq_len=common.max_seq_len,
            sm_scale=self.layer.sm_scale,
            sliding_window=self.layer.sliding_window,
            logits_soft_cap=self.layer.logits_soft_cap,
            scratch=metadata.scratch,
            seq_threshold_3d=metadata.seq_threshold_3d,
            max_3d_query_len=metadata.max_3d_query_len,
        )
        return output


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    # Head sizes are padded to a power of two inside the kernel; multiples of 8 keep loads aligned.
    supported_head_sizes = tuple(range(8, 513, 8))
    supported_block_sizes = tuple(2**exponent for exponent in range(9))

    @classmethod
    def get_builder_cls(cls) -> type[TritonAttentionMetadataBuilder]:
        return TritonAttentionMetadataBuilder

    @classmethod
    def get_impl_cls(cls) -> type[TritonAttentionImpl]:
        return TritonAttentionImpl

    @classmethod
    def is_available(cls, device: torch.device | str) -> bool:
        """On CUDA when a GPU is present; on the CPU only under ``TRITON_INTERPRET=1``
        (read when kernels are decorated, so it must be set before they are imported)."""
        device = torch.device(device)
        if device.type == "cuda":
            return torch.cuda.is_available()
        return device.type == "cpu" and bool(triton.knobs.runtime.interpret)
