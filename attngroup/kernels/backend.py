"""The backend contract: what an engine hands a backend, and what it gets back.

The split follows vLLM: an attention backend class names its metadata builder and
its implementation; a builder is created once per attention group (and micro-batch)
from the group's layers and sizes its per-step state by the group's query-head
count; ``build`` turns the per-KV-cache-group ``CommonAttentionMetadata`` into
the backend's metadata; the implementation runs one layer with it.

A state backend (Mamba-like layers) names a builder only: state layers have no
query heads and no KV geometry, so its builder is made from the layers' names,
and each state layer runs its own recurrence. ``MetadataBuilder`` is what the
engine uses of a builder of either kind; the engine picks the constructor by
the backend's kind (``AttentionBackend`` or ``StateBackend``).

``kernels`` never imports the engine: layers are described to it by
``AttentionLayerParams`` and KV geometry by anything shaped like
``KVCacheGeometry`` (the engine's attention specs are).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

MIXED_HEADS_MESSAGE = (
    "All layers in one attention group must share num_heads; got {heads} for {layers}."
)


class KVCacheGeometry(Protocol):
    """What a builder needs to know of the paged KV cache it reads (read-only, so a frozen
    spec satisfies it)."""

    @property
    def block_size(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_size(self) -> int: ...
    @property
    def dtype(self) -> torch.dtype: ...


@dataclass(frozen=True)
class AttentionLayerParams:
    """One attention layer as its backend sees it (per tensor-parallel rank)."""

    name: str
    num_heads_q: int
    num_kv_heads: int
    head_size: int
    sm_scale: float
    sliding_window: int | None = None
    logits_soft_cap: float | None = None

    def __post_init__(self) -> None:
        if self.num_heads_q <= 0 or self.num_kv_heads <= 0 or self.head_size <= 0:
            raise ValueError(f"layer {self.name}: head counts and head size must be positive")
        if self.num_heads_q % self.num_kv_heads:
            raise ValueError(
                f"layer {self.name}: num_heads_q {self.num_heads_q} is not a multiple of "
                f"num_kv_heads {self.num_kv_heads}"
            )


def get_num_attention_heads_from_layers(layers: Sequence[Any]) -> int | None:
    """The query-head count shared by ``layers``; None for no layers.

    This is the strict check vLLM added in PR #42650: builders size state by
    one head count, so a group that mixes head counts must fail loudly rather
    than serve some layers with state sized for others. Layers may be
    ``AttentionLayerParams`` or anything with ``num_heads_q`` or ``num_heads``
    and ``name``.
    """
    if not layers:
        return None
    # A set built in layer order prints exactly as vLLM's message does ({8, 4}).
    heads = {_num_heads(layer) for layer in layers}
    if len(heads) != 1:
        names = [_layer_name(layer) for layer in layers]
        raise AssertionError(MIXED_HEADS_MESSAGE.format(heads=heads, layers=names))
    return heads.pop()


def _num_heads(layer: Any) -> int:
    return layer.num_heads_q if hasattr(layer, "num_heads_q") else layer.num_heads


def _layer_name(layer: Any) -> str:
    return getattr(layer, "name", repr(layer))


class MetadataBuilder(ABC):
    """What the engine uses of every metadata builder, attention or state: the
    layers it serves, the query-head count it sized its state by (0 for state
    layers), its device and ``build``. The constructor is each kind's own, since
    what a builder is made from differs by kind."""

    layer_names: tuple[str, ...]
    num_heads_q: int
    device: torch.device

    @abstractmethod
    def build(self, common: Any) -> Any:
        """Backend metadata for one step from the KV-cache group's common metadata."""


class AttentionMetadataBuilder(MetadataBuilder):
    """Builds a backend's per-step metadata for one attention group.

    ``num_heads_q`` comes from the group's layers through the strict check.
    ``strict=False`` exists only so the hazard suite can reproduce what an
    engine without the check does: then the builder serves every layer with
    state sized for ``num_heads_q_override`` (or the first layer's count).
    """

    def __init__(
        self,
        kv_cache_spec: KVCacheGeometry,
        layers: Sequence[AttentionLayerParams],
        device: torch.device,
        *,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        max_query_len: int = 9,
        strict: bool = True,
        num_heads_q_override: int | None = None,
    ) -> None:
        if not layers:
            raise ValueError(f"{type(self).__name__} needs at least one layer")
        self.kv_cache_spec = kv_cache_spec
        self.layers = tuple(layers)
        self.layer_names = tuple(layer.name for layer in layers)
        self.device = torch.device(device)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_query_len = max_query_len
        if strict:
            if num_heads_q_override is not None:
                raise ValueError("num_heads_q_override is only for strict=False (the hazard suite)")
            num_heads_q = get_num_attention_heads_from_layers(self.layers)
        else:
            num_heads_q = num_heads_q_override or self.layers[0].num_heads_q
        assert num_heads_q is not None
        self.num_heads_q: int = num_heads_q
        self.num_heads_kv: int = kv_cache_spec.num_kv_heads
        self.head_size: int = kv_cache_spec.head_size


class StateMetadataBuilder(MetadataBuilder):
    """Builds a state backend's per-step metadata for one group of state layers.

    Made from the layers' names alone: state layers have no query heads and no
    KV geometry, so there is nothing to check or size by them.
    """

    num_heads_q = 0

    def __init__(self, layer_names: Sequence[str], device: torch.device) -> None:
        self.layer_names = tuple(layer_names)
        self.device = torch.device(device)


class AttentionImpl(ABC):
    """Runs one attention layer over the paged KV cache."""

    def __init__(self, layer: AttentionLayerParams) -> None:
        self.layer = layer

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: Any,
        output: torch.Tensor,
    ) -> torch.Tensor:
        """Attention for ``query`` [tokens, num_heads_q, head_size] into ``output``."""


class Backend(ABC):
    """What every backend has, attention or state: a name and its identity in group keys."""

    name: ClassVar[str]

    @classmethod
    def full_cls_name(cls) -> str:
        """The backend's identity in attention-group keys: module and
        qualified name, so dynamically made subclasses deduplicate."""
        return f"{cls.__module__}.{cls.__qualname__}"


class AttentionBackend(Backend):
    """An attention backend: its builder, implementation and what it supports."""

    supported_head_sizes: ClassVar[tuple[int, ...]] = (64, 128, 256, 512)
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (
        torch.float32,
        torch.float16,
        torch.bfloat16,
    )
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64)

    @classmethod
    @abstractmethod
    def get_builder_cls(cls) -> type[AttentionMetadataBuilder]: ...

    @classmethod
    @abstractmethod
    def get_impl_cls(cls) -> type[AttentionImpl]: ...

    @classmethod
    def is_available(cls, device: torch.device | str) -> bool:
        return True

    @classmethod
    def unsupported_reason(
        cls, head_size: int, dtype: torch.dtype, block_size: int, device: torch.device | str
    ) -> str | None:
        """Why this backend cannot run the configuration, or None when it can."""
        if not cls.is_available(device):
            return f"{cls.name} is not available on {device}"
        if head_size not in cls.supported_head_sizes:
            return f"{cls.name} does not support head size {head_size}"
        if dtype not in cls.supported_dtypes:
            return f"{cls.name} does not support {dtype}"
        if block_size not in cls.supported_block_sizes:
            return f"{cls.name} does not support block size {block_size}"
        return None


class StateBackend(Backend):
    """A state-space backend: a builder and nothing to bind. Its layers run their own
    recurrence on the metadata (as vLLM's Mamba layers do), so it has no implementation."""

    @classmethod
    @abstractmethod
    def get_builder_cls(cls) -> type[StateMetadataBuilder]: ...
