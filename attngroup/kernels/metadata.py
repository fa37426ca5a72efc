"""``CommonAttentionMetadata``: one step's batch, as every backend of a KV-cache group sees it.

The engine builds it once per KV-cache group per step; every attention group of
that KV-cache group hands the same object to its own builder (vLLM's design,
research notes section 2). ``from_seq_lens`` is the checked constructor (tests,
start-up); the engine's per-step hot path is ``attngroup.kernels.step_metadata``, which
builds every group's metadata of a step at once from persistent buffers and
is tested to equal ``from_seq_lens``. Layout follows ``attngroup.kernels.cache_layout``:

- the query tokens of all requests are concatenated; request ``r`` owns rows
  ``query_start_loc[r] : query_start_loc[r + 1]`` and they are the *last*
  ``query_len`` positions of its sequence (``seq_lens[r] - query_len ... seq_lens[r] - 1``);
- token position ``p`` of request ``r`` lives in slot
  ``block_table[r, p // block_size] * block_size + p % block_size``;
- ``slot_mapping`` and ``positions`` may be longer than ``num_actual_tokens``
  (CUDA-graph padding); padded slots are -1, so the KV write skips them.

Invariants are checked on host copies (``query_start_loc_cpu``, ``seq_lens_cpu``),
so validating never synchronises with the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from attngroup.kernels.cache_layout import PADDING_SLOT


class InvalidMetadataError(ValueError):
    """A ``CommonAttentionMetadata`` breaks one of its invariants (the message says which)."""


def cdiv(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


@dataclass(frozen=True)
class CommonAttentionMetadata:
    """Per-step batch description shared by all attention groups of one KV-cache group.

    Device tensors feed the kernels; the ``*_cpu`` copies let builders plan
    (FlashInfer) and validation run without a device synchronisation.
    """

    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    query_start_loc_cpu: torch.Tensor  # int32 [num_reqs + 1], host copy
    seq_lens: torch.Tensor  # int32 [num_reqs], context + new tokens
    seq_lens_cpu: torch.Tensor  # int32 [num_reqs], host copy
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks_per_req]
    slot_mapping: torch.Tensor  # int64 [num_tokens (padded)], -1 on padding
    positions: torch.Tensor  # int64 [num_tokens (padded)], 0 on padding
    num_actual_tokens: int  # unpadded token count == query_start_loc[-1]
    max_query_len: int
    max_seq_len: int
    block_size: int

    @property
    def num_reqs(self) -> int:
        return self.seq_lens_cpu.shape[0]

    @property
    def num_tokens_padded(self) -> int:
        return self.slot_mapping.shape[0]

    @property
    def query_lens_cpu(self) -> torch.Tensor:
        return self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1]

    def batch_size(self) -> int:
        return self.num_reqs

    def compute_num_computed_tokens(self) -> torch.Tensor:
        """Context tokens already in the cache before this step (host tensor)."""
        return self.seq_lens_cpu - self.query_lens_cpu

    def unpadded(self, num_actual_tokens: int, num_actual_reqs: int) -> CommonAttentionMetadata:
        """The first ``num_actual_reqs`` requests and their ``num_actual_tokens`` tokens.

        Drafters use this to drop CUDA-graph padding; the result is validated
        because a wrong pair of counts must not yield a silently inconsistent batch.
        """
        if not 0 <= num_actual_reqs <= self.num_reqs:
            raise InvalidMetadataError(
                f"unpadded: num_actual_reqs {num_actual_reqs} outside [0, {self.num_reqs}]"
            )
        query_start_loc_cpu = self.query_start_loc_cpu[: num_actual_reqs + 1]
        seq_lens_cpu = self.seq_lens_cpu[:num_actual_reqs]
        query_lens = query_start_loc_cpu[1:] - query_start_loc_cpu[:-1]
        sliced = replace(
            self,
            query_start_loc=self.query_start_loc[: num_actual_reqs + 1],
            query_start_loc_cpu=query_start_loc_cpu,
            seq_lens=self.seq_lens[:num_actual_reqs],
            seq_lens_cpu=seq_lens_cpu,
            block_table=self.block_table[:num_actual_reqs],
            slot_mapping=self.slot_mapping[:num_actual_tokens],
            positions=self.positions[:num_actual_tokens],
            num_actual_tokens=num_actual_tokens,
            max_query_len=int(query_lens.max()) if num_actual_reqs else 0,
            max_seq_len=int(seq_lens_cpu.max()) if num_actual_reqs else 0,
        )
        sliced.validate()
        return sliced

    def validate(self) -> None:
        """Check every invariant (research notes section 2); raise ``InvalidMetadataError``.

        Reads the host copies and, for the slot mapping, one copy of the block
        table and slot mapping to the host: call it in tests and at engine
        start-up, not on a hot path.
        """
        _validate_shapes(self)
        qsl = self.query_start_loc_cpu.long()
        seq_lens = self.seq_lens_cpu.long()
        if qsl[0] != 0:
            raise InvalidMetadataError(f"query_start_loc[0] must be 0, got {int(qsl[0])}")
        query_lens = qsl[1:] - qsl[:-1]
        if (query_lens < 0).any():
            bad = int(torch.nonzero(query_lens < 0)[0])
            raise InvalidMetadataError(
                f"query_start_loc must be non-decreasing; it drops after request {bad}: "
                f"{qsl[bad].item()} -> {qsl[bad + 1].item()}"
            )
        if int(qsl[-1]) != self.num_actual_tokens:
            raise InvalidMetadataError(
                f"query_start_loc[-1] is {int(qsl[-1])} but num_actual_tokens is "
                f"{self.num_actual_tokens} (it must count unpadded tokens)"
            )
        if self.num_actual_tokens > self.num_tokens_padded:
            raise InvalidMetadataError(
                f"num_actual_tokens {self.num_actual_tokens} exceeds the slot_mapping length "
                f"{self.num_tokens_padded}"
            )
        _check_lengths(query_lens, seq_lens, self.block_table.shape[1], self.block_size)
        expected_max_query = int(query_lens.max()) if self.num_reqs else 0
        if self.max_query_len != expected_max_query:
            raise InvalidMetadataError(
                f"max_query_len is {self.max_query_len}, the batch's largest query is "
                f"{expected_max_query}"
            )
        longest = int(seq_lens.max()) if self.num_reqs else 0
        if self.max_seq_len < longest:
            raise InvalidMetadataError(
                f"max_seq_len {self.max_seq_len} is below the longest sequence {longest}"
            )
        expected_positions, expected_slots = _positions_and_slots(
            query_lens, seq_lens, self.block_table.cpu(), self.block_size, self.num_tokens_padded
        )
        real_positions = self.positions.cpu()[: self.num_actual_tokens]
        _check_equal("positions", real_positions, expected_positions[: self.num_actual_tokens])
        _check_equal("slot_mapping", self.slot_mapping.cpu(), expected_slots)

    @classmethod
    def from_seq_lens(
        cls,
        seq_lens: Sequence[int] | torch.Tensor,
        query_lens: Sequence[int] | torch.Tensor,
        block_table: torch.Tensor,
        block_size: int,
        device: torch.device | str,
        *,
        num_tokens_padded: int | None = None,
    ) -> CommonAttentionMetadata:
        """The metadata of one step from per-request lengths (checked; the rest follows).

        ``block_table`` [num_reqs, max_blocks] holds the physical block ids of
        each request; ``num_tokens_padded`` pads ``slot_mapping``/``positions``
        (slots -1) as a CUDA-graph batch would.
        """
        seq_lens_cpu = torch.as_tensor(seq_lens, dtype=torch.int32).cpu()
        query_lens_cpu = torch.as_tensor(query_lens, dtype=torch.int32).cpu()
        if seq_lens_cpu.ndim != 1 or seq_lens_cpu.shape != query_lens_cpu.shape:
            raise InvalidMetadataError(
                f"seq_lens {tuple(seq_lens_cpu.shape)} and query_lens "
                f"{tuple(query_lens_cpu.shape)} must be 1-D and of equal length"
            )
        if (query_lens_cpu < 0).any():
            raise InvalidMetadataError(f"query_lens must be >= 0, got {query_lens_cpu.tolist()}")
        query_start_loc_cpu = torch.zeros(len(seq_lens_cpu) + 1, dtype=torch.int32)
        torch.cumsum(query_lens_cpu, 0, out=query_start_loc_cpu[1:])
        num_actual_tokens = int(query_start_loc_cpu[-1])
        padded = num_actual_tokens if num_tokens_padded is None else num_tokens_padded
        if padded < num_actual_tokens:
            raise InvalidMetadataError(
                f"num_tokens_padded {padded} is below the {num_actual_tokens} real tokens"
            )
        block_table_cpu = block_table.to(device="cpu", dtype=torch.int32)
        if block_table_cpu.ndim != 2 or block_table_cpu.shape[0] != len(seq_lens_cpu):
            raise InvalidMetadataError(
                f"block_table must be [num_reqs={len(seq_lens_cpu)}, max_blocks], "
                f"got {tuple(block_table_cpu.shape)}"
            )
        _check_lengths(
            query_lens_cpu.long(), seq_lens_cpu.long(), block_table_cpu.shape[1], block_size
        )
        positions, slot_mapping = _positions_and_slots(
            query_lens_cpu.long(), seq_lens_cpu.long(), block_table_cpu, block_size, padded
        )
        metadata = cls(
            query_start_loc=query_start_loc_cpu,
            query_start_loc_cpu=query_start_loc_cpu,
            seq_lens=seq_lens_cpu,
            seq_lens_cpu=seq_lens_cpu,
            block_table=block_table_cpu,
            slot_mapping=slot_mapping,
            positions=positions,
            num_actual_tokens=num_actual_tokens,
            max_query_len=int(query_lens_cpu.max()) if len(query_lens_cpu) else 0,
            max_seq_len=int(seq_lens_cpu.max()) if len(seq_lens_cpu) else 0,
            block_size=block_size,
        )
        return metadata.to(device)  # consistent by construction: the inputs were checked above

    def to(self, device: torch.device | str) -> CommonAttentionMetadata:
        """The same batch with its device tensors on ``device`` (host copies stay)."""
        return replace(
            self,
            query_start_loc=self.query_start_loc.to(device),
            seq_lens=self.seq_lens.to(device),
            block_table=self.block_table.to(device),
            slot_mapping=self.slot_mapping.to(device),
            positions=self.positions.to(device),
        )


def _positions_and_slots(
    query_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    num_tokens_padded: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and KV slots of every query token (host tensors, vectorised)."""
    num_tokens = int(query_lens.sum())
    request_of_token = torch.repeat_interleave(
        torch.arange(len(query_lens)), query_lens, output_size=num_tokens
    )
    token_starts = torch.cumsum(query_lens, 0) - query_lens
    offset_in_query = torch.arange(num_tokens) - token_starts[request_of_token]
    positions = (seq_lens - query_lens)[request_of_token] + offset_in_query
    blocks = block_table.long()[request_of_token, positions // block_size]
    slots = blocks * block_size + positions % block_size
    padded_positions = torch.zeros(num_tokens_padded, dtype=torch.int64)
    padded_slots = torch.full((num_tokens_padded,), PADDING_SLOT, dtype=torch.int64)
    padded_positions[:num_tokens] = positions
    padded_slots[:num_tokens] = slots
    return padded_positions, padded_slots


def _check_lengths(
    query_lens: torch.Tensor, seq_lens: torch.Tensor, block_table_width: int, block_size: int
) -> None:
    """Every query fits in its sequence and every sequence in its block-table row."""
    if (seq_lens < query_lens).any():
        bad = int(torch.nonzero(seq_lens < query_lens)[0])
        raise InvalidMetadataError(
            f"request {bad}: seq_len {int(seq_lens[bad])} < query_len {int(query_lens[bad])}"
        )
    longest = int(seq_lens.max()) if len(seq_lens) else 0
    check_block_table_width(block_table_width, longest, block_size)


def check_block_table_width(block_table_width: int, longest: int, block_size: int) -> None:
    """A block table this wide holds a sequence of ``longest`` tokens (else ``InvalidMetadataError``)."""
    if block_table_width < cdiv(longest, block_size):
        raise InvalidMetadataError(
            f"block_table has {block_table_width} columns; a sequence of {longest} tokens "
            f"needs {cdiv(longest, block_size)} blocks of {block_size}"
        )


def _validate_shapes(metadata: CommonAttentionMetadata) -> None:
    num_reqs = metadata.num_reqs
    expected = {
        "query_start_loc": (metadata.query_start_loc, (num_reqs + 1,), torch.int32),
        "query_start_loc_cpu": (metadata.query_start_loc_cpu, (num_reqs + 1,), torch.int32),
        "seq_lens": (metadata.seq_lens, (num_reqs,), torch.int32),
        "positions": (metadata.positions, (metadata.num_tokens_padded,), torch.int64),
        "slot_mapping": (metadata.slot_mapping, (metadata.num_tokens_padded,), torch.int64),
    }
    for name, (tensor, shape, dtype) in expected.items():
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise InvalidMetadataError(
                f"{name} must be {dtype} of shape {shape}, got {tensor.dtype} {tuple(tensor.shape)}"
            )
    table = metadata.block_table
    if table.ndim != 2 or table.shape[0] != num_reqs or table.dtype != torch.int32:
        raise InvalidMetadataError(
            f"block_table must be int32 [num_reqs={num_reqs}, max_blocks], "
            f"got {table.dtype} {tuple(table.shape)}"
        )
    if metadata.block_size <= 0:
        raise InvalidMetadataError(f"block_size must be positive, got {metadata.block_size}")


def _check_equal(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    mismatch = torch.nonzero(actual != expected)
    if len(mismatch):
        index = int(mismatch[0])
        raise InvalidMetadataError(
            f"{name}[{index}] is {int(actual[index])}, expected {int(expected[index])} "
            f"({len(mismatch)} entries differ)"
        )
