"""Drafting: hand the runner every request that just sampled, attach its drafts.

The runner does the method-specific work (MTP / EAGLE layers fed with the
target's hidden states, the Gemma 4 assistant reading the target's KV, a draft
model catching its own KV up); this module owns what the engine side must get
right: which requests draft, that their blocks cover the slots the drafter
writes, and that drafts and their probabilities land on the right request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from attngroup.reference_engine.engine.block_manager import BlockManager
from attngroup.reference_engine.engine.request import Request
from attngroup.reference_engine.engine.step import DraftOutput, ProposeInput, ProposeRequest


class DraftingRunner(Protocol):
    def propose(self, batch_ctx: ProposeInput, num_spec_tokens: int) -> DraftOutput: ...


class Proposer:
    def __init__(
        self, runner: DraftingRunner, block_manager: BlockManager, num_spec_tokens: int
    ) -> None:
        if not 1 <= num_spec_tokens <= 8:
            raise ValueError(f"num_spec_tokens must be in 1..8, got {num_spec_tokens}")
        self.runner = runner
        self.block_manager = block_manager
        self.num_spec_tokens = num_spec_tokens

    def propose(self, requests: Sequence[Request], generator: torch.Generator) -> list[Request]:
        """Draft ``num_spec_tokens`` tokens for each decoding request; the ones that drafted.

        A request whose blocks cannot cover the drafter's writes skips drafting
        this step (it decodes one token next step) rather than steal blocks.
        """
        ready = [
            request
            for request in requests
            if request.is_decoding
            and self.block_manager.allocate(
                request.request_id, request.num_tokens + self.num_spec_tokens
            )
        ]
        if not ready:
            return []
        batch = ProposeInput(
            requests=tuple(
                ProposeRequest(
                    request_id=request.request_id,
                    token_ids=tuple(request.all_token_ids),
                    block_ids=self.block_manager.block_ids(request.request_id),
                    temperature=request.sampling_params.temperature,
                )
                for request in ready
            ),
            generator=generator,
        )
        output = self.runner.propose(batch, self.num_spec_tokens)
        expected = (len(ready), self.num_spec_tokens)
        if tuple(output.draft_token_ids.shape) != expected:
            raise RuntimeError(
                f"runner drafted {tuple(output.draft_token_ids.shape)} tokens, expected {expected}"
            )
        for row, request in enumerate(ready):
            request.spec_token_ids = tuple(output.draft_token_ids[row].tolist())
            request.spec_probs = output.draft_probs[row]
        return ready
