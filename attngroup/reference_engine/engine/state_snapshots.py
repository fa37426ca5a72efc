"""Rolling state layers (Qwen3-Next's linear attention) back after rejected drafts.

State layers fold every token they see into the request's state, rejected
verify tokens too. Before a verify chunk (logits="all") the runner saves the
request's state slots here; once it learns how many tokens were valid (the
next chunk's ``start_position``, or ``len(token_ids) - 1`` in ``propose``) it
restores them and replays the accepted prefix of that chunk (one extra target
pass, logits "none"). Attention KV needs none of this: rejected positions are
simply overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from attngroup.reference_engine.engine.step import ScheduledChunk


@dataclass(frozen=True)
class _Snapshot:
    chunk: ScheduledChunk  # the verify chunk the state was saved before
    states: dict[str, tuple[int, tuple[torch.Tensor, ...]]]  # layer -> (slot, its tensors)


class StateSnapshots:
    """Per request, the state slots saved before its latest verify chunk."""

    def __init__(
        self,
        state_caches: Mapping[str, tuple[torch.Tensor, ...]],
        group_of_layer: Mapping[str, int],
    ) -> None:
        self._caches = state_caches
        self._group_of_layer = group_of_layer
        self._saved: dict[str, _Snapshot] = {}

    def save(self, chunks: Sequence[ScheduledChunk]) -> None:
        """Before a target pass: keep the state slots of every verify chunk's request."""
        if not self._caches:
            return
        for chunk in chunks:
            if chunk.logits != "all":
                continue
            states = {}
            for name, caches in self._caches.items():
                slot = chunk.block_ids[self._group_of_layer[name]][0]
                states[name] = (slot, tuple(cache[slot].clone() for cache in caches))
            self._saved[chunk.request_id] = _Snapshot(chunk, states)

    def restore(
        self, request_id: str, num_valid: int, block_ids: tuple[tuple[int, ...], ...]
    ) -> ScheduledChunk | None:
        """Put back the request's state from before its verify chunk when fewer
        than all of that chunk's tokens were valid; the chunk that replays the
        valid ones (the runner runs it), or None when nothing was rejected."""
        snapshot = self._saved.pop(request_id, None)
        if snapshot is None:
            return None
        start, token_ids = snapshot.chunk.start_position, snapshot.chunk.token_ids
        if num_valid >= start + len(token_ids):
            return None
        if num_valid <= start:
            raise RuntimeError(
                f"request {request_id}: {num_valid} valid tokens, but its last verify chunk started "
                f"at position {start} (its first token is always accepted)"
            )
        for name, (slot, tensors) in snapshot.states.items():
            for cache, tensor in zip(self._caches[name], tensors, strict=True):
                cache[slot] = tensor
        return ScheduledChunk(request_id, token_ids[: num_valid - start], start, block_ids, "none")

    def remove(self, request_id: str) -> None:
        self._saved.pop(request_id, None)
