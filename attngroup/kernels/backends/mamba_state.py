"""A state-space (Mamba-like) layer backend: gated linear attention over a
per-request recurrent state, kept in the paged cache one state per request.

It exists so hybrid pairs (Qwen3-Next style) have real non-attention layers
whose cache groups, builders and per-step metadata go through the same
machinery as attention. Its key's ``num_heads_q`` is 0, as in vLLM. A state
layer calls ``gated_linear_attention`` itself, so the backend binds no
implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attngroup.kernels.backend import StateBackend, StateMetadataBuilder


@dataclass(frozen=True)
class MambaStateMetadata:
    query_start_loc: torch.Tensor  # [num_reqs + 1]
    state_indices: torch.Tensor  # [num_reqs]: the cache slot holding each request's state
    has_initial_state: torch.Tensor  # [num_reqs] bool: False at a request's first chunk


class MambaStateMetadataBuilder(StateMetadataBuilder):
    """Each request's state lives in the first block of its block-table row."""

    def build(self, common: Any) -> MambaStateMetadata:
        query_lens = common.query_start_loc[1:] - common.query_start_loc[:-1]
        num_reqs = query_lens.shape[0]
        return MambaStateMetadata(
            query_start_loc=common.query_start_loc,
            state_indices=common.block_table[:num_reqs, 0].to(torch.long),
            has_initial_state=common.seq_lens[:num_reqs] > query_lens,
        )


def gated_linear_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    gate: torch.Tensor,
    state_cache: torch.Tensor,
    metadata: MambaStateMetadata,
) -> torch.Tensor:
    """out_t = q_t S_t with S_t = g_t S_{t-1} + k_t^T v_t, per request and head.

    query/key [tokens, heads, d_k], value [tokens, heads, d_v], gate [tokens, heads]
    in (0, 1); state_cache [slots, heads, d_k, d_v] is read at each request's
    slot (zeros for a first chunk) and updated in place.
    """
    out = torch.empty(value.shape, dtype=value.dtype, device=value.device)
    starts = metadata.query_start_loc.tolist()
    for req, slot in enumerate(metadata.state_indices.tolist()):
        state = state_cache[slot].float() if bool(metadata.has_initial_state[req]) else None
        if state is None:
            state = torch.zeros(state_cache.shape[1:], dtype=torch.float32, device=value.device)
        for t in range(starts[req], starts[req + 1]):
            state = (
                gate[t].float()[:, None, None] * state
                + key[t].float()[:, :, None] * value[t].float()[:, None, :]
            )
            out[t] = torch.einsum("hk,hkv->hv", query[t].float(), state).to(out.dtype)
        state_cache[slot] = state.to(state_cache.dtype)
    return out


class MambaStateBackend(StateBackend):
    name = "mamba"

    @classmethod
    def get_builder_cls(cls) -> type[MambaStateMetadataBuilder]:
        return MambaStateMetadataBuilder
