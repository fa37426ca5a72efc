"""Model families: a pair's transformers configs -> per-rank layer descriptions.

One function per family turns (target config, draft config, TP size, backend)
into the ``LayerDescription``s of ``ModelPair.layers()``: target layers first,
then the draft's, with the head counts of one tensor-parallel rank and the
sliding windows and KV sharing the configs give.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attngroup.reference_engine.layers import LayerDescription, LayerKind, Role, heads_per_rank

if TYPE_CHECKING:  # transformers (and torch under it) load when a config is first made
    from transformers import (
        Gemma4AssistantConfig,
        Gemma4TextConfig,
        PretrainedConfig,
        Qwen3NextConfig,
    )

#: Families whose decoders are the engine's dense Llama-style model.
DENSE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
SLIDING, FULL = "sliding_attention", "full_attention"


def _attention_layer(
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


def _gemma4_head_dim(config: Gemma4TextConfig, index: int) -> int:
    # Gemma 4 keeps head_dim per layer (global_head_dim on full layers).
    return config.per_layer_config[index].head_dim


def gemma4_layers(target: Gemma4TextConfig, draft: Gemma4AssistantConfig, tp: int, backend: str):
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
        sliding = layer_type == "sliding_attention"
        shared = index >= first_shared
        layers.append(
            _attention_layer(
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
        sliding = layer_type == "sliding_attention"
        layers.append(
            _attention_layer(
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


def dense_sliding_windows(config: PretrainedConfig) -> list[int | None]:
    """Each layer's window as transformers applies it: per ``layer_types``
    (Qwen2 / Qwen3 derive them from ``use_sliding_window`` and
    ``max_window_layers``), else ``sliding_window`` on every layer (Mistral)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return [window] * config.num_hidden_layers
    for index, layer_type in enumerate(layer_types):
        if layer_type not in (SLIDING, FULL):
            raise ValueError(
                f"{type(config).__name__}: layer_types[{index}] = {layer_type!r} is not an "
                f"attention type the engine implements ({SLIDING}, {FULL})"
            )
        if layer_type == SLIDING and window is None:
            raise ValueError(
                f"{type(config).__name__}: layer_types[{index}] is {SLIDING} but sliding_window is None"
            )
    return [window if layer_type == SLIDING else None for layer_type in layer_types]


def _dense_layers(
    config: PretrainedConfig, role: Role, prefix: str, tp: int, backend: str
) -> list[LayerDescription]:
    head_size = (
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    windows = dense_sliding_windows(config)
    return [
        _attention_layer(
            f"{prefix}.layers.{index}.self_attn.attn",
            role,
            backend,
            num_heads_q=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_size=head_size,
            tp=tp,
            sm_scale=head_size**-0.5,
            sliding_window=windows[index],
        )
        for index in range(config.num_hidden_layers)
    ]


def dense_pair_layers(target: PretrainedConfig, draft: PretrainedConfig, tp: int, backend: str):
    """A Llama / Qwen style target and a draft (EAGLE layer, MTP layer or a
    whole draft model) with their own KV-cache layers."""
    return _dense_layers(target, Role.TARGET, "model", tp, backend) + _dense_layers(
        draft, Role.DRAFT, "draft_model", tp, backend
    )


def qwen3_next_layers(target: Qwen3NextConfig, draft: Qwen3NextConfig, tp: int, backend: str):
    """Qwen3-Next: gated linear-attention (Mamba-like state) layers beside
    full-attention layers, and an MTP draft layer of full attention."""
    layers: list[LayerDescription] = []
    for index, layer_type in enumerate(target.layer_types):
        if layer_type == "full_attention":
            layers += [
                _attention_layer(
                    f"model.layers.{index}.self_attn.attn",
                    Role.TARGET,
                    backend,
                    num_heads_q=target.num_attention_heads,
                    num_kv_heads=target.num_key_value_heads,
                    head_size=target.head_dim,
                    tp=tp,
                    sm_scale=target.head_dim**-0.5,
                )
            ]
            continue
        name = f"model.layers.{index}.linear_attn"
        value_heads, key_heads = heads_per_rank(
            name, target.linear_num_value_heads, target.linear_num_key_heads, tp
        )
        conv_dim = (
            2 * key_heads * target.linear_key_head_dim + value_heads * target.linear_value_head_dim
        )
        layers.append(
            LayerDescription(
                name=name,
                role=Role.TARGET,
                kind=LayerKind.MAMBA,
                backend="mamba",
                mamba_state_shapes=(
                    (conv_dim, target.linear_conv_kernel_dim - 1),
                    (value_heads, target.linear_key_head_dim, target.linear_value_head_dim),
                ),
            )
        )
    return layers + _dense_layers(draft, Role.DRAFT, "mtp", tp, backend)


def layer_describer(family: str):
    """The function that turns a family's (target, draft) configs into layer descriptions."""
    if family == "gemma4":
        return gemma4_layers
    if family == "qwen3_next":
        return qwen3_next_layers
    if family in DENSE_FAMILIES:
        return dense_pair_layers
    raise ValueError(f"no layer description for family {family!r}")
