"""Layer descriptions: what grouping needs to know of each layer, per TP rank.

A model pair turns its transformers configs into one ``LayerDescription`` per
layer (target and draft), already divided by the tensor-parallel size. The
description is all that KV-cache grouping, attention grouping and the metadata
builders see of a layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from attngroup.reference_engine.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

if TYPE_CHECKING:  # kept out of the import so that CLIs answer without loading torch
    import torch

    from attngroup.kernels.backend import AttentionLayerParams


class Role(StrEnum):
    TARGET = "target"
    DRAFT = "draft"


class LayerKind(StrEnum):
    ATTENTION = "attention"
    MAMBA = "mamba"


class TensorParallelError(ValueError):
    """A layer's heads cannot be split over the requested TP size."""


@dataclass(frozen=True)
class LayerDescription:
    """One layer on one tensor-parallel rank.

    ``num_heads_q`` and ``num_kv_heads`` are per-rank counts. A KV-sharing
    layer (Gemma 4's shared layers, the Gemma 4 assistant's Q-only layers)
    names the layer whose cache it reads in ``kv_sharing_target`` and owns no
    cache of its own; that layer may share in turn. ``kv_cache_owner`` is the
    end of the chain, set once where grouping is planned
    (``attngroup.reference_engine.kv_sharing.with_kv_cache_owners``); everything after
    reads it through ``cache_layer``. Non-attention layers have ``num_heads_q == 0``.
    """

    name: str
    role: Role
    kind: LayerKind
    backend: str
    num_heads_q: int = 0
    num_kv_heads: int = 0
    head_size: int = 0
    sliding_window: int | None = None
    sm_scale: float = 1.0
    logits_soft_cap: float | None = None
    kv_sharing_target: str | None = None
    # The layer that owns the cache a KV-sharing layer reads (its chain followed);
    # None on a layer with a cache of its own, and on a sharing layer not yet resolved.
    kv_cache_owner: str | None = None
    mamba_state_shapes: tuple[tuple[int, ...], ...] = ()

    @property
    def is_attention(self) -> bool:
        return self.kind is LayerKind.ATTENTION

    @property
    def is_draft(self) -> bool:
        return self.role is Role.DRAFT

    @property
    def cache_layer(self) -> str:
        """The layer whose KV cache this layer uses: itself, or the owner at the
        end of its KV-sharing chain."""
        if self.kv_sharing_target is None:
            return self.name
        if self.kv_cache_owner is None:
            raise ValueError(
                f"layer {self.name} reads the KV cache of {self.kv_sharing_target!r}, but the "
                "owner at the end of that chain is not resolved: pass the layers through "
                "attngroup.reference_engine.kv_sharing.with_kv_cache_owners first (plan_grouping does)"
            )
        return self.kv_cache_owner

    def kv_cache_spec(self, block_size: int, dtype: torch.dtype) -> KVCacheSpec | None:
        """This layer's own spec, or None for a KV-sharing layer (it uses its target's)."""
        if self.kv_sharing_target is not None:
            return None
        if self.kind is LayerKind.MAMBA:
            return MambaSpec(
                block_size=block_size,
                shapes=self.mamba_state_shapes,
                dtypes=(dtype,) * len(self.mamba_state_shapes),
                is_draft=self.is_draft,
            )
        if self.sliding_window is not None:
            return SlidingWindowSpec(
                block_size=block_size,
                num_kv_heads=self.num_kv_heads,
                head_size=self.head_size,
                dtype=dtype,
                sliding_window=self.sliding_window,
                is_draft=self.is_draft,
            )
        return FullAttentionSpec(
            block_size=block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            dtype=dtype,
            is_draft=self.is_draft,
        )

    def attention_params(self) -> AttentionLayerParams:
        """The layer as its attention backend sees it."""
        if not self.is_attention:
            raise ValueError(f"layer {self.name} is a {self.kind} layer, not attention")
        from attngroup.kernels.backend import AttentionLayerParams

        return AttentionLayerParams(
            name=self.name,
            num_heads_q=self.num_heads_q,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            sm_scale=self.sm_scale,
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
        )


def heads_per_rank(
    layer_name: str, num_heads_q: int, num_kv_heads: int, tp_size: int
) -> tuple[int, int]:
    """Per-rank (query, KV) head counts for ``tp_size`` ranks.

    Query heads split evenly; KV heads split evenly too, or are replicated on
    every rank when there are fewer KV heads than ranks (vLLM's rule).
    """
    if tp_size < 1:
        raise TensorParallelError(
            f"layer {layer_name}: tensor-parallel size must be >= 1, got {tp_size}"
        )
    if num_heads_q % tp_size:
        raise TensorParallelError(
            f"layer {layer_name}: {num_heads_q} query heads do not divide over tp={tp_size}"
        )
    if num_kv_heads >= tp_size and num_kv_heads % tp_size:
        raise TensorParallelError(
            f"layer {layer_name}: {num_kv_heads} KV heads do not divide over tp={tp_size}"
        )
    if num_kv_heads < tp_size and tp_size % num_kv_heads:
        raise TensorParallelError(
            f"layer {layer_name}: {num_kv_heads} KV heads cannot be replicated evenly over tp={tp_size}"
        )
    return num_heads_q // tp_size, max(1, num_kv_heads // tp_size)
