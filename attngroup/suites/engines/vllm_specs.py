"""Spec conversion between the neutral spec types and vLLM's own.

The suites speak ``attngroup.reference_engine.kv_cache_spec``; vLLM groups its own
``vllm.v1.kv_cache_interface`` dataclasses. Conversion is exact both ways: a
vLLM spec whose fields carry anything the neutral types cannot express (a
padded attention page, a chunked-local window, a quantized cache ...) is
refused with an error naming the field, never silently dropped, so a verdict
can never rest on a lossy translation.

vLLM is imported lazily: this module imports on a machine without vLLM.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attngroup.reference_engine.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

#: vLLM fields each neutral type carries (besides ``block_size`` and ``is_draft``).
_CARRIED_FIELDS: dict[type[KVCacheSpec], tuple[str, ...]] = {
    FullAttentionSpec: ("num_kv_heads", "head_size", "dtype", "sliding_window"),
    SlidingWindowSpec: ("num_kv_heads", "head_size", "dtype", "sliding_window"),
    MambaSpec: ("shapes", "dtypes", "page_size_padded"),
}


class UnrepresentableSpecError(ValueError):
    """vLLM produced a spec the neutral spec types cannot express."""


def _interface() -> Any:
    from vllm.v1 import kv_cache_interface

    return kv_cache_interface


def _vllm_class(neutral_type: type[KVCacheSpec]) -> type:
    return getattr(_interface(), neutral_type.__name__)


def to_vllm_spec(spec: KVCacheSpec) -> Any:
    """The vLLM spec equal to ``spec`` (``is_draft`` kept where vLLM has it)."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return _interface().UniformTypeKVCacheSpecs(
            block_size=spec.block_size,
            kv_cache_specs={name: to_vllm_spec(s) for name, s in spec.kv_cache_specs},
        )
    neutral_type = type(spec)
    if neutral_type not in _CARRIED_FIELDS:
        raise TypeError(f"no vLLM counterpart for spec type {neutral_type.__name__}: {spec}")
    vllm_class = _vllm_class(neutral_type)
    kwargs = {name: getattr(spec, name) for name in ("block_size", *_CARRIED_FIELDS[neutral_type])}
    if "is_draft" in {f.name for f in dataclasses.fields(vllm_class)}:
        kwargs["is_draft"] = spec.is_draft
    return vllm_class(**kwargs)


def from_vllm_spec(spec: Any) -> KVCacheSpec:
    """The neutral spec equal to vLLM's ``spec``; refuses lossy conversions."""
    name = type(spec).__name__
    if name == "UniformTypeKVCacheSpecs":
        return UniformTypeKVCacheSpecs(
            block_size=spec.block_size,
            kv_cache_specs=tuple(
                (layer, from_vllm_spec(s)) for layer, s in spec.kv_cache_specs.items()
            ),
        )
    neutral_type = next((t for t in _CARRIED_FIELDS if t.__name__ == name), None)
    if neutral_type is None:
        raise UnrepresentableSpecError(f"vLLM spec type {name} has no neutral counterpart: {spec}")
    carried = {"block_size", "is_draft", *_CARRIED_FIELDS[neutral_type]}
    for field in dataclasses.fields(spec):
        if field.name in carried or _is_default(spec, field):
            continue
        raise UnrepresentableSpecError(
            f"vLLM {name} sets {field.name}={getattr(spec, field.name)!r}, which the neutral "
            f"{neutral_type.__name__} cannot express: {spec}"
        )
    kwargs = {field: getattr(spec, field) for field in _CARRIED_FIELDS[neutral_type]}
    if neutral_type is MambaSpec:
        kwargs = {**kwargs, "shapes": tuple(map(tuple, spec.shapes)), "dtypes": tuple(spec.dtypes)}
    return neutral_type(
        block_size=spec.block_size, is_draft=getattr(spec, "is_draft", False), **kwargs
    )


def _is_default(spec: Any, field: dataclasses.Field) -> bool:
    value = getattr(spec, field.name)
    if field.name == "head_size_v":  # vLLM fills it with head_size when unset
        return value in (None, spec.head_size)
    if field.default is not dataclasses.MISSING:
        return value == field.default
    if field.default_factory is not dataclasses.MISSING:
        return value == field.default_factory()
    return False


def from_vllm_group(group: Any) -> KVCacheGroupSpec:
    """A vLLM ``KVCacheGroupSpec`` as the neutral one."""
    return KVCacheGroupSpec(tuple(group.layer_names), from_vllm_spec(group.kv_cache_spec))
