"""The runner's per-pass metadata path (``ForwardMetadataBuilder``) without the models.

Block tables come from the scheduler's block ids (zero-padded, coverage
checked as before); one build gives every KV-cache group of the pass its
common metadata, which every attention group's builder of that group gets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from attngroup.kernels.metadata import CommonAttentionMetadata, InvalidMetadataError
from attngroup.reference_engine.engine.forward_metadata import (
    BlockTableError,
    ForwardMetadataBuilder,
)

pytestmark = pytest.mark.grouping


@dataclass(frozen=True)
class PassInput:
    """One pass: per request its id, length, new tokens and blocks per KV-cache group."""

    request_ids: tuple[str, ...]
    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    block_ids: tuple[tuple[tuple[int, ...], ...], ...]


def forward_metadata(pair_name: str, device) -> ForwardMetadataBuilder:
    """The runner's path for a pair's grouping, with torch-backend builders."""
    return ForwardMetadataBuilder.for_pair(
        pair_name, device, backend="torch", max_num_seqs=4, max_query_len=4, max_num_tokens=16
    )


@pytest.fixture(scope="module")
def gemma(device) -> ForwardMetadataBuilder:
    """gemma4-e2b-mtp: four sliding groups of block size 32, one full group of 16."""
    return forward_metadata("gemma4-e2b-mtp", device)


@pytest.fixture(scope="module")
def hybrid(device) -> ForwardMetadataBuilder:
    """qwen3-next-mtp: two state groups (one block per request), one attention group."""
    return forward_metadata("qwen3-next-mtp", device)


RAGGED = PassInput(
    request_ids=("a", "b"),
    seq_lens=(40, 20),
    query_lens=(4, 2),
    block_ids=(((3, 4),) * 4 + ((5, 6, 7),), ((8,),) * 4 + ((9, 10),)),
)


def test_block_tables_are_zero_padded_rows(gemma) -> None:
    tables = gemma.block_tables(RAGGED.request_ids, RAGGED.seq_lens, RAGGED.block_ids, (0, 4))
    assert {g: (table.dtype, table.tolist()) for g, table in tables.items()} == {
        0: (np.dtype(np.int32), [[3, 4], [8, 0]]),
        4: (np.dtype(np.int32), [[5, 6, 7], [9, 10, 0]]),
    }


def test_build_matches_from_seq_lens_per_group(gemma, device) -> None:
    group_ids = (0, 3, 4)
    tables = gemma.block_tables(RAGGED.request_ids, RAGGED.seq_lens, RAGGED.block_ids, group_ids)
    result = gemma.build(RAGGED.seq_lens, RAGGED.query_lens, tables)
    built = {g: result.slot_mappings[gemma.layer_names[g][0]].tolist() for g in group_ids}
    expected = {
        g: CommonAttentionMetadata.from_seq_lens(
            RAGGED.seq_lens,
            RAGGED.query_lens,
            torch.from_numpy(tables[g]),
            gemma.block_sizes[g],
            device,
        ).slot_mapping.tolist()
        for g in group_ids
    }
    assert built == expected
    assert result.positions.tolist() == [36, 37, 38, 39, 18, 19]
    assert result.num_common_builds == len(group_ids)


def test_every_builder_of_a_group_gets_its_groups_metadata(gemma) -> None:
    """One common object per KV-cache group, shared by its attention groups' builders."""
    group_ids = tuple(range(len(gemma.block_sizes)))
    tables = gemma.block_tables(RAGGED.request_ids, RAGGED.seq_lens, RAGGED.block_ids, group_ids)
    result = gemma.build(RAGGED.seq_lens, RAGGED.query_lens, tables)
    commons = {
        g: {id(result.attn_metadata[name].common) for name in gemma.layer_names[g]}
        for g in group_ids
    }
    assert all(len(ids) == 1 for ids in commons.values()), commons
    assert len(set().union(*commons.values())) == len(group_ids)
    assert set(result.attn_metadata) == {name for names in gemma.layer_names for name in names}


SHORT = {
    "blocks-short-of-the-sequence": (
        PassInput(("ok", "short"), (32, 33), (1, 1), (((1,),) * 4 + ((2, 3),), ((4,),) * 5)),
        BlockTableError,
        r"request short: KV-cache group 0 \(block size 32\) has 1 blocks but positions up "
        "to 32 need 2",
    ),
    "one-entry-per-group-missing": (
        PassInput(("few",), (4,), (4,), (((1,),) * 4,)),
        BlockTableError,
        r"request few: block_ids has 4 entries, one per KV-cache group \(5\) expected",
    ),
}


@pytest.mark.parametrize("case", list(SHORT), ids=list(SHORT))
def test_uncovered_positions_are_refused(gemma, case: str) -> None:
    rows, error, message = SHORT[case]
    with pytest.raises(error, match=message):
        gemma.block_tables(rows.request_ids, rows.seq_lens, rows.block_ids, (0, 4))


def test_state_group_needs_one_block_but_a_wide_enough_table(hybrid) -> None:
    """A state group asks one block per request; the table must still span the
    sequence, as ``from_seq_lens`` requires (the scheduler pads it with null blocks)."""
    state = next(g for g, is_state in enumerate(hybrid.state_groups) if is_state)
    padded = ((7, 0),) * 3
    tables = hybrid.block_tables(("a",), (20,), (padded,), (state,))
    assert tables[state].tolist() == [[7, 0]]
    with pytest.raises(InvalidMetadataError, match="needs 2 blocks of 16"):
        hybrid.block_tables(("a",), (20,), (((7,),) * 3,), (state,))
