"""Gemma 4: a text target whose later layers share KV, drafted by its assistant.

The assistant's layers are Q-only and read the cache of the target's last non-shared
layer of their type; it drafts with MTP only, and its engine model is in
``models/gemma4.py`` and ``models/gemma4_assistant.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from attngroup.reference_engine.families.family import (
    SLIDING,
    DraftAttach,
    FieldScaler,
    ModelFamily,
    SpecMethod,
    attention_layer,
)
from attngroup.reference_engine.layers import LayerDescription, Role

if TYPE_CHECKING:
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig, PretrainedConfig

TINY_PER_LAYER_INPUT = 16


def _gemma4_head_dim(config: Gemma4TextConfig, index: int) -> int:
    # Gemma 4 keeps head_dim per layer (global_head_dim on full layers).
    return config.per_layer_config[index].head_dim


def gemma4_layers(
    target: Gemma4TextConfig, draft: Gemma4AssistantConfig, tp: int, backend: str
) -> list[LayerDescription]:
    """Gemma 4 text target with KV-shared later layers, plus the assistant
    drafter whose Q-only layers read the target's cache.

    A shared layer (target or draft) reads the last non-shared target layer of
    its own type (sliding or full), as transformers' ``kv_sharing_modes`` and
    vLLM's ``_setup_gemma4_kv_sharing`` do.
    """
    layers: list[LayerDescription] = []
    last_store: dict[str, str] = {}
    first_shared = target.num_hidden_layers - target.num_kv_shared_layers
    for index, layer_type in enumerate(target.layer_types):
        name = f"model.layers.{index}.self_attn.attn"
        sliding = layer_type == SLIDING
        shared = index >= first_shared
        layers.append(
            attention_layer(
                name,
                Role.TARGET,
                backend,
                num_heads_q=target.num_attention_heads,
                num_kv_heads=target.num_key_value_heads,
                head_size=_gemma4_head_dim(target, index),
                tp=tp,
                sm_scale=1.0,  # Gemma 4 scales q by its norm, not 1/sqrt(d)
                sliding_window=target.sliding_window if sliding else None,
                kv_sharing_target=last_store[layer_type] if shared else None,
            )
        )
        if not shared:
            last_store[layer_type] = name
    text = draft.text_config
    for index, layer_type in enumerate(text.layer_types):
        sliding = layer_type == SLIDING
        layers.append(
            attention_layer(
                f"draft_model.layers.{index}.self_attn.attn",
                Role.DRAFT,
                backend,
                num_heads_q=text.num_attention_heads,
                num_kv_heads=target.num_key_value_heads,
                head_size=_gemma4_head_dim(text, index),
                tp=tp,
                sm_scale=1.0,
                sliding_window=target.sliding_window if sliding else None,
                kv_sharing_target=last_store[layer_type],
            )
        )
    return layers


def unsupported_gemma4_fields(
    config: PretrainedConfig, raw: Mapping[str, Any]
) -> Iterator[tuple[str, str]]:
    if getattr(config, "enable_moe_block", False):
        yield "enable_moe_block", "Gemma 4 MoE layers are not implemented"


def gemma4_head_dim(config: PretrainedConfig, fields: Mapping[str, Any]) -> int | None:
    """Only a head size the file states: per-layer sizes (``global_head_dim``) stay the config's."""
    return fields.get("head_dim")


def scale_per_layer_inputs(scaler: FieldScaler) -> None:
    if scaler.fields.get("hidden_size_per_layer_input"):
        scaler.set("hidden_size_per_layer_input", TINY_PER_LAYER_INPUT)
    if scaler.fields.get("vocab_size_per_layer_input"):  # the same tokens, the tiny vocabulary
        scaler.set("vocab_size_per_layer_input", scaler.fields["vocab_size"])


GEMMA4 = ModelFamily(
    name="gemma4",
    target_types=("gemma4", "gemma4_text"),
    draft_types=("gemma4_assistant",),
    describe_layers=gemma4_layers,
    builder="attngroup.reference_engine.models.gemma4_assistant:build_gemma4_pair",
    spec_methods=(SpecMethod.MTP,),
    draft_attach=DraftAttach.SHARED_LAST_OF_TYPE,
    unsupported=unsupported_gemma4_fields,
    tiny_head_dim=gemma4_head_dim,
    scale_extra=scale_per_layer_inputs,
)
