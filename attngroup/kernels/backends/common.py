"""Pieces every backend shares: the builder description and the query checks at launch."""

from __future__ import annotations

from typing import Any

import torch

from attngroup.kernels.backend import AttentionLayerParams, AttentionMetadataBuilder
from attngroup.kernels.metadata import CommonAttentionMetadata


class HeadCountMismatchError(ValueError):
    """A query's head count differs from the one its builder planned or sized state for."""


def describe_builder(builder: AttentionMetadataBuilder, backend: str, **state: Any) -> dict:
    """JSON-friendly view of a builder: whom it serves and its head-sized state.

    The engine's inspect CLI and the suites print it; ``state`` names the
    backend's own head-sized pieces (scratch shapes, plan parameters).
    """
    return {
        "backend": backend,
        "layers": list(builder.layer_names),
        "num_heads_q": builder.num_heads_q,
        "num_heads_kv": builder.num_heads_kv,
        "head_size": builder.head_size,
        **state,
    }


def check_launch_shapes(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    output: torch.Tensor,
    common: CommonAttentionMetadata,
    layer: AttentionLayerParams,
) -> None:
    """Reject a launch whose tensors do not match the layer and the batch.

    Checked before any kernel runs, so a bad launch raises instead of reading
    out of bounds or leaving ``output`` half written.
    """
    if query.ndim != 3 or query.shape[1:] != (layer.num_heads_q, layer.head_size):
        raise HeadCountMismatchError(
            f"layer {layer.name}: query must be [tokens, {layer.num_heads_q}, {layer.head_size}], "
            f"got {tuple(query.shape)}"
        )
    if key_cache.ndim != 4 or key_cache.shape[2:] != (layer.num_kv_heads, layer.head_size):
        raise ValueError(
            f"layer {layer.name}: key_cache must be [blocks, block_size, {layer.num_kv_heads}, "
            f"{layer.head_size}], got {tuple(key_cache.shape)}"
        )
    if key_cache.shape[1] != common.block_size:
        raise ValueError(
            f"layer {layer.name}: the cache's block size {key_cache.shape[1]} differs from the "
            f"batch's {common.block_size}"
        )
    if output.shape != query.shape:
        raise ValueError(
            f"layer {layer.name}: output {tuple(output.shape)} must match query "
            f"{tuple(query.shape)}"
        )
    if query.shape[0] < common.num_actual_tokens:
        raise ValueError(
            f"layer {layer.name}: query has {query.shape[0]} tokens, the batch "
            f"{common.num_actual_tokens}"
        )
