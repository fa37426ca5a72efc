"""Pieces every model family shares: norms, rotary embeddings, the MLP, and the
paged attention layer that runs through the attention backends.

Attention never runs in the models themselves: ``PagedAttention`` writes the new
keys and values into the paged cache with ``attngroup.kernels.ops.kv_cache_write`` (unless the
layer reads another layer's cache) and calls its attention group's backend
implementation with the metadata that group's builder built this step.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from attngroup.kernels.backend import AttentionImpl
from attngroup.kernels.ops.kv_cache_write import write_kv_cache
from attngroup.reference_engine.families import family_for
from attngroup.reference_engine.models.parallel import (
    COLUMN,
    ROW,
    SINGLE,
    TensorParallel,
    kv_column,
)

ACTIVATIONS = {
    "silu": nn.functional.silu,
    "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
}


def activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unsupported activation {name!r}; known: {sorted(ACTIVATIONS)}") from None


@dataclass
class ForwardContext:
    """What one forward pass of a model needs besides its inputs.

    ``positions`` are the rotary positions of the tokens (the Gemma 4 assistant's
    constant draft position differs from the backend's causal view, so they are
    kept apart from the metadata). Attention metadata, caches and slot mappings
    are per layer name; a KV-sharing layer's caches are its target's tensors.
    """

    positions: torch.Tensor  # int64 [num_tokens]
    attn_metadata: Mapping[str, Any]
    kv_caches: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
    slot_mappings: Mapping[str, torch.Tensor]
    state_caches: Mapping[str, tuple[torch.Tensor, ...]] = field(default_factory=dict)
    # cos/sin of ``positions`` per (frequency set, dtype), made once per forward by the
    # decoder stack for all its layers (``with_rotary_tables``)
    rotary_tables: Mapping[RotaryKey, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict
    )


class RMSNorm(nn.Module):
    """RMS norm computed in float32. ``zero_centered`` scales by (1 + w)
    (Qwen3-Next); ``with_scale=False`` has no weight (Gemma 4's v_norm)."""

    def __init__(
        self, dim: int, eps: float, *, zero_centered: bool = False, with_scale: bool = True
    ) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        if with_scale:
            init = torch.zeros(dim) if zero_centered else torch.ones(dim)
            self.weight = nn.Parameter(init)
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused kernel on CUDA (torch's rms_norm), not a chain of small ones: a decode
        # step runs several norms per layer, and each launch costs more than its work.
        scale = None
        if self.weight is not None:
            scale = self.weight.float()
            scale = 1.0 + scale if self.zero_centered else scale
        return nn.functional.rms_norm(x.float(), (x.shape[-1],), scale, self.eps).type_as(x)


def default_inv_freq(theta: float, rotary_dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))


def proportional_inv_freq(
    theta: float, head_dim: int, partial_rotary_factor: float
) -> torch.Tensor:
    """Gemma 4's "proportional" RoPE: frequencies of the full head size for the
    first ``partial * head_dim / 2`` angles, zero (no rotation) for the rest."""
    rope_angles = int(partial_rotary_factor * head_dim // 2)
    rotated = 1.0 / (theta ** (torch.arange(0, 2 * rope_angles, 2, dtype=torch.float) / head_dim))
    return torch.cat([rotated, torch.zeros(head_dim // 2 - rope_angles)])


def llama3_inv_freq(theta: float, rotary_dim: int, rope: dict) -> torch.Tensor:
    """Llama 3.1's "llama3" RoPE: low frequencies divided by ``factor``, high
    ones kept, the band between interpolated (transformers' ``_compute_llama3_parameters``)."""
    inv_freq = default_inv_freq(theta, rotary_dim)
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    context = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """NeoX-style rotation of the first ``rotary_dim`` dims of each head.

    The cos/sin tables depend only on the positions and the frequencies, so a decoder
    stack makes them once per forward for all its layers (``with_rotary_tables``) and a
    layer only applies them: three kernels per rotation instead of about thirteen, which
    matters when a captured decode step's launches cost more than their work. The
    frequencies are kept signed, ``[-f, f]``: cos is even, and sin's sign on the first
    half is rotate_half's, so the rotation is ``x * cos + roll(x, rotary_dim / 2) * sin``.
    """

    signed_freq: torch.Tensor  # a non-persistent buffer (registered in __init__)

    def __init__(self, inv_freq: torch.Tensor) -> None:
        super().__init__()
        self.rotary_dim = 2 * inv_freq.shape[0]
        self.frequencies = tuple(inv_freq.tolist())
        # The index of its frequency set in the stack that shares tables (``distinct_rotaries``):
        # a cheap key on the per-layer path, where hashing the frequencies would not be.
        self.table_key: int | None = None
        self.register_buffer("signed_freq", torch.cat([-inv_freq, inv_freq]), persistent=False)

    def tables(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [tokens, 1, rotary_dim] of ``positions`` [tokens]."""
        angles = positions[:, None].float() * self.signed_freq.float()[None, :]
        return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x [tokens, heads, head_dim] at ``ctx.positions``."""
        cos, sin = ctx.rotary_tables.get((self.table_key, x.dtype)) or self.tables(
            ctx.positions, x.dtype
        )
        if self.rotary_dim == x.shape[-1]:
            return torch.addcmul(x * cos, x.roll(self.rotary_dim // 2, -1), sin)
        rotated, passed = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        rotated = torch.addcmul(rotated * cos, rotated.roll(self.rotary_dim // 2, -1), sin)
        return torch.cat([rotated, passed], dim=-1)


RotaryKey = tuple[int | None, torch.dtype]


def distinct_rotaries(layers: nn.Module) -> tuple[RotaryEmbedding, ...]:
    """One rotary embedding per frequency set among ``layers``' modules; every module gets
    its set's index as ``table_key``, so equal sets share one table."""
    keys: dict[tuple[float, ...], int] = {}
    shared: list[RotaryEmbedding] = []
    for module in layers.modules():
        if isinstance(module, RotaryEmbedding):
            if module.frequencies not in keys:
                keys[module.frequencies] = len(shared)
                shared.append(module)
            module.table_key = keys[module.frequencies]
    return tuple(shared)


def with_rotary_tables(
    ctx: ForwardContext, rotaries: Iterable[RotaryEmbedding], dtype: torch.dtype
) -> ForwardContext:
    """``ctx`` with fresh cos/sin tables of its positions for each of ``rotaries``: made
    inside the forward, so a captured graph recomputes them on every replay."""
    tables = {(r.table_key, dtype): r.tables(ctx.positions, dtype) for r in rotaries}
    return replace(ctx, rotary_tables=tables)


class GatedMLP(nn.Module):
    """gate/up column-parallel, down row-parallel; ``reduce=False`` leaves the
    all-reduce to the caller (a MoE block sums partial outputs first)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: str,
        tp: TensorParallel = SINGLE,
        *,
        reduce: bool = True,
    ) -> None:
        super().__init__()
        local = tp.split(intermediate_size, "MLP columns")
        self.gate_proj = nn.Linear(hidden_size, local, bias=False)
        self.up_proj = nn.Linear(hidden_size, local, bias=False)
        self.down_proj = nn.Linear(local, hidden_size, bias=False)
        self.act = activation(act)
        self.tp, self.reduce = tp, reduce
        self.tp_shard_rules = {
            "gate_proj.weight": COLUMN,
            "up_proj.weight": COLUMN,
            "down_proj.weight": ROW,
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return self.tp.all_reduce(out) if self.reduce else out


def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
    """(q/k/v bias, o bias) as transformers builds them: a family with
    ``qkv_bias_without_o`` (Qwen2) always biases q, k and v but not o; Mistral has
    no bias (and no ``attention_bias`` field); the others follow ``attention_bias``
    on all four."""
    if family_for(config.model_type).qkv_bias_without_o:
        return True, False
    bias = bool(getattr(config, "attention_bias", False))
    return bias, bias


class AttentionProjections(nn.Module):
    """This rank's head counts and q/k/v/o projections, in one base so every
    family shards them alike (q, k, v by column, o by row; the subclass
    all-reduces o's output). ``q_per_head`` widens q_proj (Qwen3-Next's gate);
    ``with_kv=False`` omits k/v (the layer reads another layer's cache);
    ``v_is_k`` sets v_proj to None (Gemma 4's ``attention_k_eq_v``).
    """

    def __init__(
        self,
        config: PretrainedConfig,
        num_kv_heads: int,
        head_dim: int,
        tp: TensorParallel,
        *,
        q_per_head: int = 1,
        with_kv: bool = True,
        v_is_k: bool = False,
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        qkv_bias, o_bias = attention_biases(config)
        bias = qkv_bias or o_bias
        self.num_heads = tp.split(config.num_attention_heads, "query heads")
        self.num_kv_heads = tp.kv_heads(num_kv_heads)
        self.head_dim = head_dim
        if bias and tp.size > 1:
            raise ValueError("attention_bias=True is not supported with tensor parallelism")
        self.tp = tp
        kv_rule = kv_column(num_kv_heads, head_dim)
        self.tp_shard_rules = {
            "q_proj.weight": COLUMN,
            "k_proj.weight": kv_rule,
            "v_proj.weight": kv_rule,
            "o_proj.weight": ROW,
        }
        kv_width = self.num_kv_heads * head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * head_dim * q_per_head, bias=qkv_bias)
        if with_kv:
            self.k_proj = nn.Linear(hidden, kv_width, bias=qkv_bias)
            self.v_proj = None if v_is_k else nn.Linear(hidden, kv_width, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * head_dim, hidden, bias=o_bias)


class PagedAttention(nn.Module):
    """One attention layer on the paged KV cache, through its group's backend.

    ``impl`` is bound by the model runner (``bind``) once the attention groups
    exist; ``writes_kv`` is False for KV-sharing and Q-only layers, which read
    the cache their ``kv_sharing_target`` layer writes.
    """

    def __init__(self, layer_name: str, *, writes_kv: bool = True) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.writes_kv = writes_kv
        self.impl: AttentionImpl | None = None

    def bind(self, impl: AttentionImpl) -> None:
        self.impl = impl

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        ctx: ForwardContext,
    ) -> torch.Tensor:
        """query [tokens, heads_q, d]; key/value [tokens, heads_kv, d] or None."""
        if self.impl is None:
            raise RuntimeError(
                f"layer {self.layer_name}: no attention backend bound (ModelRunner binds it)"
            )
        key_cache, value_cache = ctx.kv_caches[self.layer_name]
        if self.writes_kv:
            if key is None or value is None:
                raise ValueError(f"layer {self.layer_name} writes its KV but got no key/value")
            write_kv_cache(
                key.contiguous(),
                value.contiguous(),
                key_cache,
                value_cache,
                ctx.slot_mappings[self.layer_name],
            )
        output = torch.empty_like(query)
        self.impl.forward(
            query.contiguous(), key_cache, value_cache, ctx.attn_metadata[self.layer_name], output
        )
        return output


class LanguageModel(nn.Module, ABC):
    """A pair's target or draft as the engine runs it: ``forward`` returns hidden states;
    ``compute_logits`` is a step of its own so that the engine projects only the rows it samples."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [rows, vocab] of final-normed hidden states [rows, hidden]."""


@dataclass(frozen=True)
class FamilyModels:
    """A pair's engine models as its family's builder makes them (weights not loaded);
    ``draft_skips``: prefixes of draft checkpoint tensors the engine does not load."""

    target: LanguageModel
    draft: LanguageModel
    draft_skips: tuple[str, ...] = ()


class DecoderStack(nn.Module):
    """Embedding, decoder layers and final norm (transformers' ``*Model``) of a family
    whose layers take ``(x, ctx)``; the family makes the layers and the norm."""

    def __init__(
        self, config: PretrainedConfig, layers: Iterable[nn.Module], norm: nn.Module
    ) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.rotaries = distinct_rotaries(self.layers)  # not submodules: the layers own them
        self.norm = norm

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids)

    def run_layers(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        ctx = with_rotary_tables(ctx, self.rotaries, x.dtype)
        for layer in self.layers:
            x = layer(x, ctx)
        return x


class CausalLM(LanguageModel):
    """A decoder stack (embedding, layers, final norm) under ``lm_head``, with
    transformers' ``*ForCausalLM`` names. ``forward`` returns the final-normed hidden
    states (the input of ``lm_head``)."""

    def __init__(self, stack: DecoderStack) -> None:
        super().__init__()
        self.model = stack
        self.lm_head = nn.Linear(stack.hidden_size, stack.vocab_size, bias=False)

    def forward(self, token_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.model.norm(self.model.run_layers(self.model.embed(token_ids), ctx))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


class HiddenConditionedDraft(LanguageModel):
    """An EAGLE / MTP draft: one or more decoder layers fed with the target's
    hidden state at position p and the embedding of token p + 1.

    x = fc(cat(embed(t), h)) (EAGLE) or fc(cat(norm_e(embed(t)), norm_h(h)))
    (DeepSeek / Qwen3-Next MTP, ``input_norms``); then ``stack``'s layers, its
    final norm and ``lm_head``. The draft writes its own KV. What it feeds back
    into its next step is its last layer's output before the final norm.
    """

    def __init__(
        self, stack: DecoderStack, make_norm: Callable[[int], nn.Module], *, input_norms: bool
    ) -> None:
        super().__init__()
        hidden = stack.hidden_size
        self.model = stack
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        if input_norms:
            self.pre_fc_norm_embedding = make_norm(hidden)
            self.pre_fc_norm_hidden = make_norm(hidden)
        self.input_norms = input_norms
        self.lm_head = nn.Linear(hidden, stack.vocab_size, bias=False)

    def forward(
        self, token_ids: torch.Tensor, hidden: torch.Tensor, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (final-normed hidden for the logits, feedback hidden for the next draft step)."""
        embeds = self.model.embed(token_ids)
        if self.input_norms:
            embeds, hidden = self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)
        x = self.model.run_layers(self.fc(torch.cat([embeds, hidden], dim=-1)), ctx)
        return self.model.norm(x), x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
