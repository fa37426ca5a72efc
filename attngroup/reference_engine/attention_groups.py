"""Attention groups: the layers of one KV-cache group that share a metadata builder.

A metadata builder sizes per-step state by one query-head count (Triton's
split-KV scratch, FlashInfer's planned ``num_qo_heads``). The key of a group is
therefore (backend identity, per-layer KV spec, per-rank ``num_heads_q``); the
old key without the head count (``GroupingPolicy.LEGACY``, vLLM before PR
#43543) put a Gemma 4 MTP draft's 4-head layers into the target's 8-head group,
and the strict check then failed at engine start-up:

    AssertionError: All layers in one attention group must share num_heads; got {8, 4} for [...]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attngroup.kernels.backend import (
    AttentionBackend,
    MetadataBuilder,
    StateBackend,
    get_num_attention_heads_from_layers,
)
from attngroup.kernels.registry import get_backend, get_state_backend
from attngroup.reference_engine.grouping_policy import GroupingPolicy
from attngroup.reference_engine.kv_cache_spec import AttentionSpec, KVCacheGroupSpec, KVCacheSpec
from attngroup.reference_engine.kv_sharing import with_kv_cache_owners
from attngroup.reference_engine.layers import LayerDescription

__all__ = [
    "AttentionGroup",
    "AttentionGroupKey",
    "GroupingPolicy",
    "get_num_attention_heads_from_layers",
    "group_attention_layers",
]


@dataclass(frozen=True)
class AttentionGroupKey:
    """What makes two layers of one KV-cache group share a builder."""

    attn_backend: type[AttentionBackend] | type[StateBackend]
    kv_cache_spec: KVCacheSpec
    num_heads_q: int

    def dedup_key(self, policy: GroupingPolicy) -> tuple:
        """The tuple groups are deduplicated on. The backend counts by its
        fully qualified class name, so dynamically made subclasses merge."""
        heads = self.num_heads_q if policy is GroupingPolicy.SPLIT_BY_Q_HEADS else None
        return (self.attn_backend.full_cls_name(), self.kv_cache_spec, heads)


@dataclass(eq=False)
class AttentionGroup:
    """Layers served by one backend and one set of metadata builders (one
    builder per micro-batch). Compared by identity, as in vLLM."""

    backend: type[AttentionBackend] | type[StateBackend]
    layer_names: list[str]
    kv_cache_spec: KVCacheSpec
    kv_cache_group_id: int
    num_heads_q: int
    metadata_builders: list[MetadataBuilder] = field(default_factory=list)

    def create_metadata_builders(
        self,
        layers: Mapping[str, LayerDescription],
        device: torch.device | str,
        num_builders: int = 1,
        **builder_options: Any,
    ) -> None:
        """One builder per micro-batch, each created from the group's layers;
        an attention builder's strict check refuses layers with mixed head counts."""
        if num_builders < 1:
            raise ValueError(f"num_builders must be >= 1, got {num_builders}")
        self.metadata_builders = [
            self._new_builder(layers, torch.device(device), builder_options)
            for _ in range(num_builders)
        ]

    def _new_builder(
        self,
        layers: Mapping[str, LayerDescription],
        device: torch.device,
        options: Mapping[str, Any],
    ) -> MetadataBuilder:
        """A builder made as the backend's kind asks: a state builder from the layer
        names alone (state layers have no query heads or KV geometry, and size
        nothing by the batch limits), an attention builder from each layer's
        attention parameters and the group's KV geometry."""
        backend, spec = self.backend, self.kv_cache_spec
        if issubclass(backend, StateBackend):
            return backend.get_builder_cls()(self.layer_names, device)
        if not isinstance(spec, AttentionSpec):
            raise TypeError(
                f"attention group {self.layer_names[0]}..: attention backend {backend.name} "
                f"cannot serve a {type(spec).__name__}"
            )
        params = [layers[name].attention_params() for name in self.layer_names]
        return backend.get_builder_cls()(spec, params, device, **options)

    def get_metadata_builder(self, ubatch_id: int = 0) -> MetadataBuilder:
        if not 0 <= ubatch_id < len(self.metadata_builders):
            raise IndexError(
                f"attention group {self.layer_names[0]}..: no metadata builder for micro-batch {ubatch_id} "
                f"({len(self.metadata_builders)} created)"
            )
        return self.metadata_builders[ubatch_id]


def group_attention_layers(
    kv_cache_groups: Sequence[KVCacheGroupSpec],
    layers: Sequence[LayerDescription] | Mapping[str, LayerDescription],
    policy: GroupingPolicy = GroupingPolicy.SPLIT_BY_Q_HEADS,
) -> list[list[AttentionGroup]]:
    """Attention groups per KV-cache group, indexed [kv_cache_group][attention_group].

    Layer order inside a group follows the KV-cache group; groups appear in
    first-seen order. Non-attention layers have ``num_heads_q`` 0. A KV-sharing
    layer has no spec of its own and takes its cache owner's (read from its
    description; resolved here first when the descriptions do not carry it).
    """
    described = layers.values() if isinstance(layers, Mapping) else layers
    by_name = {layer.name: layer for layer in with_kv_cache_owners(described)}
    policy = GroupingPolicy(policy)
    result: list[list[AttentionGroup]] = []
    for group_id, kv_group in enumerate(kv_cache_groups):
        groups: dict[tuple, AttentionGroup] = {}
        for name in kv_group.layer_names:
            try:
                layer = by_name[name]
            except KeyError:
                raise KeyError(
                    f"KV-cache group {group_id} names layer {name!r}, which has no description"
                ) from None
            key = AttentionGroupKey(
                get_backend(layer.backend)
                if layer.is_attention
                else get_state_backend(layer.backend),
                kv_group.spec_for(layer.cache_layer),
                layer.num_heads_q,
            )
            dedup = key.dedup_key(policy)
            if dedup not in groups:
                groups[dedup] = AttentionGroup(
                    backend=key.attn_backend,
                    layer_names=[],
                    kv_cache_spec=key.kv_cache_spec,
                    kv_cache_group_id=group_id,
                    num_heads_q=key.num_heads_q,
                )
            groups[dedup].layer_names.append(name)
        result.append(list(groups.values()))
    return result
