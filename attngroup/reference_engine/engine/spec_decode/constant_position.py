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

from collections.abc import Callable, Sequence
from typing import Any

import torch

from attngroup.reference_engine.engine.spec_decode.drafter import Drafter
from attngroup.reference_engine.engine.step import ProposeRequest
from attngroup.reference_engine.engine.step_rows import StepRows

#: The one pass the k steps share, and the post-projected draft state it feeds forward.
AssistantFeedback = tuple[Callable[..., Any], torch.Tensor]


class ConstantPositionDrafter(Drafter[AssistantFeedback]):
    """Keeps no state of its own: it reads the target's KV and hidden states."""

    def roll_back(self, request_id: str, num_valid_tokens: int) -> None:
        """Nothing to roll back: every call reads only what the target validly cached."""

    def remove(self, request_id: str) -> None:
        """Nothing kept per request."""

    def _first_pass(
        self, requests: Sequence[ProposeRequest]
    ) -> tuple[torch.Tensor, AssistantFeedback]:
        """Step 0 of k at RoPE position L - 1 over the target's cache at 0 .. L - 2, on the
        one metadata build every step shares."""
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
        return self._decode_step(requests, 0, rows.token_ids, (step_pass, hidden))

    def _decode_step(
        self,
        requests: Sequence[ProposeRequest],
        step: int,
        token_ids: torch.Tensor,
        feedback: AssistantFeedback,
    ) -> tuple[torch.Tensor, AssistantFeedback]:
        """The same pass again, fed the draft state of the step before."""
        step_pass, hidden = feedback
        normed, hidden = step_pass(token_ids.to(self.inputs.device), hidden)
        return normed, (step_pass, hidden)
