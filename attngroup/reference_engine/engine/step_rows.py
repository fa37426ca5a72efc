"""One forward pass over a batch, as the model runner and its drafters describe it.

Per request: the tokens the pass runs, its sequence and query lengths (the
attention backend's view) and its block ids; from these the runner builds the
pass's attention metadata (``ModelRunner._forward_context``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attngroup.reference_engine.engine.step import ProposeRequest


@dataclass(frozen=True)
class StepRows:
    """One forward pass over a batch: per request, the tokens run and where they sit."""

    request_ids: tuple[str, ...]
    token_ids: torch.Tensor  # int64 [num_tokens]
    seq_lens: tuple[int, ...]  # per request: context + this pass's tokens (the backend's view)
    query_lens: tuple[int, ...]
    block_ids: tuple[tuple[tuple[int, ...], ...], ...]  # per request, per KV-cache group
    # int64 [num_tokens]; None: the backend's positions (seq_len - query_len + i), which
    # the metadata computes anyway. Only the Gemma 4 assistant's constant position differs.
    rope_positions: torch.Tensor | None = None

    @property
    def last_rows(self) -> torch.Tensor:
        return torch.tensor(self.query_lens).cumsum(0) - 1

    @classmethod
    def decode(
        cls, requests: Sequence[ProposeRequest], token_ids: torch.Tensor, positions: Sequence[int]
    ) -> StepRows:
        """One token per request at ``positions`` (writes there: seq_len = position + 1)."""
        return cls(
            request_ids=tuple(r.request_id for r in requests),
            token_ids=token_ids,
            seq_lens=tuple(p + 1 for p in positions),
            query_lens=(1,) * len(requests),
            block_ids=tuple(r.block_ids for r in requests),
        )
