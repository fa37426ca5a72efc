"""Drafting with the Gemma 4 MTP assistant (``DraftKind.CONSTANT_POSITION``).

Q-only, no KV writes. Each of the k steps has one query per request at the
constant RoPE position L - 1 (transformers' candidate generator:
``position_ids = input_ids.shape[1] - 1``) attending over the target's cache at
positions 0 .. L - 2, i.e. everything the target has validly cached and
nothing of rejected drafts (the backend sees seq_len = L - 1, query_len = 1;
sliding layers: the last ``sliding_window`` of those positions, as vLLM's
draft layer with the target layer's window; transformers' bidirectional
sliding mask admits one key more, and its candidate generator also lets the
query see the KV of a rejected draft at position L - 1: we do neither).
Metadata is built once for the k steps (vLLM's constant draft positions).
Input: target embedding of the last token + target hidden state at L - 2,
then the post-projected draft state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attngroup.reference_engine.engine.spec_decode.drafter import (
    DraftInputs,
    DraftSteps,
    sample_drafts,
)
from attngroup.reference_engine.engine.step import ProposeRequest
from attngroup.reference_engine.engine.step_rows import StepRows


class ConstantPositionDrafter:
    """Keeps no state of its own: it reads the target's KV and hidden states."""

    def __init__(self, inputs: DraftInputs) -> None:
        self.inputs = inputs

    def roll_back(self, request_id: str, num_valid_tokens: int) -> None:
        """Nothing to roll back: every call reads only what the target validly cached."""

    def remove(self, request_id: str) -> None:
        """Nothing kept per request."""

    def propose(
        self,
        requests: Sequence[ProposeRequest],
        num_spec_tokens: int,
        generator: torch.Generator | None,
    ) -> DraftSteps:
        """k steps at RoPE position L - 1 over the target's cache at 0 .. L - 2, one metadata build."""
        draft = self.inputs.model
        lengths = [len(r.token_ids) for r in requests]
        rows = StepRows(
            request_ids=tuple(r.request_id for r in requests),
            token_ids=torch.tensor([r.token_ids[-1] for r in requests]),
            rope_positions=torch.tensor([n - 1 for n in lengths]),
            seq_lens=tuple(n - 1 for n in lengths),
            query_lens=(1,) * len(requests),
            block_ids=tuple(r.block_ids for r in requests),
        )
        step_pass = self.inputs.decode_pass(rows)
        hidden = torch.cat(
            [
                self.inputs.target_hidden.read(r.request_id, n - 2, n - 1)
                for r, n in zip(requests, lengths, strict=True)
            ]
        )
        token_ids = rows.token_ids.to(self.inputs.device)
        tokens, probs = [], []
        for _ in range(num_spec_tokens):
            normed, hidden = step_pass(token_ids, hidden)
            token, prob = sample_drafts(draft.compute_logits(normed), requests, generator)
            tokens.append(token)
            probs.append(prob)
            token_ids = token.to(self.inputs.device)
        return tokens, probs
