"""KV-cache groups: which layers share one block table.

Follows vLLM's ``get_kv_cache_groups`` (``vllm/v1/core/kv_cache_utils.py``,
later ``kv_cache_planning.py``):

1. ``disable_hybrid`` promotes sliding-window layers to full attention that
   keeps its window for compute (``unify_hybrid_kv_cache_specs``).
2. No specs: no groups (attention-free model).
3. All specs merge: one group with the merged spec.
4. Same spec type and block size, different sizes: one group with a
   ``UniformTypeKVCacheSpecs``.
5. Otherwise (hybrid): give every layer the largest page size, by scaling the
   block size of smaller attention pages or padding Mamba state pages; bucket
   layers by spec (merging buckets whose specs merge); split every bucket into
   groups of ``group_size`` layers with a stride, so that every group needs
   the same memory per block.

KV-sharing layers have no spec of their own; they join their target's group.
Every layer ends up in exactly one group (checked, not assumed).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

from attngroup.reference_engine.kv_cache_spec import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    SpecMergeError,
    UniformTypeKVCacheSpecs,
)

#: vLLM's heuristic: when the largest bucket has fewer than 1.5 x the layers
#: of the smallest, pad to the largest instead of splitting it (gpt-oss + EAGLE:
#: 12 sliding + 13 full become two groups of 13, not 1 + 12 + 12).
PAD_TO_LARGEST_BUCKET_FACTOR = 1.5

_NO_KV_SHARING: Mapping[str, str] = MappingProxyType({})


class KVCacheGroupingError(ValueError):
    """The layers' specs or KV-sharing map cannot be put into KV-cache groups."""


def get_kv_cache_groups(
    specs: Mapping[str, KVCacheSpec],
    kv_sharing: Mapping[str, str] = _NO_KV_SHARING,
    *,
    disable_hybrid: bool = False,
) -> list[KVCacheGroupSpec]:
    """The KV-cache groups for per-layer ``specs`` (in layer order).

    ``kv_sharing`` maps a layer without a spec of its own to the layer whose
    KV cache it reads; it is appended to that layer's group (after the group's
    own layers, in ``kv_sharing`` order). ``disable_hybrid`` mirrors vLLM's
    ``--disable-hybrid-kv-cache-manager``. Neither argument is modified.
    """
    _check_specs(specs)
    share_targets = resolve_kv_sharing_targets(specs, kv_sharing)
    own_specs = dict(specs)
    if disable_hybrid:
        own_specs = promote_sliding_window_specs(own_specs)
    layer_lists, group_specs = _group_layers_with_own_specs(own_specs)
    index_of_group = {name: i for i, names in enumerate(layer_lists) for name in names}
    for shared_layer, target in share_targets.items():
        layer_lists[index_of_group[target]].append(shared_layer)
    groups = [
        KVCacheGroupSpec(tuple(names), spec)
        for names, spec in zip(layer_lists, group_specs, strict=True)
    ]
    check_exact_partition(groups, [*specs, *kv_sharing])
    return groups


def resolve_kv_sharing_targets(
    specs: Collection[str], kv_sharing: Mapping[str, str]
) -> dict[str, str]:
    """Each KV-sharing layer's final target: a layer with a spec of its own
    (``specs``: those layers' names, or a mapping keyed by them).

    Chains (``a`` reads ``b``, which reads ``c``) are followed to ``c``. The
    engine's one chain resolver: ``get_kv_cache_groups`` and, on layer
    descriptions, ``attngroup.reference_engine.kv_sharing.with_kv_cache_owners`` call it.
    """
    resolved: dict[str, str] = {}
    for shared_layer, target in kv_sharing.items():
        if shared_layer in specs:
            raise KVCacheGroupingError(
                f"layer {shared_layer!r} is in kv_sharing (it reads the KV cache of {target!r}) "
                "but also has a KV-cache spec of its own; a KV-sharing layer owns no cache: "
                "remove it from the specs or from kv_sharing"
            )
        chain = [shared_layer]
        while target in kv_sharing and target not in chain:
            chain.append(target)
            target = kv_sharing[target]
        if target in chain:
            raise KVCacheGroupingError(
                f"kv_sharing has a cycle: {' -> '.join([*chain, target])}; "
                "every chain must end at a layer with a KV-cache spec of its own"
            )
        if target not in specs:
            raise KVCacheGroupingError(
                f"layer {shared_layer!r} shares the KV cache of {target!r}, but {target!r} has no "
                f"KV-cache spec (via {' -> '.join([*chain, target])}); add a spec for "
                f"{target!r} or point {shared_layer!r} at a layer that has one"
            )
        resolved[shared_layer] = target
    return resolved


def promote_sliding_window_specs(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """vLLM's ``unify_hybrid_kv_cache_specs``: with the hybrid manager off, a
    full + sliding-window model keeps every token of every layer, so sliding
    layers become full attention that keeps its window for compute only."""
    promoted = dict(specs)
    if (
        not promoted
        or _merge_all(list(promoted.values()))
        or UniformTypeKVCacheSpecs.from_specs(promoted)
    ):
        return promoted
    kinds = {type(spec) for spec in promoted.values()}
    if FullAttentionSpec in kinds and SlidingWindowSpec in kinds:
        for name, spec in specs.items():
            if isinstance(spec, SlidingWindowSpec):
                promoted[name] = FullAttentionSpec(
                    block_size=spec.block_size,
                    num_kv_heads=spec.num_kv_heads,
                    head_size=spec.head_size,
                    dtype=spec.dtype,
                    sliding_window=spec.sliding_window,
                    is_draft=spec.is_draft,
                )
    if _merge_all(list(promoted.values())) or UniformTypeKVCacheSpecs.from_specs(promoted):
        return promoted
    raise KVCacheGroupingError(
        "disable_hybrid=True, but the layers still need different KV-cache types after "
        f"promoting sliding-window layers to full attention: {_describe_kinds(promoted)}; "
        "disabling the hybrid manager only unifies full + sliding-window models of one block "
        "size: leave disable_hybrid off for this model"
    )


def unify_page_sizes(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Give every layer the largest page size, so one block pool serves all.

    An attention layer with a smaller page gets a proportionally larger block
    size (its page must divide the largest one); a Mamba layer, whose page is
    its recurrent state and does not scale with the block size, is padded.
    """
    largest = max(spec.page_size_bytes for spec in specs.values())
    largest_layers = [name for name, spec in specs.items() if spec.page_size_bytes == largest]
    unified: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        page = spec.page_size_bytes
        if page == largest:
            unified[name] = spec
        elif isinstance(spec, MambaSpec):
            unified[name] = replace(spec, page_size_padded=largest)
        elif isinstance(spec, AttentionSpec) and largest % page == 0:
            unified[name] = spec.copy_with_new_block_size(spec.block_size * (largest // page))
        else:
            raise KVCacheGroupingError(
                f"cannot unify KV-cache page sizes: layer {name!r} ({type(spec).__name__}, "
                f"block_size {spec.block_size}) has a page of {page} bytes, which does not "
                f"divide the largest page, {largest} bytes (layer {largest_layers[0]!r}); "
                "hybrid KV-cache groups share one page size, so choose block sizes, head sizes "
                "or dtypes whose page sizes (2 x block_size x num_kv_heads x head_size x dtype "
                "bytes) divide each other"
            )
        assert unified[name].page_size_bytes == largest, (name, unified[name])
    return unified


def check_exact_partition(groups: Sequence[KVCacheGroupSpec], layer_names: Sequence[str]) -> None:
    """Every layer in exactly one group, and no group names an unknown layer."""
    expected = set(layer_names)
    seen: dict[str, int] = {}
    for group in groups:
        for name in group.layer_names:
            seen[name] = seen.get(name, 0) + 1
    duplicated = sorted(name for name, count in seen.items() if count > 1)
    missing = sorted(expected - seen.keys())
    unknown = sorted(seen.keys() - expected)
    if duplicated or missing or unknown:
        raise KVCacheGroupingError(
            "KV-cache groups are not an exact partition of the layers: "
            f"in more than one group {duplicated}, in no group {missing}, "
            f"not a layer {unknown}; every layer must share exactly one block table"
        )


def _group_layers_with_own_specs(
    specs: dict[str, KVCacheSpec],
) -> tuple[list[list[str]], list[KVCacheSpec]]:
    """Steps 2-5 of the module docstring: layer lists and their group specs."""
    if not specs:
        return [], []
    if merged := _merge_all(list(specs.values())):
        return [list(specs)], [merged]
    if uniform := UniformTypeKVCacheSpecs.from_specs(specs):
        return [list(specs)], [uniform]
    unified = unify_page_sizes(specs)
    buckets = _buckets_of_mergeable_specs(unified)
    sizes = [len(bucket) for bucket in buckets]
    group_size = min(sizes)
    if max(sizes) < min(sizes) * PAD_TO_LARGEST_BUCKET_FACTOR:
        group_size = max(sizes)
    layer_lists: list[list[str]] = []
    for bucket in buckets:
        num_groups = -(-len(bucket) // group_size)
        # Strided, not contiguous: with pipeline parallelism each stage then
        # holds about the same share of every group (vLLM's reasoning).
        layer_lists.extend(bucket[i::num_groups] for i in range(num_groups))
    # A bucket's specs merge, so do those of any part of it.
    group_specs = [_merge([unified[name] for name in names]) for names in layer_lists]
    return layer_lists, group_specs


def _buckets_of_mergeable_specs(specs: dict[str, KVCacheSpec]) -> list[list[str]]:
    """Layers bucketed by spec, buckets whose specs merge joined (e.g. full
    attention with and without a compute window); layers keep spec order."""
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in specs.items():
        by_spec.setdefault(spec, []).append(name)
    bucket_specs: list[list[KVCacheSpec]] = []
    buckets: list[list[str]] = []
    for spec, names in by_spec.items():
        for members, layers in zip(bucket_specs, buckets, strict=True):
            if _merge_all([*members, spec]):
                members.append(spec)
                layers.extend(names)
                break
        else:
            bucket_specs.append([spec])
            buckets.append(list(names))
    order = {name: i for i, name in enumerate(specs)}
    return [sorted(layers, key=order.__getitem__) for layers in buckets]


def _merge_all(specs: list[KVCacheSpec]) -> KVCacheSpec | None:
    """The merged spec, or None when the specs cannot share one group."""
    try:
        return _merge(specs)
    except SpecMergeError:
        return None


def _merge(specs: list[KVCacheSpec]) -> KVCacheSpec:
    """The merged spec; raises SpecMergeError when the specs cannot share one group."""
    return type(specs[0]).merge(specs)


def _check_specs(specs: Mapping[str, KVCacheSpec]) -> None:
    for name, spec in specs.items():
        if not isinstance(spec, KVCacheSpec) or isinstance(spec, UniformTypeKVCacheSpecs):
            raise KVCacheGroupingError(
                f"layer {name!r}: expected one layer's KVCacheSpec (e.g. FullAttentionSpec), "
                f"got {type(spec).__name__}; pass one spec per layer"
            )


def _describe_kinds(specs: Mapping[str, KVCacheSpec]) -> str:
    kinds: dict[str, list[str]] = {}
    for name, spec in specs.items():
        kinds.setdefault(f"{type(spec).__name__}(block_size={spec.block_size})", []).append(name)
    return "; ".join(f"{kind}: {names}" for kind, names in kinds.items())
