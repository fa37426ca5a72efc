"""Gemma 4 text decoder: the target of the Gemma 4 MTP pairs, and the layer
stack of its assistant drafter.

Follows transformers' ``Gemma4TextModel`` / ``Gemma4ForCausalLM``:

- embeddings scaled by sqrt(hidden); per-layer inputs (PLE): a per-layer token
  embedding plus a projection of the input embedding, normed, averaged by
  1/sqrt(2), fed into each layer through a gate after the MLP;
- attention: per-head RMS norm on q and k, a scale-free RMS norm on v, scale
  1.0 (no 1/sqrt(d)); sliding layers and full layers have their own head size
  and RoPE (sliding: default RoPE; full: proportional RoPE, partial 0.25);
- KV sharing: from ``num_hidden_layers - num_kv_shared_layers`` on, a layer has
  no K/V projections and reads the cache of the last non-shared layer of its
  type (the model pair's ``kv_sharing_target``);
- four norms per layer, a ``layer_scalar``, and an optional final logit softcap.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Gemma4TextConfig

from attngroup.reference_engine.models.common import (
    AttentionProjections,
    ForwardContext,
    GatedMLP,
    LanguageModel,
    PagedAttention,
    RMSNorm,
    RotaryEmbedding,
    activation,
    default_inv_freq,
    distinct_rotaries,
    proportional_inv_freq,
    with_rotary_tables,
)
from attngroup.reference_engine.models.parallel import SINGLE, TensorParallel


def gemma4_inv_freq(config: Gemma4TextConfig, layer_type: str, head_dim: int) -> torch.Tensor:
    params = config.rope_parameters[layer_type]
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return default_inv_freq(params["rope_theta"], head_dim)
    if rope_type == "proportional":
        return proportional_inv_freq(
            params["rope_theta"], head_dim, params.get("partial_rotary_factor", 1.0)
        )
    raise ValueError(f"Gemma 4 layer type {layer_type}: rope_type {rope_type!r} is not supported")


class Gemma4Attention(AttentionProjections):
    def __init__(
        self,
        config: Gemma4TextConfig,
        index: int,
        layer_name: str,
        tp: TensorParallel,
        *,
        kv_shared: bool,
    ) -> None:
        layer_config = config.per_layer_config[index]
        layer_type = config.layer_types[index]
        super().__init__(
            config,
            layer_config.num_key_value_heads,
            layer_config.head_dim,
            tp,
            with_kv=not kv_shared,
            v_is_k=config.attention_k_eq_v and layer_type != "sliding_attention",
        )
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.kv_shared = kv_shared
        if not kv_shared:
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.v_norm = RMSNorm(self.head_dim, config.rms_norm_eps, with_scale=False)
        self.rotary = RotaryEmbedding(gemma4_inv_freq(config, layer_type, self.head_dim))
        self.attn = PagedAttention(layer_name, writes_kv=not kv_shared)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        tokens = x.shape[0]
        q = self.rotary(
            self.q_norm(self.q_proj(x).view(tokens, self.num_heads, self.head_dim)), ctx
        )
        k = v = None
        if not self.kv_shared:
            k_raw = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
            v_raw = (
                k_raw
                if self.v_proj is None
                else self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
            )
            k = self.rotary(self.k_norm(k_raw), ctx)
            v = self.v_norm(v_raw)
        return self.tp.all_reduce(self.o_proj(self.attn(q, k, v, ctx).reshape(tokens, -1)))


class Gemma4DecoderLayer(nn.Module):
    """One layer around its attention (a KV-shared one gets the double-wide MLP, if set)."""

    layer_scalar: torch.Tensor  # a buffer (registered in __init__)

    def __init__(
        self, config: Gemma4TextConfig, self_attn: Gemma4Attention, tp: TensorParallel
    ) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        double_wide = config.use_double_wide_mlp and self_attn.kv_shared
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        self.mlp = GatedMLP(
            hidden,
            config.intermediate_size * (2 if double_wide else 1),
            config.hidden_activation,
            tp,
        )
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)
        self.register_buffer("layer_scalar", torch.ones(1))
        self.per_layer_size = config.hidden_size_per_layer_input
        if self.per_layer_size:
            self.act = activation(config.hidden_activation)
            self.per_layer_input_gate = nn.Linear(hidden, self.per_layer_size, bias=False)
            self.per_layer_projection = nn.Linear(self.per_layer_size, hidden, bias=False)
            self.post_per_layer_input_norm = RMSNorm(hidden, eps)

    def forward(
        self, x: torch.Tensor, per_layer_input: torch.Tensor | None, ctx: ForwardContext
    ) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), ctx))
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        if self.per_layer_size:
            gated = self.act(self.per_layer_input_gate(x)) * per_layer_input
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return x * self.layer_scalar


class Gemma4Stack(nn.Module):
    """Layers and final norm of a Gemma 4 text model (transformers' ``Gemma4TextModel``).

    ``layer_prefix`` names the attention layers ("model" for the target,
    "draft_model" for the assistant); ``all_kv_shared`` makes every layer Q-only
    (the assistant).
    """

    def __init__(
        self,
        config: Gemma4TextConfig,
        layer_prefix: str,
        tp: TensorParallel = SINGLE,
        *,
        all_kv_shared: bool = False,
    ) -> None:
        super().__init__()
        if config.enable_moe_block:
            raise ValueError(
                "Gemma 4 with enable_moe_block=True is not supported by the reference engine"
            )
        self.config = config
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        first_shared = config.num_hidden_layers - config.num_kv_shared_layers
        self.layers = nn.ModuleList(
            Gemma4DecoderLayer(
                config,
                Gemma4Attention(
                    config,
                    i,
                    f"{layer_prefix}.layers.{i}.self_attn.attn",
                    tp,
                    kv_shared=all_kv_shared or i >= first_shared,
                ),
                tp,
            )
            for i in range(config.num_hidden_layers)
        )
        self.rotaries = distinct_rotaries(self.layers)  # not submodules: the layers own them
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def run_layers(
        self, x: torch.Tensor, per_layer_inputs: torch.Tensor | None, ctx: ForwardContext
    ) -> torch.Tensor:
        ctx = with_rotary_tables(ctx, self.rotaries, x.dtype)
        for index, layer in enumerate(self.layers):
            x = layer(x, None if per_layer_inputs is None else per_layer_inputs[:, index], ctx)
        return x


class Gemma4TextModel(Gemma4Stack):
    """The target's ``model``: embeddings (with per-layer inputs) plus the stack."""

    def __init__(
        self, config: Gemma4TextConfig, layer_prefix: str, tp: TensorParallel = SINGLE
    ) -> None:
        super().__init__(config, layer_prefix, tp)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_scale = config.hidden_size**0.5
        self.per_layer_size = config.hidden_size_per_layer_input
        if self.per_layer_size:
            num_layers = config.num_hidden_layers
            self.embed_tokens_per_layer = nn.Embedding(
                config.vocab_size_per_layer_input, num_layers * self.per_layer_size
            )
            self.per_layer_model_projection = nn.Linear(
                config.hidden_size, num_layers * self.per_layer_size, bias=False
            )
            self.per_layer_projection_norm = RMSNorm(self.per_layer_size, config.rms_norm_eps)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight
        return self.embed_tokens(token_ids) * torch.tensor(self.embed_scale, dtype=weight.dtype)

    def per_layer_inputs(
        self, token_ids: torch.Tensor, embeds: torch.Tensor
    ) -> torch.Tensor | None:
        if not self.per_layer_size:
            return None
        shape = (token_ids.shape[0], len(self.layers), self.per_layer_size)
        dtype = embeds.dtype
        token_part = self.embed_tokens_per_layer(token_ids) * torch.tensor(
            self.per_layer_size**0.5, dtype=dtype
        )
        projected = self.per_layer_model_projection(embeds) * self.hidden_size**-0.5
        projected = self.per_layer_projection_norm(projected.reshape(shape))
        return (projected + token_part.reshape(shape)) * 2.0**-0.5

    def forward(self, token_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        embeds = self.embed(token_ids)
        return self.norm(self.run_layers(embeds, self.per_layer_inputs(token_ids, embeds), ctx))


class Gemma4ForCausalLM(LanguageModel):
    def __init__(
        self, config: Gemma4TextConfig, layer_prefix: str = "model", tp: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        self.model = Gemma4TextModel(config, layer_prefix, tp)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.final_logit_softcapping = config.final_logit_softcapping

    def forward(self, token_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.model(token_ids, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.final_logit_softcapping is not None:
            cap = self.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits.float()
