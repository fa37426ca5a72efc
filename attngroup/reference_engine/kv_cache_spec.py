"""KV-cache specs: what one layer needs from the paged KV cache.

Specs are frozen dataclasses compared by value, so that layers with equal
specs can share one block table. ``is_draft`` marks speculative-decoding draft
layers for bookkeeping only: it never takes part in equality or hashing, so it
can never change grouping (as in vLLM's ``KVCacheSpec``).

Note what a spec does *not* hold: the number of query heads. Two layers with
equal specs can still need differently sized metadata-builder state; that is
why attention grouping keys on ``num_heads_q`` as well (see
``attngroup.reference_engine.attention_groups``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:  # dtypes arrive as values; the module itself loads without torch
    import torch


class SpecMergeError(ValueError):
    """Specs that cannot share one KV-cache group were asked to merge."""


@dataclass(frozen=True)
class KVCacheSpec:
    """Base of all specs: one page holds ``block_size`` token slots."""

    block_size: int
    is_draft: bool = field(default=False, compare=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(
                f"{type(self).__name__}: block_size must be positive, got {self.block_size}"
            )

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError

    def copy_with_new_block_size(self, block_size: int) -> Self:
        return replace(self, block_size=block_size)

    @classmethod
    def merge(cls, specs: Iterable[KVCacheSpec]) -> KVCacheSpec:
        """Merge specs of layers that share one group; they must be equal."""
        specs = list(specs)
        if not specs:
            raise SpecMergeError("cannot merge an empty list of specs")
        first = specs[0]
        for other in specs[1:]:
            if other != first:
                raise SpecMergeError(
                    f"specs differ and cannot share a KV-cache group: {first} vs {other}"
                )
        return first

    def describe(self) -> dict:
        """JSON-friendly view used by the CLI and the reports."""
        out: dict = {"type": type(self).__name__, "block_size": self.block_size}
        for name in ("num_kv_heads", "head_size", "sliding_window"):
            if hasattr(self, name):
                out[name] = getattr(self, name)
        if hasattr(self, "dtype"):
            out["dtype"] = str(self.dtype).removeprefix("torch.")
        out["page_size_bytes"] = self.page_size_bytes
        return out


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    """Dense K and V pages: [block_size, num_kv_heads, head_size] each."""

    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_kv_heads <= 0 or self.head_size <= 0:
            raise ValueError(
                f"{type(self).__name__}: num_kv_heads and head_size must be positive, "
                f"got {self.num_kv_heads} and {self.head_size}"
            )

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype.itemsize


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """Full attention; ``sliding_window`` is kept for compute when a sliding
    layer was promoted to full attention (hybrid manager disabled)."""

    sliding_window: int | None = None

    @classmethod
    def merge(cls, specs: Iterable[KVCacheSpec]) -> KVCacheSpec:
        """Full-attention specs with and without a window merge (the window
        only matters for compute); two different windows cannot."""
        specs = list(specs)
        if not specs:
            raise SpecMergeError("cannot merge an empty list of specs")
        full = [s for s in specs if isinstance(s, FullAttentionSpec)]
        if len(full) < len(specs):
            return KVCacheSpec.merge(specs)
        windows = {s.sliding_window for s in full if s.sliding_window is not None}
        if len(windows) > 1:
            raise SpecMergeError(
                f"full-attention specs with different sliding windows {sorted(windows)} cannot merge"
            )
        base = {replace(s, sliding_window=None) for s in full}
        if len(base) > 1:
            raise SpecMergeError(
                f"full-attention specs differ beyond the window: {sorted(map(str, base))}"
            )
        return replace(full[0], sliding_window=next(iter(windows), None))


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """Sliding-window attention; the window counts the current token (HF)."""

    sliding_window: int

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sliding_window <= 0:
            raise ValueError(
                f"SlidingWindowSpec: sliding_window must be positive, got {self.sliding_window}"
            )


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """A non-attention state layer: one page holds the recurrent state.

    ``page_size_padded`` lets hybrid models pad the state page up to the
    attention page size so that all groups share one page size.
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    page_size_padded: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.shapes) != len(self.dtypes):
            raise ValueError(f"MambaSpec: {len(self.shapes)} shapes but {len(self.dtypes)} dtypes")
        if self.page_size_padded is not None and self.page_size_padded < self.state_bytes:
            raise ValueError(
                f"MambaSpec: page_size_padded {self.page_size_padded} is below the state size {self.state_bytes}"
            )

    @property
    def state_bytes(self) -> int:
        return sum(math.prod(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes, strict=True))

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None else self.state_bytes


@dataclass(frozen=True)
class UniformTypeKVCacheSpecs(KVCacheSpec):
    """One group for layers of one spec type and block size whose per-layer
    sizes differ (e.g. head 64 and head 128): they need the same token slots,
    so they can share a block table; each layer keeps its own spec."""

    kv_cache_specs: tuple[tuple[str, KVCacheSpec], ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.kv_cache_specs, Mapping):
            object.__setattr__(self, "kv_cache_specs", tuple(self.kv_cache_specs.items()))

    @property
    def specs_by_layer(self) -> dict[str, KVCacheSpec]:
        return dict(self.kv_cache_specs)

    def spec_for(self, layer_name: str) -> KVCacheSpec:
        try:
            return self.specs_by_layer[layer_name]
        except KeyError:
            raise KeyError(f"layer {layer_name!r} is not in this UniformTypeKVCacheSpecs") from None

    @property
    def page_size_bytes(self) -> int:
        return sum(spec.page_size_bytes for _, spec in self.kv_cache_specs)

    @classmethod
    def from_specs(cls, specs: Mapping[str, KVCacheSpec]) -> UniformTypeKVCacheSpecs | None:
        """The uniform-type group for ``specs``, or None when the layers differ
        in spec type, block size or window (then they need separate groups)."""
        if not specs:
            return None
        values = list(specs.values())
        first = values[0]
        if not isinstance(first, AttentionSpec):
            return None
        # A window only makes another type for sliding-window specs; a full-
        # attention spec keeps its window for compute alone (as in vLLM).
        kinds = {
            (type(s), s.block_size, s.sliding_window if isinstance(s, SlidingWindowSpec) else None)
            for s in values
        }
        if len(kinds) != 1:
            return None
        return cls(block_size=first.block_size, kv_cache_specs=tuple(specs.items()))

    def describe(self) -> dict:
        return {
            "type": type(self).__name__,
            "block_size": self.block_size,
            "page_size_bytes": self.page_size_bytes,
            "layers": {name: spec.describe() for name, spec in self.kv_cache_specs},
        }


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers that share one block table (count as one layer for the KV manager)."""

    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec

    def __post_init__(self) -> None:
        if not isinstance(self.layer_names, tuple):
            object.__setattr__(self, "layer_names", tuple(self.layer_names))

    def spec_for(self, layer_name: str) -> KVCacheSpec:
        """The per-layer spec: the group's, or the layer's own entry in a
        ``UniformTypeKVCacheSpecs`` group."""
        if isinstance(self.kv_cache_spec, UniformTypeKVCacheSpecs):
            return self.kv_cache_spec.spec_for(layer_name)
        return self.kv_cache_spec
