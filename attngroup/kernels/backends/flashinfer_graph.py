"""FlashInfer's CUDA-graph wrappers: one per attention group and captured step bucket.

A captured FlashInfer run reads its batch from index buffers whose addresses the graph
froze, and its work partition from plan data. So each group gets, per step bucket, a
wrapper made with ``use_cuda_graph=True`` over index buffers sized for the bucket
(``capture_plan.GroupBuffers``), planned with the group's own head count outside the
graph before every replay (``build``); the plan copies the step's indices into the fixed
buffers. Replaying without that plan is vLLM #46329's stale-plan bug. The wrapper shares
its group builder's float workspace: runs never overlap.
"""

from __future__ import annotations

import torch

from attngroup.kernels.backends.flashinfer_attn import (
    FlashInferMetadata,
    FlashInferMetadataBuilder,
    _import_flashinfer,
    choose_wrapper,
    plan_wrapper,
    query_shape_of_length,
)
from attngroup.kernels.metadata import CommonAttentionMetadata


class FlashInferGraphWrapper:
    """One attention group's wrapper for one captured bucket (``num_reqs`` requests of
    ``query_len`` tokens, block tables ``block_table_width`` wide)."""

    def __init__(
        self,
        builder: FlashInferMetadataBuilder,
        *,
        num_reqs: int,
        query_len: int,
        block_table_width: int,
    ) -> None:
        flashinfer = _import_flashinfer()
        self.plan = builder.plan
        self.choice = choose_wrapper(self.plan.head_dim, query_shape_of_length(query_len))
        planned = num_reqs
        device = builder.device

        def index_buffer(length: int) -> torch.Tensor:
            return torch.zeros(length, dtype=torch.int32, device=device)

        self.kv_indptr = index_buffer(planned + 1)
        self.kv_indices = index_buffer(planned * block_table_width)
        self.kv_last_page_len = index_buffer(planned)
        if self.choice.kind == "prefill":
            self.qo_indptr = index_buffer(planned + 1)
            self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                builder.workspace,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf=self.qo_indptr,
                paged_kv_indptr_buf=self.kv_indptr,
                paged_kv_indices_buf=self.kv_indices,
                paged_kv_last_page_len_buf=self.kv_last_page_len,
                backend=self.choice.prefill_backend or "auto",
            )
        else:
            self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                builder.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=self.choice.tensor_cores,
                paged_kv_indptr_buffer=self.kv_indptr,
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len,
            )
        self.generation = 0

    def build(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        """Plan the step into the fixed buffers (outside the graph, before each replay)."""
        plan_wrapper(self.wrapper, self.choice, self.plan, common)
        self.generation += 1
        return FlashInferMetadata(
            common=common,
            plan=self.plan,
            choice=self.choice,
            wrapper=self.wrapper,
            builder=self,  # type: ignore[arg-type]  # FlashInferImpl reads only .generation
            generation=self.generation,
        )
