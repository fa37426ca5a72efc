"""Drafting with a separate, smaller LM (``DraftKind.DRAFT_MODEL``).

The draft has its own KV cache and is fed tokens only: a call runs the tokens
its cache has not seen (the prompt on the first call), positions
``seen .. L-1`` of the request's L tokens, then k - 1 decode steps at
positions L .. L + k - 2, each fed the token the step before drafted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attngroup.reference_engine.engine.spec_decode.drafter import (
    DraftSteps,
    OwnKVDrafter,
    sample_drafts,
)
from attngroup.reference_engine.engine.step import ProposeRequest
from attngroup.reference_engine.engine.step_rows import StepRows


class DraftModelDrafter(OwnKVDrafter):
    entry_lag = 0

    def propose(
        self,
        requests: Sequence[ProposeRequest],
        num_spec_tokens: int,
        generator: torch.Generator | None,
    ) -> DraftSteps:
        """Catch the draft's cache up on the tokens it has not seen, then decode k tokens."""
        draft, device = self.inputs.model, self.inputs.device
        forward_context = self.inputs.forward_context
        lengths = [len(r.token_ids) for r in requests]
        rows, _ = self._catch_up_rows(requests)
        hidden = draft(rows.token_ids.to(device), forward_context(rows))
        token, prob = sample_drafts(
            draft.compute_logits(hidden[rows.last_rows]), requests, generator
        )
        tokens, probs = [token], [prob]
        for step in range(1, num_spec_tokens):
            rows = StepRows.decode(requests, tokens[-1], [n - 1 + step for n in lengths])
            hidden = self.inputs.decode_pass(rows)(rows.token_ids.to(device))
            token, prob = sample_drafts(draft.compute_logits(hidden), requests, generator)
            tokens.append(token)
            probs.append(prob)
        return tokens, probs
