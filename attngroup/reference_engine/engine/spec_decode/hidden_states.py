"""The target's last hidden states, kept per request for the drafters that read them.

EAGLE / MTP layers and the Gemma 4 assistant are fed the target's hidden state
at earlier positions; the runner writes every position the target runs, so the
engine never carries hidden states around.
"""

from __future__ import annotations

import torch


class HiddenStateBuffer:
    """The target's last hidden state at every position it ran, per request.

    Entries past the latest accepted position may belong to rejected verify
    tokens; readers only ask for positions below ``len(token_ids) - 1``, which
    the target has validly computed."""

    def __init__(self) -> None:
        self._states: dict[str, torch.Tensor] = {}
        self._lengths: dict[str, int] = {}

    def write(self, request_id: str, start: int, states: torch.Tensor) -> None:
        end = start + states.shape[0]
        buffer = self._states.get(request_id)
        if buffer is None or buffer.shape[0] < end:
            grown = states.new_zeros(
                max(end, 2 * (0 if buffer is None else buffer.shape[0])), states.shape[1]
            )
            if buffer is not None:
                grown[: buffer.shape[0]] = buffer
            self._states[request_id] = buffer = grown
        buffer[start:end] = states
        self._lengths[request_id] = end

    def read(self, request_id: str, start: int, end: int) -> torch.Tensor:
        """States of positions [start, end)."""
        have = self._lengths.get(request_id, 0)
        if end > have:
            raise RuntimeError(
                f"request {request_id}: the drafter needs the target's hidden states up to position "
                f"{end - 1}, but the target has run only {have} positions; run execute_target on the "
                "request's tokens before propose"
            )
        return self._states[request_id][start:end]

    def remove(self, request_id: str) -> None:
        self._states.pop(request_id, None)
        self._lengths.pop(request_id, None)
