"""The dense Llama-style families: Llama, Mistral, Qwen2, Qwen3.

They share one layer describer and one engine model (``models/llama.py``) and differ only
in attention quirks: Qwen3 norms q and k per head, Qwen2 biases q, k and v but not o. A
target of any of them takes a draft of any of them (a draft model, an EAGLE layer or an
MTP layer, each with its own KV-cache layers).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from attngroup.reference_engine.families.family import (
    FULL,
    SLIDING,
    ModelFamily,
    attention_layer,
    unsupported_rope,
)
from attngroup.reference_engine.layers import LayerDescription, Role

if TYPE_CHECKING:
    from transformers import PretrainedConfig

DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
BUILDER = "attngroup.reference_engine.models.llama:build_dense_pair"


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


def dense_layers(
    config: PretrainedConfig, role: Role, prefix: str, tp: int, backend: str
) -> list[LayerDescription]:
    """The attention layers of one dense decoder stack named under ``prefix``."""
    head_size = (
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    windows = dense_sliding_windows(config)
    return [
        attention_layer(
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


def dense_pair_layers(
    target: PretrainedConfig, draft: PretrainedConfig, tp: int, backend: str
) -> list[LayerDescription]:
    """A Llama / Qwen style target and a draft (EAGLE layer, MTP layer or a
    whole draft model) with their own KV-cache layers."""
    return dense_layers(target, Role.TARGET, "model", tp, backend) + dense_layers(
        draft, Role.DRAFT, "draft_model", tp, backend
    )


def unsupported_dense_fields(
    config: PretrainedConfig, raw: Mapping[str, Any]
) -> Iterator[tuple[str, str]]:
    yield from unsupported_rope(config, raw)
    if getattr(config, "layer_types", None) is None:
        window = getattr(config, "sliding_window", None)
        if window is not None and raw.get("use_sliding_window") is False:
            yield "use_sliding_window", "False beside a sliding_window the model applies"


def _dense_family(
    name: str, *, qk_norm: bool = False, qkv_bias_without_o: bool = False
) -> ModelFamily:
    return ModelFamily(
        name=name,
        target_types=(name,),
        draft_types=DENSE_TYPES,
        describe_layers=dense_pair_layers,
        builder=BUILDER,
        unsupported=unsupported_dense_fields,
        qk_norm=qk_norm,
        qkv_bias_without_o=qkv_bias_without_o,
    )


LLAMA = _dense_family("llama")
MISTRAL = _dense_family("mistral")
QWEN2 = _dense_family("qwen2", qkv_bias_without_o=True)
QWEN3 = _dense_family("qwen3", qk_norm=True)
DENSE = (LLAMA, MISTRAL, QWEN2, QWEN3)
