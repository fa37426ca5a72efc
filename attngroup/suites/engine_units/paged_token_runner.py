"""A model runner whose "model" reads token ids back out of a paged cache.

It stands in for the real runner in the engine-loop unit tests because it
makes every bookkeeping mistake visible in the output: each step writes the
chunk's token ids into per-group paged caches through the block tables, and
the next token is a hash of what it reads *back through the block tables*
(the whole prefix from the full-attention group, the last ``window`` tokens
from the sliding-window group). A block handed to two requests, a
sliding-window block freed too early, a wrong start position after rejection
or preemption: each changes what is read, so the generated tokens differ from
``expected_continuation``, which hashes the true token list in plain Python.

The drafter proposes the true continuation but corrupts a draft whenever a
hash of its position says so, so verification rejects at known rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attngroup.kernels.metadata import cdiv
from attngroup.reference_engine.engine.model_runner import KVCacheGroupInfo
from attngroup.reference_engine.engine.step import (
    NULL_BLOCK_ID,
    DraftOutput,
    ProposeInput,
    StepBatch,
    TargetOutput,
)

VOCAB = 97
UNWRITTEN = -1


def next_token(prefix: list[int], window: int) -> int:
    """The "model": a position-weighted hash of the prefix plus its last ``window`` tokens."""
    full = sum((index + 1) * token for index, token in enumerate(prefix))
    recent = sum(prefix[-window:])
    return (full * 31 + recent * 7 + len(prefix)) % VOCAB


def expected_continuation(prompt: list[int], num_tokens: int, window: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(next_token(tokens, window))
    return tokens[len(prompt) :]


@dataclass
class RunnerTimings:
    metadata: float = 0.0


@dataclass
class PagedTokenRunner:
    num_blocks: int
    block_size: int = 4
    window: int = 6
    draft_error_every: int = 3  # corrupt the draft at positions p with hash(p) % this == 0
    kv_cache_group_infos: tuple[KVCacheGroupInfo, ...] = field(init=False)
    timings: RunnerTimings = field(default_factory=RunnerTimings)
    removed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        full = KVCacheGroupInfo(0, self.block_size, None, False, ("full",))
        # Page-size unification often doubles a sliding group's block size: do the same.
        sliding = KVCacheGroupInfo(1, 2 * self.block_size, self.window, False, ("sliding",))
        self.kv_cache_group_infos = (full, sliding)
        self.caches = [
            torch.full((self.num_blocks, info.block_size), UNWRITTEN, dtype=torch.long)
            for info in self.kv_cache_group_infos
        ]

    def _slot(self, group: int, block_ids: tuple[int, ...], position: int) -> tuple[int, int]:
        size = self.kv_cache_group_infos[group].block_size
        block = block_ids[position // size]
        assert block != NULL_BLOCK_ID, f"group {group}: position {position} maps to the null block"
        return block, position % size

    def _write(self, block_ids: tuple[tuple[int, ...], ...], position: int, token: int) -> None:
        for group, cache in enumerate(self.caches):
            cache[self._slot(group, block_ids[group], position)] = token

    def read_prefix(
        self, block_ids: tuple[tuple[int, ...], ...], length: int
    ) -> tuple[list[int], list[int]]:
        full = [int(self.caches[0][self._slot(0, block_ids[0], p)]) for p in range(length)]
        first = max(0, length - self.window)
        recent = [int(self.caches[1][self._slot(1, block_ids[1], p)]) for p in range(first, length)]
        return full, recent

    def _check_cover(self, block_ids: tuple[tuple[int, ...], ...], num_positions: int) -> None:
        for info, table in zip(self.kv_cache_group_infos, block_ids, strict=True):
            assert len(table) >= cdiv(num_positions, info.block_size), (info, table, num_positions)

    def run_chunk(
        self,
        request_id: str,
        block_ids: tuple[tuple[int, ...], ...],
        start: int,
        token_ids: tuple[int, ...],
    ) -> list[int]:
        """Write a chunk's tokens at ``start`` on, and the "model"'s next token after each,
        read back through the block tables."""
        self._check_cover(block_ids, start + len(token_ids))
        rows = []
        for offset, token in enumerate(token_ids):
            position = start + offset
            self._write(block_ids, position, token)
            full, recent = self.read_prefix(block_ids, position + 1)
            assert UNWRITTEN not in full, f"{request_id}: read an unwritten slot"
            assert sum(recent) == sum(full[-self.window :]), f"{request_id}: window differs"
            rows.append(next_token(full, self.window))
        return rows

    def draft(self, token_ids: list[int], num_spec_tokens: int) -> list[int]:
        """The drafter: the true continuation of ``token_ids``, corrupted at hashed positions."""
        tokens = list(token_ids)
        row = []
        for _ in range(num_spec_tokens):
            token = next_token(tokens, self.window)
            if (len(tokens) * 7919) % self.draft_error_every == 0:
                token = (token + 1) % VOCAB
            row.append(token)
            tokens.append(token)
        return row

    def execute_target(self, batch: StepBatch) -> TargetOutput:
        logits = []
        for chunk in batch.chunks:
            rows = self.run_chunk(
                chunk.request_id, chunk.block_ids, chunk.start_position, chunk.token_ids
            )
            wanted = {"all": rows, "last": rows[-1:], "none": []}[chunk.logits]
            logits.append(self._one_hot(wanted))
        return TargetOutput(
            tuple(logits), tuple(torch.zeros(len(c.token_ids), 1) for c in batch.chunks)
        )

    @staticmethod
    def _one_hot(tokens: list[int]) -> torch.Tensor:
        out = torch.zeros(len(tokens), VOCAB)
        out[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 5.0
        return out

    def propose(self, batch_ctx: ProposeInput, num_spec_tokens: int) -> DraftOutput:
        drafts = []
        for request in batch_ctx.requests:
            self._check_cover(request.block_ids, len(request.token_ids) + num_spec_tokens)
            drafts.append(self.draft(list(request.token_ids), num_spec_tokens))
        ids = torch.tensor(drafts, dtype=torch.long)
        probs = torch.nn.functional.one_hot(ids, VOCAB).float()
        return DraftOutput(ids, probs)

    def remove_requests(self, request_ids: list[str]) -> None:
        self.removed.extend(request_ids)
