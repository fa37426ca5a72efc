"""Drafting with a separate, smaller LM (``DraftKind.DRAFT_MODEL``).

The draft has its own KV cache and is fed tokens only: a call runs the tokens
its cache has not seen (the prompt on the first call), positions
``seen .. L-1`` of the request's L tokens, then k - 1 decode steps at
positions L .. L + k - 2, each fed the token the step before drafted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attngroup.reference_engine.engine.spec_decode.drafter import OwnKVDrafter
from attngroup.reference_engine.engine.step import ProposeRequest
from attngroup.reference_engine.engine.step_rows import StepRows


class DraftModelDrafter(OwnKVDrafter[None]):
    """Feeds nothing forward but the drafted tokens."""

    entry_lag = 0

    def _first_pass(self, requests: Sequence[ProposeRequest]) -> tuple[torch.Tensor, None]:
        """Catch the draft's cache up on the tokens it has not seen."""
        rows, _ = self._catch_up_rows(requests)
        hidden = self.inputs.model(
            rows.token_ids.to(self.inputs.device), self.inputs.forward_context(rows)
        )
        return hidden[rows.last_rows], None

    def _decode_step(
        self, requests: Sequence[ProposeRequest], step: int, token_ids: torch.Tensor, feedback: None
    ) -> tuple[torch.Tensor, None]:
        """Decode at position L - 1 + step."""
        rows = StepRows.decode(requests, token_ids, [len(r.token_ids) - 1 + step for r in requests])
        return self.inputs.decode_pass(rows)(rows.token_ids.to(self.inputs.device)), None
