"""What a model family answers: one frozen object per family instead of name comparisons.

A ``ModelFamily`` says which transformers configs belong to it and which drafts it takes,
how its configs become per-rank layer descriptions, which fields the engine refuses or
scales down, what its engine models do differently, and which function builds them. The
families are registered in ``attngroup.reference_engine.families`` and found there by name
or model type. Nothing here imports torch or transformers: the pair listing and config
reading load this without them, and the model builder is named by its dotted path, which
``attngroup.reference_engine.models`` imports on first use (as the backend registry does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from attngroup.reference_engine.layers import LayerDescription, LayerKind, Role, heads_per_rank

if TYPE_CHECKING:  # transformers (and torch under it) load when a config is first made
    from transformers import PretrainedConfig

SLIDING, FULL, LINEAR = "sliding_attention", "full_attention", "linear_attention"
#: RoPE variants the engine implements where a config has one ``rope_parameters``
SUPPORTED_ROPE_TYPES = ("default", "llama3")

#: (target config, draft config, TP size, backend) -> target layers, then the draft's
LayerDescriber = Callable[
    ["PretrainedConfig", "PretrainedConfig", int, str], list[LayerDescription]
]
#: (text config, its raw fields) -> (field, problem) for each field the engine lacks
UnsupportedFields = Callable[["PretrainedConfig", Mapping[str, Any]], Iterator[tuple[str, str]]]


class SpecMethod(StrEnum):
    MTP = "mtp"
    EAGLE = "eagle"
    DRAFT_MODEL = "draft_model"


class DraftAttach(StrEnum):
    """How the draft's attention gets its K/V."""

    OWN = "own"  # the draft writes its own KV-cache layers
    SHARED_LAST_OF_TYPE = (
        "shared:last-of-type"  # Q-only; reads the last non-shared target layer of its type
    )


class FieldScaler(Protocol):
    """Overrides one model's config fields and reports real -> tiny (``pairs.pair_configs``)."""

    fields: dict[str, Any]

    def set(self, name: str, value: Any) -> None: ...

    def cap(self, name: str, limit: int) -> None: ...


class UnknownFamilyError(ValueError):
    """No registered family has this name or takes this model type."""


def no_unsupported_fields(
    config: PretrainedConfig, raw: Mapping[str, Any]
) -> Iterator[tuple[str, str]]:
    return iter(())


def unsupported_rope(config: PretrainedConfig, raw: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """One ``rope_parameters`` of a type the engine lacks (named as the file spells it)."""
    rope = config.rope_parameters or {}
    if rope.get("rope_type", "default") not in SUPPORTED_ROPE_TYPES:
        spelled = "rope_parameters" if "rope_parameters" in raw else "rope_scaling"
        yield (
            f"{spelled}.rope_type",
            f"{rope.get('rope_type')!r} is not implemented (supported: {SUPPORTED_ROPE_TYPES})",
        )


def explicit_head_dim(config: PretrainedConfig, fields: Mapping[str, Any]) -> int | None:
    """The head size a config implies, to keep when its hidden size is scaled down."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def no_extra_scaling(scaler: FieldScaler) -> None:
    return None


@dataclass(frozen=True)
class ModelFamily:
    """A family of models the engine runs: the one place its differences are decided.

    ``builder`` is ``"module:function"``, a function in the family's
    ``attngroup.reference_engine.models`` module taking ``(pair, tp)`` and returning its
    ``FamilyModels``; it is imported when a pair of the family is first built.
    """

    name: str
    #: config ``model_type``s of a target of this family (a multimodal wrapper and its text model)
    target_types: tuple[str, ...]
    #: config ``model_type``s of the drafts a target of this family takes
    draft_types: tuple[str, ...]
    describe_layers: LayerDescriber = field(repr=False)
    builder: str = field(repr=False)
    spec_methods: tuple[SpecMethod, ...] = tuple(SpecMethod)
    draft_attach: DraftAttach = DraftAttach.OWN
    #: ``layer_types`` entries the engine implements for this family
    layer_types: frozenset[str] = frozenset({SLIDING, FULL})
    #: fields of this family the engine refuses, beyond those every family shares
    unsupported: UnsupportedFields = field(default=no_unsupported_fields, repr=False)
    #: the head size to keep explicit when the hidden size is scaled down
    tiny_head_dim: Callable[[PretrainedConfig, Mapping[str, Any]], int | None] = field(
        default=explicit_head_dim, repr=False
    )
    #: the family's own fields to scale down (experts, per-layer inputs)
    scale_extra: Callable[[FieldScaler], None] = field(default=no_extra_scaling, repr=False)
    #: per-head RMS norm of q and k before the rotation (Qwen3)
    qk_norm: bool = False
    #: q, k and v always biased, o never, whatever ``attention_bias`` says (Qwen2)
    qkv_bias_without_o: bool = False
    #: RMS norms scale by (1 + w), so their checkpoint weights centre on 0 (Qwen3-Next)
    zero_centered_norms: bool = False
    #: why the engine's model is not compared with transformers' (None: it is)
    parity_gap: str | None = None

    def takes_draft(self, model_type: str) -> bool:
        return model_type in self.draft_types

    def drafts_with(self, method: SpecMethod) -> bool:
        return method in self.spec_methods


def attention_layer(
    name: str,
    role: Role,
    backend: str,
    *,
    num_heads_q: int,
    num_kv_heads: int,
    head_size: int,
    tp: int,
    sm_scale: float,
    sliding_window: int | None = None,
    kv_sharing_target: str | None = None,
) -> LayerDescription:
    """One attention layer's description with the head counts of one TP rank."""
    heads_q, heads_kv = heads_per_rank(name, num_heads_q, num_kv_heads, tp)
    return LayerDescription(
        name=name,
        role=role,
        kind=LayerKind.ATTENTION,
        backend=backend,
        num_heads_q=heads_q,
        num_kv_heads=heads_kv,
        head_size=head_size,
        sliding_window=sliding_window,
        sm_scale=sm_scale,
        kv_sharing_target=kv_sharing_target,
    )
