"""What the engine and the model runner hand each other each step.

The scheduler's unit of work (``StepBatch``), the target's answer (``TargetOutput``) and the
drafting call (``ProposeInput`` -> ``DraftOutput``). Kept in its own module so the runner
(model side), the drafters and the scheduler (engine side) share one vocabulary without
importing each other.

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the scheduler reads this module without loading torch
    import torch


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


@dataclass(frozen=True)
class TargetOutput:
    """What one target step returns, in ``StepBatch.chunks`` order."""

    # Per chunk: [1, vocab] for logits="last", [len(token_ids), vocab] for "all",
    # [0, vocab] for "none"; float32.
    logits: tuple[torch.Tensor, ...]
    # Per chunk: [len(token_ids), hidden] target last hidden states (after the
    # final norm, the input of lm_head); also kept inside the runner for propose.
    hidden_states: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class ProposeRequest:
    request_id: str
    # Prompt + accepted output tokens, ending with the token the target just sampled.
    token_ids: tuple[int, ...]
    # Per KV-cache group id; must cover len(token_ids) + num_spec_tokens positions.
    block_ids: tuple[tuple[int, ...], ...]
    # 0 drafts greedily (draft_probs one-hot); > 0 samples drafts from softmax(logits / T).
    temperature: float = 0.0


@dataclass(frozen=True)
class ProposeInput:
    requests: tuple[ProposeRequest, ...]
    generator: torch.Generator | None = None  # for sampled drafts (temperature > 0)


@dataclass(frozen=True)
class DraftOutput:
    draft_token_ids: torch.Tensor  # int64 [num_requests, k]
    draft_probs: torch.Tensor  # float32 [num_requests, k, vocab]: q(x) the draft sampled from


#: Block id placed in a block table where a sliding-window group freed a block.
NULL_BLOCK_ID = 0
