"""A request's lifecycle: its tokens, how many of them are in the KV cache, and its state.

The scheduler reads and advances these fields; the block manager owns the blocks.
Keeping the token bookkeeping in one place makes the invariant easy to state: the
target KV cache holds exactly ``all_token_ids[:num_computed_tokens]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 is greedy; ``max_tokens`` counts generated tokens."""

    max_tokens: int = 16
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Request:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens of all_token_ids whose KV is in the target cache.
    num_computed_tokens: int = 0
    # Drafts proposed after the last step, to be verified in the next one.
    spec_token_ids: tuple[int, ...] = ()
    # Draft probabilities [k, vocab] for the random rejection sampler (None when greedy).
    spec_probs: torch.Tensor | None = None
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: the prompt is empty")

    @property
    def all_token_ids(self) -> list[int]:
        return [*self.prompt_token_ids, *self.output_token_ids]

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """``all_token_ids[start:end]`` without copying the whole sequence first."""
        num_prompt = len(self.prompt_token_ids)
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        return [
            *self.prompt_token_ids[start:end],
            *self.output_token_ids[: max(0, end - num_prompt)],
        ]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Known tokens whose KV is not in the cache yet (prompt left, or the last sample)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """Only the last sampled token is missing from the cache: drafts may follow it."""
        return self.num_uncomputed_tokens == 1 and bool(self.output_token_ids)

    @property
    def num_tokens_left(self) -> int:
        return self.sampling_params.max_tokens - len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def clear_drafts(self) -> None:
        self.spec_token_ids = ()
        self.spec_probs = None

    def append_output(self, token_ids: list[int]) -> None:
        """Append sampled tokens, cut at max_tokens."""
        self.output_token_ids.extend(token_ids[: self.num_tokens_left])
