"""Acceptance statistics of speculative decoding, as vLLM reports them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_spec_tokens: int
    num_verifications: int = 0  # verify chunks run (one per request per step with drafts)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # accepted_per_position[j]: verifications that accepted the draft at position j.
    accepted_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_per_position = [0] * self.num_spec_tokens

    def record(self, num_drafts: int, num_accepted: int) -> None:
        if not 0 <= num_accepted <= num_drafts <= self.num_spec_tokens:
            raise ValueError(
                f"accepted {num_accepted} of {num_drafts} drafts (k={self.num_spec_tokens})"
            )
        self.num_verifications += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over proposed drafts."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification: accepted drafts plus the recovered/bonus token."""
        if not self.num_verifications:
            return 0.0
        return 1.0 + self.num_accepted_tokens / self.num_verifications
