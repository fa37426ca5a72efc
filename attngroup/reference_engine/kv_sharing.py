"""KV sharing on layer descriptions: each sharing layer's cache owner, resolved once.

A KV-sharing layer names the layer whose cache it reads (``kv_sharing_target``),
which may share in turn. Where grouping is planned (``plan_grouping``),
``with_kv_cache_owners`` follows every chain once, through the one chain
resolver (``kv_cache_groups.resolve_kv_sharing_targets``: cycles and chains
that end at no cache are refused, naming the layers), and writes the owner on
each sharing layer's description (``kv_cache_owner``). KV-cache grouping,
attention grouping and the runner's caches read that owner instead of
following chains themselves; called directly with unresolved descriptions,
they resolve them here first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from attngroup.reference_engine.kv_cache_groups import resolve_kv_sharing_targets
from attngroup.reference_engine.layers import LayerDescription


def kv_sharing_of(layers: Iterable[LayerDescription]) -> dict[str, str]:
    """Shared layer -> the layer whose KV cache it names (one hop, as described)."""
    return {layer.name: layer.kv_sharing_target for layer in layers if layer.kv_sharing_target}


def kv_cache_owners_of(layers: Iterable[LayerDescription]) -> dict[str, str]:
    """Shared layer -> the layer that owns the cache it reads (resolved descriptions)."""
    return {layer.name: layer.cache_layer for layer in layers if layer.kv_sharing_target}


def with_kv_cache_owners(layers: Iterable[LayerDescription]) -> list[LayerDescription]:
    """``layers`` with every KV-sharing layer's ``kv_cache_owner`` set: the end of
    its chain. Descriptions that all carry their owner already come back as
    they are; otherwise every chain is resolved (raising ``KVCacheGroupingError``,
    a ValueError, on a cycle or a chain that ends at no cache)."""
    layers = list(layers)
    sharing = [layer for layer in layers if layer.kv_sharing_target is not None]
    if all(layer.kv_cache_owner is not None for layer in sharing):
        return layers
    owns_cache = [layer.name for layer in layers if layer.kv_sharing_target is None]
    owners = resolve_kv_sharing_targets(dict.fromkeys(owns_cache), kv_sharing_of(layers))
    return [
        replace(layer, kv_cache_owner=owners[layer.name]) if layer.name in owners else layer
        for layer in layers
    ]
