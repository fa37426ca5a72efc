"""The unit of work the scheduler hands the model runner each engine step.

Kept in its own module so the runner (model side) and the scheduler (engine side) share one
vocabulary without importing each other.

Contract between the scheduler (H) and the model runner (G):

- ``block_ids[g]`` covers at least ``start_position + len(token_ids)`` tokens of KV-cache
  group ``g``; with speculative decoding it also covers ``num_spec_tokens`` lookahead slots,
  so a drafter that writes its own KV after the verify step finds them allocated. A state
  (Mamba-like) group gives each request one real block, its state slot, first in its table
  (the rest of that table is ``NULL_BLOCK_ID`` padding to the usual length). Blocks of a
  sliding-window group that fell out of the window are replaced by ``NULL_BLOCK_ID``
  (never read: they lie outside every query's window).
- Rollback after rejection: a verify chunk writes KV for all its 1 + k positions; when only
  ``a`` drafts are accepted, the request's next chunk starts at ``start + 1 + a``, i.e. below
  the previous chunk's end. Attention KV at the rejected positions is simply overwritten;
  a state layer must restore the state it had after position ``start + a`` (the runner
  knows the previous chunk, so it can keep per-position states of verify chunks).
- A request absent from a step keeps its caches; a preempted request comes back with
  ``start_position`` 0 and fresh blocks (recompute).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduledChunk:
    """One request's slice of a step: a prefill chunk, one decode token, or 1+k verify tokens."""

    request_id: str
    token_ids: tuple[int, ...]
    # Tokens of this request already in the (target) KV cache before this chunk runs.
    start_position: int
    # Per KV-cache group id: the request's blocks, covering start_position + len(token_ids) tokens.
    block_ids: tuple[tuple[int, ...], ...]
    # "last" (prefill chunk end / decode), "all" (verify: every position) or "none".
    logits: str


@dataclass(frozen=True)
class StepBatch:
    chunks: tuple[ScheduledChunk, ...]


#: Block id placed in a block table where a sliding-window group freed a block.
NULL_BLOCK_ID = 0
