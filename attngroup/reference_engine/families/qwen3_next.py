"""Qwen3-Next: gated linear-attention (Mamba-like state) layers beside full attention,
MoE MLPs, and a full-attention MTP draft layer (engine model: ``models/qwen3_next.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attngroup.reference_engine.families.dense import dense_layers
from attngroup.reference_engine.families.family import (
    FULL,
    LINEAR,
    SLIDING,
    FieldScaler,
    ModelFamily,
    SpecMethod,
    attention_layer,
    unsupported_rope,
)
from attngroup.reference_engine.layers import LayerDescription, LayerKind, Role, heads_per_rank

if TYPE_CHECKING:
    from transformers import Qwen3NextConfig

TINY_EXPERTS = 4
TINY_EXPERT_WIDTH = 128


def qwen3_next_layers(
    target: Qwen3NextConfig, draft: Qwen3NextConfig, tp: int, backend: str
) -> list[LayerDescription]:
    """Qwen3-Next: gated linear-attention (Mamba-like state) layers beside
    full-attention layers, and an MTP draft layer of full attention."""
    layers: list[LayerDescription] = []
    for index, layer_type in enumerate(target.layer_types):
        if layer_type == FULL:
            layers += [
                attention_layer(
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
    return layers + dense_layers(draft, Role.DRAFT, "mtp", tp, backend)


def scale_experts(scaler: FieldScaler) -> None:
    scaler.cap("num_experts", TINY_EXPERTS)
    fields = scaler.fields
    scaler.set("num_experts_per_tok", min(fields["num_experts_per_tok"], fields["num_experts"]))
    scaler.cap("moe_intermediate_size", TINY_EXPERT_WIDTH)
    scaler.cap("shared_expert_intermediate_size", TINY_EXPERT_WIDTH)


QWEN3_NEXT = ModelFamily(
    name="qwen3_next",
    target_types=("qwen3_next",),
    draft_types=("qwen3_next",),
    describe_layers=qwen3_next_layers,
    builder="attngroup.reference_engine.models.qwen3_next:build_qwen3_next_pair",
    spec_methods=(SpecMethod.MTP,),
    layer_types=frozenset({SLIDING, FULL, LINEAR}),
    unsupported=unsupported_rope,
    scale_extra=scale_experts,
    zero_centered_norms=True,
    parity_gap="state layers are not transformers' Gated DeltaNet",
)
