"""Llama / Mistral / Qwen2 / Qwen3 dense decoders (targets, draft models, EAGLE and MTP layers).

Parameter names follow transformers' ``LlamaForCausalLM`` / ``Qwen3ForCausalLM``
so a state dict loads without renaming. The families differ only in attention quirks
their ``ModelFamily`` states: Qwen3's per-head RMS norm of q and k before the rotation
(``qk_norm``), Qwen2's q/k/v biases (``models.common.attention_biases``).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from attngroup.reference_engine.families import family_for
from attngroup.reference_engine.families.family import SUPPORTED_ROPE_TYPES, SpecMethod
from attngroup.reference_engine.model_pairs import ModelPair
from attngroup.reference_engine.models.common import (
    AttentionProjections,
    CausalLM,
    DecoderStack,
    FamilyModels,
    ForwardContext,
    GatedMLP,
    HiddenConditionedDraft,
    PagedAttention,
    RMSNorm,
    RotaryEmbedding,
    default_inv_freq,
    llama3_inv_freq,
)
from attngroup.reference_engine.models.parallel import SINGLE, TensorParallel


def head_dim_of(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_theta_of(config: PretrainedConfig) -> float:
    return config.rope_parameters["rope_theta"]


def rope_type_of(config: PretrainedConfig) -> str:
    return config.rope_parameters.get("rope_type", "default")


def _check_rope(config: PretrainedConfig) -> None:
    rope_type = rope_type_of(config)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"{type(config).__name__}: rope_parameters.rope_type {rope_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )


def dense_inv_freq(config: PretrainedConfig, head_dim: int) -> torch.Tensor:
    if rope_type_of(config) == "llama3":
        return llama3_inv_freq(rope_theta_of(config), head_dim, config.rope_parameters)
    return default_inv_freq(rope_theta_of(config), head_dim)


class DenseAttention(AttentionProjections):
    def __init__(
        self, config: PretrainedConfig, layer_name: str, tp: TensorParallel, *, qk_norm: bool
    ) -> None:
        super().__init__(config, config.num_key_value_heads, head_dim_of(config), tp)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(dense_inv_freq(config, self.head_dim))
        self.attn = PagedAttention(layer_name)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        tokens = x.shape[0]
        q = self.q_proj(x).view(tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        assert self.v_proj is not None  # only Gemma 4 reads its values from the keys (v_is_k)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(q, ctx), self.rotary(k, ctx)
        return self.tp.all_reduce(self.o_proj(self.attn(q, k, v, ctx).reshape(tokens, -1)))


class DenseDecoderLayer(nn.Module):
    def __init__(
        self, config: PretrainedConfig, layer_name: str, tp: TensorParallel, *, qk_norm: bool
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DenseAttention(config, layer_name, tp, qk_norm=qk_norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act, tp)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class DenseStack(DecoderStack):
    def __init__(
        self, config: PretrainedConfig, layer_prefix: str, tp: TensorParallel = SINGLE
    ) -> None:
        _check_rope(config)
        if getattr(config, "mlp_bias", False):
            raise ValueError(f"{type(config).__name__}: mlp_bias=True is not supported")
        qk_norm = family_for(config.model_type).qk_norm
        super().__init__(
            config,
            (
                DenseDecoderLayer(
                    config, f"{layer_prefix}.layers.{i}.self_attn.attn", tp, qk_norm=qk_norm
                )
                for i in range(config.num_hidden_layers)
            ),
            RMSNorm(config.hidden_size, config.rms_norm_eps),
        )


class DenseForCausalLM(CausalLM):
    """A Llama / Qwen target or draft model."""

    def __init__(
        self, config: PretrainedConfig, layer_prefix: str, tp: TensorParallel = SINGLE
    ) -> None:
        super().__init__(DenseStack(config, layer_prefix, tp))


def build_dense_draft_head(
    config: PretrainedConfig, layer_prefix: str, tp: TensorParallel = SINGLE, *, input_norms: bool
) -> HiddenConditionedDraft:
    """EAGLE (``input_norms=False``) or DeepSeek-style MTP layer(s) of a dense family."""
    return HiddenConditionedDraft(
        DenseStack(config, layer_prefix, tp),
        lambda dim: RMSNorm(dim, config.rms_norm_eps),
        input_norms=input_norms,
    )


def build_dense_pair(pair: ModelPair, tp: TensorParallel) -> FamilyModels:
    """The dense families' builder: the target, and a draft model or a draft head."""
    target = DenseForCausalLM(pair.target_config(), "model", tp)
    if pair.spec_method is SpecMethod.DRAFT_MODEL:
        return FamilyModels(target, DenseForCausalLM(pair.draft_config(), "draft_model", tp))
    draft = build_dense_draft_head(
        pair.draft_config(), "draft_model", tp, input_norms=pair.spec_method is SpecMethod.MTP
    )
    return FamilyModels(target, draft)
