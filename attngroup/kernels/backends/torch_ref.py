"""The torch reference backend ("torch"): the oracle, run in float32, as an engine backend.

It is the engine's CPU default, so it computes in float32 (float64 stays
float64) rather than the oracle's float64 default: one vectorised pass per
request, no per-token loop. Its builder keeps no head-sized state, so it has
nothing to mis-size; it still records the group's head count so the engine's
inspect CLI can show it next to the other backends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngroup.kernels.attention_oracle import paged_attention_reference
from attngroup.kernels.backend import AttentionBackend, AttentionImpl, AttentionMetadataBuilder
from attngroup.kernels.backends.common import check_launch_shapes, describe_builder
from attngroup.kernels.metadata import CommonAttentionMetadata


@dataclass(frozen=True)
class TorchReferenceMetadata:
    common: CommonAttentionMetadata
    num_heads_q: int  # the builder's (informational: this backend sizes nothing by it)


class TorchReferenceMetadataBuilder(AttentionMetadataBuilder):
    def build(self, common: CommonAttentionMetadata) -> TorchReferenceMetadata:
        return TorchReferenceMetadata(common=common, num_heads_q=self.num_heads_q)

    def describe(self) -> dict:
        return describe_builder(self, TorchReferenceBackend.name)


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """float32 for float32 and narrower inputs, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class TorchReferenceImpl(AttentionImpl):
    def forward(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: TorchReferenceMetadata,
        output: torch.Tensor,
    ) -> torch.Tensor:
        common = metadata.common
        check_launch_shapes(query, key_cache, output, common, self.layer)
        num_tokens = common.num_actual_tokens
        result = paged_attention_reference(
            query[:num_tokens],
            key_cache,
            value_cache,
            # Host copies: the oracle reads them per request, so this avoids device syncs.
            query_start_loc=common.query_start_loc_cpu,
            seq_lens=common.seq_lens_cpu,
            block_table=common.block_table,
            sm_scale=self.layer.sm_scale,
            sliding_window=self.layer.sliding_window,
            logits_soft_cap=self.layer.logits_soft_cap,
            compute_dtype=compute_dtype_for(query.dtype),
        )
        output[:num_tokens].copy_(result)
        return output


class TorchReferenceBackend(AttentionBackend):
    name = "torch"
    # Any head size and block size: the oracle gathers pages with plain indexing.
    supported_head_sizes = tuple(range(1, 1025))
    supported_dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    supported_block_sizes = tuple(2**exponent for exponent in range(9))

    @classmethod
    def get_builder_cls(cls) -> type[TorchReferenceMetadataBuilder]:
        return TorchReferenceMetadataBuilder

    @classmethod
    def get_impl_cls(cls) -> type[TorchReferenceImpl]:
        return TorchReferenceImpl
