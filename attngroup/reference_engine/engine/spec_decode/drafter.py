"""The drafter interface: what the model runner calls to draft k tokens and to
roll a drafter's state back, and what every drafter shares (the k-step loop, the
catch-up of a KV cache of its own, the draft sampling).

One drafting method per module beside this one, each giving only its passes
(``ModelRunner`` picks by ``DraftKind``):

- ``draft_model``: a separate LM with its own KV cache, fed tokens only;
- ``hidden_conditioned``: EAGLE / MTP layers with their own KV cache, fed the
  target's hidden states;
- ``constant_position``: the Gemma 4 MTP assistant, Q-only over the target's KV.

Drafts are greedy (``draft_probs`` one-hot) at temperature 0, else sampled
from softmax(logits / T) with the call's generator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from attngroup.reference_engine.engine.spec_decode.hidden_states import HiddenStateBuffer
from attngroup.reference_engine.engine.step import ProposeRequest
from attngroup.reference_engine.engine.step_rows import StepRows
from attngroup.reference_engine.models.common import ForwardContext

#: Per draft step: the tokens (int64 [num_requests]) and the distributions they
#: were drawn from (float32 [num_requests, vocab]).
DraftSteps = tuple[list[torch.Tensor], list[torch.Tensor]]
#: What a drafter's pass feeds the next decode step besides the drafted tokens (a draft
#: state, the pass itself, or nothing).
Feedback = TypeVar("Feedback")


class DraftModel(Protocol):
    """What a drafter calls of the pair's draft (a ``LanguageModel``, or a test's stand-in)."""

    __call__: Callable[..., Any]  # nn.Module's own type for calling its forward

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class DraftInputs:
    """What a drafter reads from the model runner."""

    model: DraftModel  # the pair's draft, bound to the paged KV cache
    device: torch.device
    # A pass's ForwardContext over the draft's KV-cache groups (its metadata is
    # valid until the next pass builds).
    forward_context: Callable[[StepRows], ForwardContext]
    target_hidden: HiddenStateBuffer  # the target's last hidden states, per request
    # A decode pass (one token per request) over ``rows``: returns ``step(token_ids, *extra)``,
    # which runs the draft on those inputs, from a CUDA graph where one is captured for the
    # batch (``attngroup.reference_engine.engine.cuda_graphs.graph_steps``), else eagerly on one metadata build.
    decode_pass: Callable[[StepRows], Callable[..., Any]]


class Drafter(ABC, Generic[Feedback]):
    """The k-step loop every drafter shares: a first pass drafts each request's first
    token, then each of the k - 1 decode steps drafts the next, fed the tokens the step
    before drafted and what it fed forward (``Feedback``). A drafter says only how its
    passes run and what state it keeps."""

    def __init__(self, inputs: DraftInputs) -> None:
        self.inputs = inputs

    @abstractmethod
    def roll_back(self, request_id: str, num_valid_tokens: int) -> None:
        """Before drafting: the target has validly cached the request's first
        ``num_valid_tokens`` tokens; forget draft state that lies past them."""

    @abstractmethod
    def remove(self, request_id: str) -> None:
        """Forget a finished or preempted request."""

    def propose(
        self,
        requests: Sequence[ProposeRequest],
        num_spec_tokens: int,
        generator: torch.Generator | None,
    ) -> DraftSteps:
        """Bring the draft up to date with each request's tokens, then draft
        ``num_spec_tokens`` tokens per request."""
        output, feedback = self._first_pass(requests)
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        for step in range(num_spec_tokens):
            if step > 0:  # the first token comes from the first pass
                output, feedback = self._decode_step(requests, step, tokens[-1], feedback)
            logits = self.inputs.model.compute_logits(output)
            token, prob = sample_drafts(logits, requests, generator)
            tokens.append(token)
            probs.append(prob)
        return tokens, probs

    @abstractmethod
    def _first_pass(self, requests: Sequence[ProposeRequest]) -> tuple[torch.Tensor, Feedback]:
        """Run the pass that drafts the first token: the draft's output at each request's
        last row (what ``compute_logits`` reads), and what it feeds the first decode step."""

    @abstractmethod
    def _decode_step(
        self,
        requests: Sequence[ProposeRequest],
        step: int,
        token_ids: torch.Tensor,
        feedback: Feedback,
    ) -> tuple[torch.Tensor, Feedback]:
        """Run decode step ``step`` (1 .. k - 1) on the tokens (int64 [num_requests])
        the step before drafted: the draft's output per request, and what it feeds forward."""


class OwnKVDrafter(Drafter[Feedback]):
    """Base of the drafters with a KV cache of their own: per request, how many
    leading entries of that cache hold accepted tokens. A call runs the entries
    from there on (the whole prompt on the first call); entries its decode
    steps wrote are run again next call, whatever the target accepted."""

    #: How far the entries lag the tokens: entry p holds token p (0, a draft
    #: model), or pairs the target's hidden state at p with token p + 1 (1, EAGLE / MTP).
    entry_lag = 0

    def __init__(self, inputs: DraftInputs) -> None:
        super().__init__(inputs)
        self._valid_entries: dict[str, int] = {}

    def roll_back(self, request_id: str, num_valid_tokens: int) -> None:
        valid = self._valid_entries.get(request_id, 0)
        self._valid_entries[request_id] = min(valid, num_valid_tokens - self.entry_lag)

    def remove(self, request_id: str) -> None:
        self._valid_entries.pop(request_id, None)

    def _catch_up_rows(self, requests: Sequence[ProposeRequest]) -> tuple[StepRows, list[int]]:
        """The rows that run each request's entries from its first invalid one through its
        last token (entry p holds token p + ``entry_lag``), and where each request starts.
        The entries count as valid from here on."""
        lag = self.entry_lag
        starts = [self._valid_entries[r.request_id] for r in requests]
        ends = [len(r.token_ids) - lag for r in requests]
        rows = StepRows(
            request_ids=tuple(r.request_id for r in requests),
            token_ids=torch.tensor(
                [t for r, s in zip(requests, starts, strict=True) for t in r.token_ids[s + lag :]]
            ),
            seq_lens=tuple(ends),
            query_lens=tuple(end - start for start, end in zip(starts, ends, strict=True)),
            block_ids=tuple(r.block_ids for r in requests),
        )
        for request, end in zip(requests, ends, strict=True):
            self._valid_entries[request.request_id] = end
        return rows, starts


def sample_drafts(
    logits: torch.Tensor, requests: Sequence[ProposeRequest], generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft token per request and the distribution q it was drawn from:
    one-hot of the argmax for temperature 0, softmax(logits / T) otherwise.

    Both stay on the logits' device, so the next draft step's input needs no trip
    through the host; only the sampled rows (temperature > 0) go to the host, where
    the engine's generator draws them in request order."""
    logits = logits.float()
    tokens = logits.argmax(-1)
    probs = nn.functional.one_hot(tokens, logits.shape[-1]).float()
    sampled = [row for row, request in enumerate(requests) if request.temperature > 0]
    if sampled:
        host_logits = logits[sampled].cpu()
        host_probs = torch.stack(
            [
                torch.softmax(row_logits / requests[row].temperature, dim=-1)
                for row, row_logits in zip(sampled, host_logits, strict=True)
            ]
        )
        host_tokens = torch.cat(
            [torch.multinomial(row_probs, 1, generator=generator) for row_probs in host_probs]
        )
        rows = torch.tensor(sampled, device=logits.device)
        probs[rows] = host_probs.to(logits.device)
        tokens[rows] = host_tokens.to(logits.device)
    return tokens, probs
