"""The model runner's per-pass attention metadata: one packed step build, then every builder.

Per forward pass the runner turns the scheduler's block ids into one host block
table per KV-cache group the pass touches (checking that they cover the
positions the pass reads and writes), builds every group's
``CommonAttentionMetadata`` in one ``StepMetadataBuilder.build`` (shared
query_start_loc / seq_lens / positions, one host-to-device copy) and hands each
group's object to every attention group's builder of that KV-cache group.
``attngroup.benchmarks.bench_metadata`` times ``ForwardMetadataBuilder.build``, the
engine's own per-step path.

Lifetime: the result is valid until the next ``build`` (the step builder's
buffers are reused). The runner builds once per forward pass and drops the
pass's ``ForwardContext`` before the next one; the Gemma 4 assistant keeps one
context for its k draft steps, with no other build in between.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import torch

from attngroup.kernels.metadata import cdiv, check_block_table_width
from attngroup.kernels.step_metadata import StepMetadataBuilder
from attngroup.reference_engine.attention_groups import AttentionGroup
from attngroup.reference_engine.grouping_plan import plan_grouping
from attngroup.reference_engine.kv_cache_spec import KVCacheGroupSpec, MambaSpec
from attngroup.reference_engine.model_pairs import get_model_pair

INITIAL_CONTEXT_CAPACITY = 32768
"""Tokens per request the block-table buffers are first sized for (they grow past it)."""


class BlockTableError(ValueError):
    """A request's blocks do not cover the positions a step reads or writes."""


@dataclass(frozen=True)
class ForwardMetadata:
    """One pass's metadata, valid until the next ``ForwardMetadataBuilder.build``."""

    attn_metadata: dict[str, Any]  # layer name -> its attention group's built metadata
    slot_mappings: dict[str, torch.Tensor]  # layer name -> its KV-cache group's slots
    positions: torch.Tensor  # int64 [num_tokens] on the device: seq_len - query_len + i
    num_common_builds: int  # CommonAttentionMetadata objects built: one per KV-cache group


class ForwardMetadataBuilder:
    """Owns the runner's ``StepMetadataBuilder`` and runs the attention groups' builders.

    ``attention_groups[g]`` are KV-cache group ``g``'s attention groups, whose
    builders (micro-batch 0) must exist already: they are looked up once, here.
    ``state_groups[g]`` marks a state (Mamba-like) group, whose requests need
    one block only.
    """

    def __init__(
        self,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        attention_groups: Sequence[Sequence[AttentionGroup]],
        state_groups: Sequence[bool],
        device: torch.device | str,
        *,
        max_num_seqs: int,
        max_num_tokens: int,
        max_blocks_per_seq: int | Sequence[int] | None = None,
    ) -> None:
        self.block_sizes = tuple(group.kv_cache_spec.block_size for group in kv_cache_groups)
        self.attention_groups = tuple(tuple(row) for row in attention_groups)
        self.state_groups = tuple(state_groups)
        if not len(self.block_sizes) == len(self.attention_groups) == len(self.state_groups):
            raise ValueError(
                f"{len(self.block_sizes)} KV-cache groups, {len(self.attention_groups)} rows of "
                f"attention groups and {len(self.state_groups)} state flags must match"
            )
        # Per KV-cache group: (builder, its layers) per attention group, and all the layers.
        self._builders = tuple(
            tuple((group.get_metadata_builder(0), tuple(group.layer_names)) for group in row)
            for row in self.attention_groups
        )
        self.layer_names = tuple(
            tuple(name for group in row for name in group.layer_names)
            for row in self.attention_groups
        )
        if max_blocks_per_seq is None:
            max_blocks_per_seq = [cdiv(INITIAL_CONTEXT_CAPACITY, size) for size in self.block_sizes]
        self.step = StepMetadataBuilder(
            self.block_sizes,
            device,
            max_num_seqs=max_num_seqs,
            max_num_tokens=max_num_tokens,
            max_blocks_per_seq=max_blocks_per_seq,
        )

    @classmethod
    def for_pair(
        cls,
        pair_name: str,
        device: torch.device | str,
        *,
        backend: str | None = None,
        dtype: torch.dtype = torch.float32,
        block_size: int = 16,
        max_num_seqs: int,
        max_query_len: int,
        max_num_tokens: int,
        max_blocks_per_seq: int | Sequence[int] | None = None,
    ) -> ForwardMetadataBuilder:
        """The engine's metadata path for a pair's split grouping (TP 1), without its models:
        what benchmarks and tests drive when they need the builders but not a forward."""
        layers = get_model_pair(pair_name).layers(1, backend)
        plan = plan_grouping(layers, "split", block_size, dtype)
        plan.raise_on_error()
        by_name = {layer.name: layer for layer in layers}
        rows = [[entry.group for entry in row] for row in plan.attention_groups]
        for group in chain.from_iterable(rows):
            group.create_metadata_builders(
                by_name, device, max_num_seqs=max_num_seqs, max_query_len=max_query_len
            )
        return cls(
            plan.kv_cache_groups,
            rows,
            [isinstance(group.kv_cache_spec, MambaSpec) for group in plan.kv_cache_groups],
            device,
            max_num_seqs=max_num_seqs,
            max_num_tokens=max_num_tokens,
            max_blocks_per_seq=max_blocks_per_seq,
        )

    def block_tables(
        self,
        request_ids: Sequence[str],
        seq_lens: Sequence[int],
        block_ids: Sequence[Sequence[Sequence[int]]],
        group_ids: Sequence[int],
    ) -> dict[int, np.ndarray]:
        """int32 [num_reqs, width] per KV-cache group in ``group_ids``, zero-padded.

        ``block_ids[r][g]`` are request ``r``'s blocks in group ``g``; they must
        cover positions ``0 .. seq_lens[r] - 1`` (a state group: one block), else
        ``BlockTableError``; a table too narrow for the longest sequence raises
        ``InvalidMetadataError``, as ``CommonAttentionMetadata.from_seq_lens`` does.
        """
        num_groups = len(self.block_sizes)
        for request_id, blocks in zip(request_ids, block_ids, strict=True):
            if len(blocks) != num_groups:
                raise BlockTableError(
                    f"request {request_id}: block_ids has {len(blocks)} entries, one per "
                    f"KV-cache group ({num_groups}) expected"
                )
        num_reqs = len(block_ids)
        seq_lens_np = np.asarray(seq_lens, dtype=np.int64)
        longest = int(seq_lens_np.max()) if num_reqs else 0
        tables = {}
        for group_id in group_ids:
            block_size = self.block_sizes[group_id]
            rows = [blocks[group_id] for blocks in block_ids]
            lengths = np.fromiter(map(len, rows), dtype=np.int64, count=num_reqs)
            needed = 1 if self.state_groups[group_id] else -(-seq_lens_np // block_size)
            short = np.flatnonzero(lengths < needed)
            if len(short):
                index = int(short[0])
                seq_len = int(seq_lens_np[index])
                need = 1 if self.state_groups[group_id] else cdiv(seq_len, block_size)
                raise BlockTableError(
                    f"request {request_ids[index]}: KV-cache group {group_id} (block size "
                    f"{block_size}) has {len(rows[index])} blocks but positions up to "
                    f"{seq_len - 1} need {need}"
                )
            width = max(1, int(lengths.max()) if num_reqs else 0)
            check_block_table_width(width, longest, block_size)
            if num_reqs and bool((lengths == width).all()):
                tables[group_id] = np.array(rows, dtype=np.int32)
                continue
            table = np.zeros((num_reqs, width), dtype=np.int32)
            table[np.arange(width) < lengths[:, None]] = np.fromiter(
                chain.from_iterable(rows), dtype=np.int32, count=int(lengths.sum())
            )
            tables[group_id] = table
        return tables

    def build(
        self,
        seq_lens: Sequence[int],
        query_lens: Sequence[int],
        block_tables: Mapping[int, np.ndarray],
    ) -> ForwardMetadata:
        """Every layer's metadata for one pass over the KV-cache groups of ``block_tables``."""
        step = self.step.build(seq_lens, query_lens, block_tables)
        attn_metadata: dict[str, Any] = {}
        slot_mappings: dict[str, torch.Tensor] = {}
        for group_id, common in step.common.items():
            for builder, layer_names in self._builders[group_id]:
                attn_metadata.update(dict.fromkeys(layer_names, builder.build(common)))
            slot_mappings.update(dict.fromkeys(self.layer_names[group_id], common.slot_mapping))
        return ForwardMetadata(
            attn_metadata=attn_metadata,
            slot_mappings=slot_mappings,
            positions=step.positions,
            num_common_builds=len(step.common),
        )
