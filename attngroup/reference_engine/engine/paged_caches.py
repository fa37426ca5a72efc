"""The model runner's paged caches: one tensor pair per KV-writing layer, one
state per state layer, and a KV-sharing layer aliased to its owner's tensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from attngroup.reference_engine.kv_cache_spec import AttentionSpec, KVCacheGroupSpec, MambaSpec
from attngroup.reference_engine.kv_sharing import with_kv_cache_owners
from attngroup.reference_engine.layers import LayerDescription

KVCaches = dict[str, tuple[torch.Tensor, torch.Tensor]]
StateCaches = dict[str, tuple[torch.Tensor, ...]]


def allocate_caches(
    kv_cache_groups: Sequence[KVCacheGroupSpec],
    layers: Mapping[str, LayerDescription],
    num_blocks: int,
    device: torch.device,
) -> tuple[KVCaches, StateCaches]:
    """Zeroed caches of ``num_blocks`` blocks per layer, each with its own spec
    inside its group: attention ``[num_blocks, block_size, kv_heads, head_size]``
    for keys and values, state layers ``[num_blocks, *state]``. A KV-sharing
    layer gets its owner's tensors (the end of its chain, read from its
    description; resolved first when the descriptions do not carry it)."""
    kv_caches: KVCaches = {}
    state_caches: StateCaches = {}
    for group in kv_cache_groups:
        block_size = group.kv_cache_spec.block_size
        for name in group.layer_names:
            if layers[name].kv_sharing_target is not None:
                continue
            spec = group.spec_for(name)
            if isinstance(spec, MambaSpec):
                state_caches[name] = tuple(
                    torch.zeros(num_blocks, *shape, dtype=dtype, device=device)
                    for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)
                )
            elif isinstance(spec, AttentionSpec):
                shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_size)
                kv_caches[name] = (
                    torch.zeros(shape, dtype=spec.dtype, device=device),
                    torch.zeros(shape, dtype=spec.dtype, device=device),
                )
            else:
                raise TypeError(f"layer {name}: no cache layout for {type(spec).__name__}")
    for layer in with_kv_cache_owners(layers.values()):
        if layer.kv_sharing_target is not None:
            kv_caches[layer.name] = kv_caches[layer.cache_layer]
    return kv_caches, state_caches
