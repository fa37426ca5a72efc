"""One step's ``CommonAttentionMetadata`` for every KV-cache group, from persistent buffers.

Why this exists: ``CommonAttentionMetadata.from_seq_lens`` checks its inputs,
derives positions and slots with about fifteen small torch ops and copies five
tensors to the device, and the engine called it once per KV-cache group per
step: about 2 ms of host time per step for gemma4-e2b-mtp at batch 64 on an
H200 host. ``StepMetadataBuilder`` is the hot path, built the way vLLM's
persistent input buffers are:

- one packed host staging buffer (pinned when the device is CUDA) and one
  device buffer of the same layout, allocated once for ``max_num_seqs``,
  ``max_num_tokens`` and each group's ``max_blocks_per_seq`` (grown, never
  shrunk, if a step needs more, so a steady state never allocates);
- ``query_start_loc``, ``seq_lens`` and ``positions`` are computed once per
  step with numpy (a numpy op costs a fraction of a small torch op) and shared
  by every group; per KV-cache group only its block table and its slot mapping
  differ, and the slots of all groups come out of one vectorised pass;
- the whole step reaches the device in one ``non_blocking`` copy of the packed
  buffer's used prefix; the metadata's device tensors are views into the device
  buffer, its ``*_cpu`` tensors views into the host buffer. On a CPU device the
  host buffer *is* the device buffer and nothing is copied.

The tensor views of a step layout (batch size, padded tokens, table widths)
are made once and reused while the batch keeps its shape, and the metadata
objects are filled without the dataclass ``__init__``: at about 1-2 us per
small torch or Python call, those add up at five groups per step.

It trusts its caller and validates nothing beyond what keeps its writes inside
the buffer (row counts, padding): the engine checks block-table coverage before
it builds, and the suites prove that the output equals ``from_seq_lens`` on the
same inputs and passes ``validate()``.

Lifetime rule: the metadata returned by ``build`` is valid until the next
``build`` of the same builder, which rewrites both buffers in place. Build once
per forward pass and drop the previous pass's metadata before building again;
run its kernels on the CUDA stream that was current at ``build`` (stream order
then keeps the next step's copy from overwriting device data a queued kernel
still reads). Before rewriting the host buffer, ``build`` waits for the
previous step's copy out of it (a CUDA event), so an in-flight ``non_blocking``
copy never reads half-written data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attngroup.kernels.cache_layout import PADDING_SLOT
from attngroup.kernels.metadata import CommonAttentionMetadata

MAX_CACHED_LAYOUTS = 64
"""Step layouts whose views are kept for reuse (beyond that the cache starts over)."""


@dataclass(frozen=True)
class StepMetadata:
    """What one ``build`` returns; valid until the builder's next ``build``."""

    common: dict[int, CommonAttentionMetadata]  # KV-cache group id -> its metadata
    positions: torch.Tensor  # int64 [num_tokens_padded] on the device, shared by every group
    num_actual_tokens: int


@dataclass(frozen=True)
class _Layout:
    """Where one step shape (requests, padded tokens, table widths) lies in the packed buffers.

    Elements, in order: int64 positions [padded] and slots [groups, padded], then
    int32 query_start_loc [n + 1], seq_lens [n] and each group's block table
    [n, width]; ``num_bytes`` is the prefix they fill. Numpy views write the host
    buffer; tensor views are what the metadata hands out.
    """

    num_bytes: int
    positions_np: np.ndarray
    slots_np: np.ndarray  # [groups, padded]
    start_loc_np: np.ndarray
    seq_lens_np: np.ndarray
    tables_np: tuple[np.ndarray, ...]
    row_base: np.ndarray  # int64 [groups, n]: int32 index of block_table[g][r, 0] in the buffer
    positions: torch.Tensor
    start_loc: torch.Tensor
    start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_tables: tuple[torch.Tensor, ...]
    slot_mappings: tuple[torch.Tensor, ...]


class StepMetadataBuilder:
    """Builds each step's ``CommonAttentionMetadata`` of several KV-cache groups at once.

    ``block_sizes[g]`` is KV-cache group ``g``'s block size and
    ``max_blocks_per_seq`` (one value or one per group) the block-table width
    the buffers are first sized for. See the module docstring for the design
    and for how long a build's metadata stays valid.
    """

    def __init__(
        self,
        block_sizes: Sequence[int],
        device: torch.device | str,
        *,
        max_num_seqs: int,
        max_num_tokens: int,
        max_blocks_per_seq: int | Sequence[int],
        pin_memory: bool | None = None,
    ) -> None:
        if not block_sizes or min(block_sizes) <= 0:
            raise ValueError(f"block sizes must be positive, got {list(block_sizes)}")
        self.block_sizes = tuple(int(size) for size in block_sizes)
        self.device = torch.device(device)
        widths = (
            (max_blocks_per_seq,) * len(self.block_sizes)
            if isinstance(max_blocks_per_seq, int)
            else tuple(max_blocks_per_seq)
        )
        if len(widths) != len(self.block_sizes):
            raise ValueError(
                f"{len(widths)} max_blocks_per_seq values for {len(self.block_sizes)} groups"
            )
        if pin_memory is None:
            pin_memory = self.device.type == "cuda" and torch.cuda.is_available()
        self.pin_memory = pin_memory
        # Recorded after each copy out of the pinned buffer; waited on before rewriting it.
        self._copy_done = torch.cuda.Event() if pin_memory and self.device.type == "cuda" else None
        self._copy_pending = False
        self._block_size_columns: dict[tuple[int, ...], np.ndarray] = {}
        num_seqs, num_tokens = max(1, max_num_seqs), max(1, max_num_tokens)
        self._allocate(
            num_seqs,
            num_tokens,
            _packed_bytes(num_seqs, num_tokens, len(self.block_sizes), sum(widths)),
        )

    # --- buffers ----------------------------------------------------------------------------

    @torch.inference_mode(False)  # normal tensors even when a step grows them in inference mode
    def _allocate(self, num_seqs: int, num_tokens: int, num_bytes: int) -> None:
        """(Re)allocate the persistent buffers; earlier metadata keeps the old storage alive."""
        num_bytes = -(-num_bytes // 8) * 8
        self._host = torch.zeros(num_bytes, dtype=torch.uint8, pin_memory=self.pin_memory)
        host_np = self._host.numpy()
        self._np_i32 = host_np.view(np.int32)
        self._np_i64 = host_np.view(np.int64)
        if self.device.type == "cpu":
            self._device = self._host  # nothing to copy: the metadata reads the host buffer
        else:
            self._device = torch.empty(num_bytes, dtype=torch.uint8, device=self.device)
        self._layouts: dict[tuple, _Layout] = {}
        self._arange_tokens = np.arange(num_tokens, dtype=np.int64)
        self._arange_seqs = np.arange(num_seqs, dtype=np.int64)

    @property
    def capacity_bytes(self) -> int:
        """Size of each packed buffer (grows when a step needs more)."""
        return self._host.shape[0]

    def _wait_for_previous_copy(self) -> None:
        if self._copy_pending:
            assert self._copy_done is not None, "only a recorded event leaves a copy pending"
            self._copy_done.synchronize()
            self._copy_pending = False

    def _layout(self, num_reqs: int, padded: int, widths: tuple[int, ...]) -> _Layout:
        layout = self._layouts.get((num_reqs, padded, widths))
        return layout if layout is not None else self._new_layout(num_reqs, padded, widths)

    @torch.inference_mode(False)
    def _new_layout(self, num_reqs: int, padded: int, widths: tuple[int, ...]) -> _Layout:
        num_groups = len(widths)
        start_loc_at = 2 * (1 + num_groups) * padded  # int32 elements from here on
        seq_lens_at = start_loc_at + num_reqs + 1
        table_offsets = [seq_lens_at + num_reqs]
        for width in widths:
            table_offsets.append(table_offsets[-1] + num_reqs * width)
        num_bytes = 4 * table_offsets.pop()
        if (
            num_bytes > self._host.shape[0]
            or padded > len(self._arange_tokens)
            or num_reqs > len(self._arange_seqs)
        ):
            self._allocate(
                max(num_reqs, len(self._arange_seqs)),
                max(padded, len(self._arange_tokens)),
                max(num_bytes, 2 * self._host.shape[0]),
            )
        if len(self._layouts) >= MAX_CACHED_LAYOUTS:
            self._layouts.clear()
        np_i32, np_i64 = self._np_i32, self._np_i64
        host_i32 = self._host.view(torch.int32)
        device_i32, device_i64 = self._device.view(torch.int32), self._device.view(torch.int64)
        start_loc_cpu = host_i32.as_strided((num_reqs + 1,), (1,), start_loc_at)
        seq_lens_cpu = host_i32.as_strided((num_reqs,), (1,), seq_lens_at)
        on_host = self._device is self._host
        layout = _Layout(
            num_bytes=num_bytes,
            positions_np=np_i64[:padded],
            slots_np=np_i64[padded : (1 + num_groups) * padded].reshape(num_groups, padded),
            start_loc_np=np_i32[start_loc_at:seq_lens_at],
            seq_lens_np=np_i32[seq_lens_at : seq_lens_at + num_reqs],
            tables_np=tuple(
                np_i32[at : at + num_reqs * width].reshape(num_reqs, width)
                for at, width in zip(table_offsets, widths, strict=True)
            ),
            row_base=(
                self._arange_seqs[:num_reqs] * np.array(widths, dtype=np.int64)[:, None]
                + np.array(table_offsets, dtype=np.int64)[:, None]
            ),
            positions=device_i64.as_strided((padded,), (1,), 0),
            start_loc=(
                start_loc_cpu
                if on_host
                else device_i32.as_strided((num_reqs + 1,), (1,), start_loc_at)
            ),
            start_loc_cpu=start_loc_cpu,
            seq_lens=(
                seq_lens_cpu if on_host else device_i32.as_strided((num_reqs,), (1,), seq_lens_at)
            ),
            seq_lens_cpu=seq_lens_cpu,
            block_tables=tuple(
                device_i32.as_strided((num_reqs, width), (width, 1), at)
                for at, width in zip(table_offsets, widths, strict=True)
            ),
            slot_mappings=tuple(
                device_i64.as_strided((padded,), (1,), (1 + index) * padded)
                for index in range(num_groups)
            ),
        )
        self._layouts[num_reqs, padded, widths] = layout
        return layout

    # --- the step ---------------------------------------------------------------------------

    def build(
        self,
        seq_lens: Sequence[int] | np.ndarray,
        query_lens: Sequence[int] | np.ndarray,
        block_tables: Mapping[int, np.ndarray | torch.Tensor],
        *,
        num_tokens_padded: int | None = None,
    ) -> StepMetadata:
        """The metadata of every KV-cache group in ``block_tables`` (group id -> host
        table [num_reqs, width], int32 preferred) for one step, in that order.

        Same meaning as ``CommonAttentionMetadata.from_seq_lens`` per group, minus
        its checks. Invalidates the previous build's metadata (module docstring).
        """
        query_lens = np.asarray(query_lens, dtype=np.int64)
        num_reqs = query_lens.shape[0]
        group_ids = tuple(block_tables)
        tables = [_as_numpy(table) for table in block_tables.values()]
        start_loc = query_lens.cumsum()
        num_tokens = int(start_loc[-1]) if num_reqs else 0
        padded = num_tokens if num_tokens_padded is None else num_tokens_padded
        widths = _table_widths(len(seq_lens), num_reqs, num_tokens, padded, group_ids, tables)
        self._wait_for_previous_copy()
        layout = self._layout(num_reqs, padded, widths)

        layout.start_loc_np[0] = 0
        layout.start_loc_np[1:] = start_loc
        layout.seq_lens_np[:] = seq_lens
        for staged, table in zip(layout.tables_np, tables, strict=True):
            staged[:] = table
        self._fill_positions_and_slots(layout, group_ids, query_lens, start_loc, num_tokens)
        if padded > num_tokens:
            layout.positions_np[num_tokens:] = 0
            layout.slots_np[:, num_tokens:] = PADDING_SLOT
        self._start_copy(layout)

        shared = {
            "query_start_loc": layout.start_loc,
            "query_start_loc_cpu": layout.start_loc_cpu,
            "seq_lens": layout.seq_lens,
            "seq_lens_cpu": layout.seq_lens_cpu,
            "positions": layout.positions,
            "num_actual_tokens": num_tokens,
            "max_query_len": int(query_lens.max()) if num_reqs else 0,
            "max_seq_len": int(layout.seq_lens_np.max()) if num_reqs else 0,
        }
        common = {}
        for index, group_id in enumerate(group_ids):
            common[group_id] = _trusted_metadata(
                shared,
                block_table=layout.block_tables[index],
                slot_mapping=layout.slot_mappings[index],
                block_size=self.block_sizes[group_id],
            )
        return StepMetadata(common=common, positions=layout.positions, num_actual_tokens=num_tokens)

    def _fill_positions_and_slots(
        self,
        layout: _Layout,
        group_ids: tuple[int, ...],
        query_lens: np.ndarray,
        start_loc: np.ndarray,
        num_tokens: int,
    ) -> None:
        """The real tokens' positions and every group's slots, in the staged host buffer."""
        # Token t of request r sits at position seq_len[r] - query_len[r] + t - start[r].
        first_position = layout.seq_lens_np - start_loc  # seq_len - query_len - start
        positions = layout.positions_np
        np.add(
            self._arange_tokens[:num_tokens],
            first_position.repeat(query_lens),
            out=positions[:num_tokens],
        )
        if not (num_tokens and group_ids):
            return
        # Slots of every group at once: block_table[r, p // bs] * bs + p % bs.
        block_size = self._block_size_column(group_ids)
        block_index, offset_in_block = np.divmod(positions[:num_tokens], block_size)
        index = layout.row_base.repeat(query_lens, axis=1)  # [groups, tokens]
        index += block_index
        real_slots = layout.slots_np[:, :num_tokens]
        np.multiply(self._np_i32.take(index), block_size, out=real_slots)
        real_slots += offset_in_block

    def _start_copy(self, layout: _Layout) -> None:
        """Copy the staged bytes to the device buffer without waiting (none on the CPU)."""
        if self._device is self._host:
            return
        num_bytes = layout.num_bytes
        self._device[:num_bytes].copy_(self._host[:num_bytes], non_blocking=True)
        if self._copy_done is not None:
            # The copy ran on the device's current stream, which need not be the
            # current device's: record there.
            self._copy_done.record(torch.cuda.current_stream(self.device))
            self._copy_pending = True

    def _block_size_column(self, group_ids: tuple[int, ...]) -> np.ndarray:
        """int64 [groups, 1]: the block size of each group of a pass (cached per group set)."""
        column = self._block_size_columns.get(group_ids)
        if column is None:
            column = np.array([self.block_sizes[g] for g in group_ids], dtype=np.int64)[:, None]
            self._block_size_columns[group_ids] = column
        return column


def _table_widths(
    num_seq_lens: int,
    num_reqs: int,
    num_tokens: int,
    padded: int,
    group_ids: tuple[int, ...],
    tables: Sequence[np.ndarray],
) -> tuple[int, ...]:
    """Each group's block-table width. Not validation, only what keeps the writes inside their
    regions of the buffer (numpy would broadcast a one-row table or a one-entry seq_lens
    silently)."""
    if num_seq_lens != num_reqs or padded < num_tokens:
        raise ValueError(
            f"{num_seq_lens} seq_lens, {num_reqs} query_lens, {num_tokens} tokens padded "
            f"to {padded}"
        )
    for group_id, table in zip(group_ids, tables, strict=True):
        if table.ndim != 2 or table.shape[0] != num_reqs:
            raise ValueError(f"group {group_id}: block table {table.shape} for {num_reqs} requests")
    return tuple(table.shape[1] for table in tables)


def _trusted_metadata(shared: dict, **own) -> CommonAttentionMetadata:
    """A ``CommonAttentionMetadata`` without its dataclass ``__init__``.

    A frozen dataclass's ``__init__`` sets each of its eleven fields through
    ``object.__setattr__`` (about 2 us here, per group per step); filling the
    instance dict directly gives the same object. The suites check that every
    field is set.
    """
    metadata = object.__new__(CommonAttentionMetadata)
    metadata.__dict__.update(shared)
    metadata.__dict__.update(own)
    return metadata


def _packed_bytes(num_seqs: int, num_tokens: int, num_groups: int, total_width: int) -> int:
    """Bytes of the packed layout of a step this large (see ``_Layout``)."""
    return 8 * (1 + num_groups) * num_tokens + 4 * (2 * num_seqs + 1 + num_seqs * total_width)


def _as_numpy(table: np.ndarray | torch.Tensor) -> np.ndarray:
    if type(table) is np.ndarray:
        return table
    if isinstance(table, torch.Tensor):
        return table.numpy() if table.device.type == "cpu" else table.cpu().numpy()
    return np.asarray(table)
