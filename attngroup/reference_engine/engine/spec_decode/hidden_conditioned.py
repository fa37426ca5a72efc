"""Drafting with EAGLE / MTP layers (``DraftKind.HIDDEN_CONDITIONED``).

The draft layers have their own KV cache. Entry p is (the target's hidden
state at p, token p + 1) at position p; a call runs the entries not yet run up
to p = L - 2 of the request's L tokens, then k - 1 steps at positions
L - 1 .. L + k - 3, each fed the draft's own last-layer output (before its
final norm) and the token the step before drafted.
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


class HiddenConditionedDrafter(OwnKVDrafter):
    entry_lag = 1

    def propose(
        self,
        requests: Sequence[ProposeRequest],
        num_spec_tokens: int,
        generator: torch.Generator | None,
    ) -> DraftSteps:
        """Catch up entries up to L - 2, then k - 1 steps fed with the draft's own hidden output."""
        draft, device = self.inputs.model, self.inputs.device
        forward_context = self.inputs.forward_context
        lengths = [len(r.token_ids) for r in requests]
        rows, starts = self._catch_up_rows(requests)
        target_hidden = torch.cat(
            [
                self.inputs.target_hidden.read(r.request_id, s, n - 1)
                for r, s, n in zip(requests, starts, lengths, strict=True)
            ]
        )
        normed, feedback = draft(rows.token_ids.to(device), target_hidden, forward_context(rows))
        last = rows.last_rows
        token, prob = sample_drafts(draft.compute_logits(normed[last]), requests, generator)
        tokens, probs, feedback = [token], [prob], feedback[last]
        for step in range(1, num_spec_tokens):
            rows = StepRows.decode(requests, tokens[-1], [n - 2 + step for n in lengths])
            step_pass = self.inputs.decode_pass(rows)
            normed, feedback = step_pass(rows.token_ids.to(device), feedback)
            token, prob = sample_drafts(draft.compute_logits(normed), requests, generator)
            tokens.append(token)
            probs.append(prob)
        return tokens, probs
