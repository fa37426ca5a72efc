"""The device speculative step's stand-in for the paged token runner.

``PagedDeviceRunner`` is a ``PagedTokenRunner`` with ``device_spec_step``: a step that,
like ``cuda_graphs.device_spec_step.DeviceSpecStep``, keeps the batch between launches
(next verify tokens, cached lengths, its own copy of the block tables) and computes each
launch from that copy alone: the verify through the copied tables, greedy rejection, the
drafts of the next verify. So the engine's device loop is held to what it owes the
device: blocks sent before the launch that writes them (a missing one maps to the null
block and fails), the right requests in the right rows, and bookkeeping one step behind
that ends where the eager engine ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from attngroup.kernels.metadata import cdiv
from attngroup.reference_engine.engine.rejection_sampler import PLACEHOLDER_TOKEN_ID
from attngroup.suites.engine_units.paged_token_runner import PagedTokenRunner


@dataclass(frozen=True)
class HostResult:
    """A launch's result, already on the host."""

    rows: np.ndarray

    def wait(self) -> np.ndarray:
        return self.rows


class PagedDeviceStep:
    """One bucket of the stand-in: the batch it carries and its launches."""

    def __init__(self, runner: PagedTokenRunner, bucket: int, k: int, capacity: int) -> None:
        self.runner, self.bucket, self.k, self.capacity = runner, bucket, k, capacity
        infos = runner.kv_cache_group_infos
        self.kv_groups = tuple(range(len(infos)))
        self.widths = {g: cdiv(capacity, infos[g].block_size) for g in self.kv_groups}
        self.launches = 0
        self.ids: list[list[int]] = []
        self.lens: list[int] = []
        self.tables: list[list[list[int]]] = []

    def load(
        self,
        verify_ids: Sequence[Sequence[int]],
        context_lens: Sequence[int],
        block_ids: Sequence[Sequence[Sequence[int]]],
    ) -> None:
        assert 0 < len(context_lens) <= self.bucket
        self.ids = [list(ids) for ids in verify_ids]
        self.lens = list(context_lens)
        self.tables = [
            [
                [*blocks[g][: self.widths[g]], *[0] * (self.widths[g] - len(blocks[g]))]
                for g in self.kv_groups
            ]
            for blocks in block_ids
        ]

    def write_blocks(
        self, group: int, rows: list[int], columns: list[int], blocks: list[int]
    ) -> None:
        for row, column, block in zip(rows, columns, blocks, strict=True):
            self.tables[row][group][column] = block

    def launch(self) -> HostResult:
        k = self.k
        out = np.full((self.bucket, 2 * (k + 1)), -7, dtype=np.int64)  # padding rows: junk
        for row, (context, ids) in enumerate(zip(self.lens, self.ids, strict=True)):
            tables = tuple(tuple(table) for table in self.tables[row])
            predicted = self.runner.run_chunk(f"row-{row}", tables, context, tuple(ids))
            accepted = 0
            while accepted < k and ids[1 + accepted] == predicted[accepted]:
                accepted += 1
            emitted = predicted[: accepted + 1]
            cached = context + 1 + accepted
            tokens, _ = self.runner.read_prefix(tables, cached)
            drafts = self.runner.draft([*tokens, emitted[-1]], k)
            padding = [PLACEHOLDER_TOKEN_ID] * (k + 1 - len(emitted))
            out[row] = [*emitted, *padding, emitted[-1], *drafts]
            self.lens[row], self.ids[row] = cached, [emitted[-1], *drafts]
        self.launches += 1
        return HostResult(out)


@dataclass
class PagedDeviceRunner(PagedTokenRunner):
    """The paged runner with a device step for every batch of up to ``max_bucket`` requests."""

    num_spec_tokens: int = 1
    capacity: int = 64
    max_bucket: int = 8
    steps: dict[int, PagedDeviceStep] = field(default_factory=dict)

    def device_spec_step(self, num_reqs: int) -> tuple[PagedDeviceStep | None, str]:
        if num_reqs > self.max_bucket:
            return None, f"no bucket holds {num_reqs} requests"
        step = self.steps.setdefault(
            num_reqs, PagedDeviceStep(self, num_reqs, self.num_spec_tokens, self.capacity)
        )
        return step, f"bucket {num_reqs}"
