"""Qwen3-Next style hybrid: Mamba-like state layers, gated full attention, MoE
MLPs, and a full-attention MTP layer.

Parameter names follow transformers' ``Qwen3NextForCausalLM``, so its state
dict loads as is. Full attention matches transformers (q and a sigmoid output
gate from one projection, zero-centred q/k norms, partial RoPE). The state
layers do NOT match transformers' Gated DeltaNet: they keep its projections,
causal conv and gated output norm, but the recurrence is the state backend's
gated linear attention (``attngroup.kernels.backends.mamba_state``),
``S_t = g_t S_{t-1} + (beta_t k_t)^T v_t`` with ``g_t = exp(-exp(A_log) *
softplus(a_t + dt_bias))``, without the delta rule's erase term. That is all
the hybrid pair needs (real state layers, state cache groups and builders);
HF parity is therefore not claimed for this family.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen3NextConfig

from attngroup.kernels.backends.mamba_state import gated_linear_attention
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
    activation,
    default_inv_freq,
)
from attngroup.reference_engine.models.parallel import (
    COLUMN,
    ROW,
    SINGLE,
    ShardRule,
    TensorParallel,
    segments,
)


def _norm(config: Qwen3NextConfig, dim: int) -> RMSNorm:
    return RMSNorm(dim, config.rms_norm_eps, zero_centered=True)


class GatedAttention(AttentionProjections):
    def __init__(self, config: Qwen3NextConfig, layer_name: str, tp: TensorParallel) -> None:
        # q_proj holds [query, gate] rows per head, so heads still split contiguously.
        super().__init__(config, config.num_key_value_heads, config.head_dim, tp, q_per_head=2)
        self.q_norm = _norm(config, self.head_dim)
        self.k_norm = _norm(config, self.head_dim)
        params = config.rope_parameters
        rotary_dim = int(self.head_dim * params.get("partial_rotary_factor", 1.0))
        self.rotary = RotaryEmbedding(default_inv_freq(params["rope_theta"], rotary_dim))
        self.attn = PagedAttention(layer_name)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        tokens = x.shape[0]
        query, gate = torch.chunk(
            self.q_proj(x).view(tokens, self.num_heads, 2 * self.head_dim), 2, dim=-1
        )
        q = self.rotary(self.q_norm(query), ctx)
        k = self.rotary(
            self.k_norm(self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)), ctx
        )
        assert self.v_proj is not None  # only Gemma 4 reads its values from the keys (v_is_k)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        out = self.attn(q, k, v, ctx).reshape(tokens, -1) * torch.sigmoid(gate.reshape(tokens, -1))
        return self.tp.all_reduce(self.o_proj(out))


class GatedRMSNorm(nn.Module):
    """Norm, then a SiLU gate (transformers' ``Qwen3NextRMSNormGated``)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * normed.to(x.dtype) * nn.functional.silu(gate.float())).to(x.dtype)


class StateMixer(nn.Module):
    """A Mamba-like state layer: projections, a causal depthwise conv with its
    state, and gated linear attention over a recurrent state (both states live
    in the layer's state cache, one slot per request)."""

    def __init__(self, config: Qwen3NextConfig, layer_name: str, tp: TensorParallel) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.num_v_heads = tp.split(config.linear_num_value_heads, "state value heads")
        self.num_k_heads = tp.split(config.linear_num_key_heads, "state key heads")
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.key_dim = self.head_k_dim * self.num_k_heads
        self.value_dim = self.head_v_dim * self.num_v_heads
        self.conv_kernel = config.linear_conv_kernel_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        hidden = config.hidden_size
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.conv_kernel, groups=self.conv_dim, bias=False
        )
        self.in_proj_qkvz = nn.Linear(hidden, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(hidden, 2 * self.num_v_heads, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, hidden, bias=False)
        self.act = activation(config.hidden_act)
        self.tp = tp
        full_key = config.linear_key_head_dim * config.linear_num_key_heads
        full_value = config.linear_value_head_dim * config.linear_num_value_heads
        # Projections are grouped per key head, so key heads split contiguously.
        self.tp_shard_rules = {
            "in_proj_qkvz.weight": COLUMN,
            "in_proj_ba.weight": COLUMN,
            "conv1d.weight": segments(0, (full_key, full_key, full_value)),
            "dt_bias": COLUMN,
            "A_log": COLUMN,
            "out_proj.weight": ROW,
        }

    def _split_projections(self, x: torch.Tensor):
        """transformers' ``fix_query_key_value_ordering``, on [tokens, ...]."""
        tokens, per_k = x.shape[0], self.num_v_heads // self.num_k_heads
        qkvz = self.in_proj_qkvz(x).view(tokens, self.num_k_heads, -1)
        ba = self.in_proj_ba(x).view(tokens, self.num_k_heads, -1)
        q, k, v, z = torch.split(
            qkvz,
            [self.head_k_dim, self.head_k_dim, per_k * self.head_v_dim, per_k * self.head_v_dim],
            dim=2,
        )
        b, a = torch.split(ba, [per_k, per_k], dim=2)
        return (
            q.reshape(tokens, -1),
            k.reshape(tokens, -1),
            v.reshape(tokens, -1),
            z.reshape(tokens, self.num_v_heads, self.head_v_dim),
            b.reshape(tokens, self.num_v_heads),
            a.reshape(tokens, self.num_v_heads),
        )

    def _causal_conv(self, mixed: torch.Tensor, conv_cache: torch.Tensor, metadata) -> torch.Tensor:
        """Depthwise causal conv per request, continuing from (and updating) its conv state."""
        weight = self.conv1d.weight[:, 0, :]  # [conv_dim, kernel]
        out = torch.empty_like(mixed)
        starts = metadata.query_start_loc.tolist()
        for request, slot in enumerate(metadata.state_indices.tolist()):
            rows = slice(starts[request], starts[request + 1])
            previous = (
                conv_cache[slot]
                if bool(metadata.has_initial_state[request])
                else torch.zeros_like(conv_cache[slot])
            )
            window = torch.cat([previous, mixed[rows].T], dim=1)  # [conv_dim, kernel - 1 + n]
            frames = window.unfold(1, self.conv_kernel, 1)  # [conv_dim, n, kernel]
            out[rows] = self.act(torch.einsum("cnk,ck->nc", frames, weight))
            conv_cache[slot] = window[:, window.shape[1] - (self.conv_kernel - 1) :]
        return out

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        tokens = x.shape[0]
        metadata = ctx.attn_metadata[self.layer_name]
        conv_cache, ssm_cache = ctx.state_caches[self.layer_name]
        q, k, v, z, b, a = self._split_projections(x)
        mixed = self._causal_conv(torch.cat([q, k, v], dim=-1), conv_cache, metadata)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        repeat = self.num_v_heads // self.num_k_heads
        q = nn.functional.normalize(q.view(tokens, self.num_k_heads, -1), dim=-1, eps=1e-6)
        k = nn.functional.normalize(k.view(tokens, self.num_k_heads, -1), dim=-1, eps=1e-6)
        q = q.repeat_interleave(repeat, dim=1) * self.head_k_dim**-0.5
        k = k.repeat_interleave(repeat, dim=1) * torch.sigmoid(b)[..., None]
        gate = torch.exp(
            -self.A_log.float().exp() * nn.functional.softplus(a.float() + self.dt_bias)
        )
        out = gated_linear_attention(
            q,
            k,
            v.view(tokens, self.num_v_heads, self.head_v_dim),
            gate.to(x.dtype),
            ssm_cache,
            metadata,
        )
        return self.tp.all_reduce(self.out_proj(self.norm(out, z).reshape(tokens, -1)))


class RouterGate(nn.Module):
    """The router's weight [experts, hidden], under transformers' name ``gate.weight``."""

    def __init__(self, num_experts: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))


class StackedExperts(nn.Module):
    """The routed experts' projections, stacked on a leading expert axis (transformers'
    ``experts.gate_up_proj`` and ``experts.down_proj``)."""

    def __init__(self, num_experts: int, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.zeros(num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.zeros(num_experts, hidden, inter))


class SparseMoe(nn.Module):
    """Top-k routed experts plus a gated shared expert (transformers' names)."""

    def __init__(self, config: Qwen3NextConfig, tp: TensorParallel) -> None:
        super().__init__()
        hidden, full_inter = config.hidden_size, config.moe_intermediate_size
        inter = tp.split(full_inter, "expert columns")
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = RouterGate(config.num_experts, hidden)
        self.experts = StackedExperts(config.num_experts, hidden, inter)
        self.shared_expert = GatedMLP(
            hidden, config.shared_expert_intermediate_size, config.hidden_act, tp, reduce=False
        )
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)
        self.act = activation(config.hidden_act)
        self.tp = tp
        self.tp_shard_rules = {
            "experts.gate_up_proj": segments(1, (full_inter, full_inter)),
            "experts.down_proj": ShardRule(dim=2),
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(nn.functional.linear(x, self.gate.weight), dim=-1, dtype=torch.float)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        gate_up = torch.einsum("th,teih->tei", x, self.experts.gate_up_proj[experts])
        gate, up = gate_up.chunk(2, dim=-1)
        expert_out = torch.einsum(
            "tei,tehi->teh", self.act(gate) * up, self.experts.down_proj[experts]
        )
        routed = (expert_out * weights.to(x.dtype)[..., None]).sum(dim=1)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.tp.all_reduce(routed + shared)  # both are this rank's partial sums


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(
        self, config: Qwen3NextConfig, index: int, layer_prefix: str, tp: TensorParallel
    ) -> None:
        super().__init__()
        self.is_state_layer = config.layer_types[index] == "linear_attention"
        if self.is_state_layer:
            self.linear_attn = StateMixer(config, f"{layer_prefix}.layers.{index}.linear_attn", tp)
        else:
            self.self_attn = GatedAttention(
                config, f"{layer_prefix}.layers.{index}.self_attn.attn", tp
            )
        sparse = index not in config.mlp_only_layers and config.num_experts > 0
        self.mlp: SparseMoe | GatedMLP
        if sparse and (index + 1) % config.decoder_sparse_step == 0:
            self.mlp = SparseMoe(config, tp)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act, tp)
        self.input_layernorm = _norm(config, config.hidden_size)
        self.post_attention_layernorm = _norm(config, config.hidden_size)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        mixer = self.linear_attn if self.is_state_layer else self.self_attn
        x = x + mixer(self.input_layernorm(x), ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3NextStack(DecoderStack):
    def __init__(
        self, config: Qwen3NextConfig, layer_prefix: str, tp: TensorParallel = SINGLE
    ) -> None:
        super().__init__(
            config,
            (
                Qwen3NextDecoderLayer(config, i, layer_prefix, tp)
                for i in range(config.num_hidden_layers)
            ),
            _norm(config, config.hidden_size),
        )


class Qwen3NextForCausalLM(CausalLM):
    def __init__(
        self, config: Qwen3NextConfig, layer_prefix: str = "model", tp: TensorParallel = SINGLE
    ) -> None:
        super().__init__(Qwen3NextStack(config, layer_prefix, tp))


def build_qwen3_next_mtp(
    config: Qwen3NextConfig, layer_prefix: str = "mtp", tp: TensorParallel = SINGLE
) -> HiddenConditionedDraft:
    return HiddenConditionedDraft(
        Qwen3NextStack(config, layer_prefix, tp), lambda dim: _norm(config, dim), input_norms=True
    )


def build_qwen3_next_pair(pair: ModelPair, tp: TensorParallel) -> FamilyModels:
    """The family's builder: the hybrid target and its MTP layer (named under "mtp")."""
    return FamilyModels(
        Qwen3NextForCausalLM(pair.target_config(), "model", tp),
        build_qwen3_next_mtp(pair.draft_config(), "mtp", tp),
    )
