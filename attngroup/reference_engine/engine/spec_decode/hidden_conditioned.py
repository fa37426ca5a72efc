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

from attngroup.reference_engine.engine.spec_decode.drafter import OwnKVDrafter
from attngroup.reference_engine.engine.step import ProposeRequest
from attngroup.reference_engine.engine.step_rows import StepRows


class HiddenConditionedDrafter(OwnKVDrafter[torch.Tensor]):
    """Feeds forward the draft's last-layer output before its final norm."""

    entry_lag = 1

    def _first_pass(self, requests: Sequence[ProposeRequest]) -> tuple[torch.Tensor, torch.Tensor]:
        """Catch up the entries up to L - 2, each fed the target's hidden state."""
        rows, starts = self._catch_up_rows(requests)
        target_hidden = torch.cat(
            [
                self.inputs.target_hidden.read(r.request_id, start, len(r.token_ids) - 1)
                for r, start in zip(requests, starts, strict=True)
            ]
        )
        normed, feedback = self.inputs.model(
            rows.token_ids.to(self.inputs.device), target_hidden, self.inputs.forward_context(rows)
        )
        last = rows.last_rows
        return normed[last], feedback[last]

    def _decode_step(
        self,
        requests: Sequence[ProposeRequest],
        step: int,
        token_ids: torch.Tensor,
        feedback: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode at position L - 2 + step, fed the draft's own output of the step before."""
        rows = StepRows.decode(requests, token_ids, [len(r.token_ids) - 2 + step for r in requests])
        step_pass = self.inputs.decode_pass(rows)
        normed, feedback = step_pass(rows.token_ids.to(self.inputs.device), feedback)
        return normed, feedback
