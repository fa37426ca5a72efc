"""``CommonAttentionMetadata``: construction, every invariant, and ``unpadded()``.

The expected slots and positions come from a per-token loop written here from
the layout's definition, independent of the vectorised code under test.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attngroup.kernels.metadata import CommonAttentionMetadata, InvalidMetadataError

pytestmark = pytest.mark.kernels

BLOCK_SIZE = 4


def shuffled_block_table(seq_lens: list[int], block_size: int, seed: int = 0) -> torch.Tensor:
    """Distinct physical blocks per request, in a random order, with one spare column."""
    width = max(-(-s // block_size) for s in seq_lens) + 1
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randperm(len(seq_lens) * width + 7, generator=generator)
    return blocks[: len(seq_lens) * width].reshape(len(seq_lens), width).to(torch.int32)


def expected_positions_and_slots(
    seq_lens: list[int], query_lens: list[int], block_table: torch.Tensor, block_size: int
) -> tuple[list[int], list[int]]:
    positions, slots = [], []
    for request, (seq_len, query_len) in enumerate(zip(seq_lens, query_lens, strict=True)):
        for position in range(seq_len - query_len, seq_len):
            block = int(block_table[request, position // block_size])
            positions.append(position)
            slots.append(block * block_size + position % block_size)
    return positions, slots


BATCHES = {
    "decode": ([9, 17, 1], [1, 1, 1]),
    "prefill": ([5, 12], [5, 12]),
    "chunked-prefill": ([13, 8], [6, 8]),
    "verify": ([20, 7, 11], [4, 4, 4]),
    "mixed": ([3, 21, 9, 4], [3, 1, 4, 2]),
}


@pytest.fixture(params=list(BATCHES), ids=list(BATCHES))
def batch(request) -> tuple[list[int], list[int], torch.Tensor]:
    seq_lens, query_lens = BATCHES[request.param]
    return seq_lens, query_lens, shuffled_block_table(seq_lens, BLOCK_SIZE)


def test_from_seq_lens_fields(batch) -> None:
    seq_lens, query_lens, block_table = batch
    metadata = CommonAttentionMetadata.from_seq_lens(
        seq_lens, query_lens, block_table, BLOCK_SIZE, "cpu"
    )
    positions, slots = expected_positions_and_slots(seq_lens, query_lens, block_table, BLOCK_SIZE)
    starts = [0]
    for query_len in query_lens:
        starts.append(starts[-1] + query_len)
    assert metadata.query_start_loc.tolist() == starts
    assert metadata.seq_lens.tolist() == seq_lens
    assert metadata.positions.tolist() == positions
    assert metadata.slot_mapping.tolist() == slots
    assert metadata.num_actual_tokens == sum(query_lens)
    assert metadata.max_query_len == max(query_lens)
    metadata.validate()
    assert metadata.max_seq_len == max(seq_lens)
    assert metadata.num_reqs == len(seq_lens)
    assert metadata.compute_num_computed_tokens().tolist() == [
        s - q for s, q in zip(seq_lens, query_lens, strict=True)
    ]
    assert metadata.query_start_loc.dtype == metadata.seq_lens.dtype == torch.int32
    assert metadata.slot_mapping.dtype == torch.int64
    metadata.validate()  # what the constructor builds meets every invariant


def test_padding_slots_are_minus_one(batch) -> None:
    seq_lens, query_lens, block_table = batch
    num_tokens = sum(query_lens)
    metadata = CommonAttentionMetadata.from_seq_lens(
        seq_lens, query_lens, block_table, BLOCK_SIZE, "cpu", num_tokens_padded=num_tokens + 5
    )
    assert metadata.num_actual_tokens == num_tokens
    assert metadata.num_tokens_padded == num_tokens + 5
    assert metadata.slot_mapping[num_tokens:].tolist() == [-1] * 5
    _, slots = expected_positions_and_slots(seq_lens, query_lens, block_table, BLOCK_SIZE)
    assert metadata.slot_mapping[:num_tokens].tolist() == slots


def test_unpadded_drops_padding_tokens_and_requests(batch) -> None:
    """A CUDA-graph batch pads tokens (slot -1) and requests (query 0, seq 0)."""
    seq_lens, query_lens, block_table = batch
    padded_table = torch.cat([block_table, torch.zeros_like(block_table[:2])])
    padded = CommonAttentionMetadata.from_seq_lens(
        [*seq_lens, 0, 0],
        [*query_lens, 0, 0],
        padded_table,
        BLOCK_SIZE,
        "cpu",
        num_tokens_padded=sum(query_lens) + 3,
    )
    plain = CommonAttentionMetadata.from_seq_lens(
        seq_lens, query_lens, block_table, BLOCK_SIZE, "cpu"
    )
    sliced = padded.unpadded(sum(query_lens), len(seq_lens))
    for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping", "positions"):
        assert torch.equal(getattr(sliced, name), getattr(plain, name)), name
    assert (sliced.num_actual_tokens, sliced.max_query_len, sliced.max_seq_len) == (
        plain.num_actual_tokens,
        plain.max_query_len,
        plain.max_seq_len,
    )


def test_unpadded_rejects_inconsistent_counts() -> None:
    seq_lens, query_lens = BATCHES["mixed"]
    metadata = CommonAttentionMetadata.from_seq_lens(
        seq_lens, query_lens, shuffled_block_table(seq_lens, BLOCK_SIZE), BLOCK_SIZE, "cpu"
    )
    with pytest.raises(InvalidMetadataError, match="num_actual_tokens"):
        metadata.unpadded(sum(query_lens) - 1, len(seq_lens))
    with pytest.raises(InvalidMetadataError, match="num_actual_reqs"):
        metadata.unpadded(sum(query_lens), len(seq_lens) + 1)


def _valid() -> CommonAttentionMetadata:
    seq_lens, query_lens = BATCHES["mixed"]
    return CommonAttentionMetadata.from_seq_lens(
        seq_lens,
        query_lens,
        shuffled_block_table(seq_lens, BLOCK_SIZE),
        BLOCK_SIZE,
        "cpu",
        num_tokens_padded=sum(query_lens) + 2,
    )


def _with_start_loc(values: list[int]) -> dict:
    loc = torch.tensor(values, dtype=torch.int32)
    return {"query_start_loc": loc, "query_start_loc_cpu": loc}


def _with_seq_lens(values: list[int]) -> dict:
    lens = torch.tensor(values, dtype=torch.int32)
    return {"seq_lens": lens, "seq_lens_cpu": lens}


def _with_slot(index: int, value: int):
    def change(metadata: CommonAttentionMetadata) -> dict:
        slots = metadata.slot_mapping.clone()
        slots[index] = value
        return {"slot_mapping": slots}

    return change


# Each case breaks one invariant of the valid "mixed" batch
# (seq_lens [3, 21, 9, 4], query_lens [3, 1, 4, 2], 10 real tokens + 2 padding).
BROKEN = {
    "start-not-zero": (lambda m: _with_start_loc([1, 3, 4, 8, 10]), r"query_start_loc\[0\]"),
    "decreasing": (lambda m: _with_start_loc([0, 3, 2, 8, 10]), "non-decreasing"),
    "last-not-num-tokens": (lambda m: {"num_actual_tokens": 11}, "num_actual_tokens"),
    "more-tokens-than-slots": (
        lambda m: {**_with_start_loc([0, 3, 4, 8, 13]), "num_actual_tokens": 13},
        "exceeds the slot_mapping length",
    ),
    "seq-shorter-than-query": (lambda m: _with_seq_lens([3, 21, 3, 4]), "seq_len 3 < query_len 4"),
    "max-query-len": (lambda m: {"max_query_len": 3}, "max_query_len"),
    "max-seq-len-too-small": (lambda m: {"max_seq_len": 20}, "max_seq_len"),
    "block-table-too-narrow": (lambda m: {"block_table": m.block_table[:, :5]}, "needs 6 blocks"),
    "wrong-slot": (_with_slot(4, 0), r"slot_mapping\[4\]"),
    "padding-slot-written": (_with_slot(11, 5), r"slot_mapping\[11\]"),
    "wrong-position": (
        lambda m: {"positions": m.positions + torch.arange(12).eq(2).long()},
        r"positions\[2\]",
    ),
    "int64-start-loc": (
        lambda m: {"query_start_loc": m.query_start_loc.long()},
        "query_start_loc must be torch.int32",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_validate_rejects(case: str) -> None:
    metadata = _valid()
    metadata.validate()  # the unbroken batch passes
    change, message = BROKEN[case]
    with pytest.raises(InvalidMetadataError, match=message):
        replace(metadata, **change(metadata)).validate()


BAD_INPUT = {
    "narrow-block-table": (([9, 17], [1, 1], 4), "needs 5 blocks"),
    "query-longer-than-sequence": (([3, 2], [3, 4], 5), "seq_len 2 < query_len 4"),
    "negative-query": (([3, 2], [-1, 1], 5), "query_lens must be >= 0"),
    "length-mismatch": (([3, 2], [1], 5), "equal length"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT), ids=list(BAD_INPUT))
def test_from_seq_lens_rejects(case: str) -> None:
    (seq_lens, query_lens, width), message = BAD_INPUT[case]
    table = torch.arange(2 * width, dtype=torch.int32).reshape(2, width)
    with pytest.raises(InvalidMetadataError, match=message):
        CommonAttentionMetadata.from_seq_lens(seq_lens, query_lens, table, BLOCK_SIZE, "cpu")


def test_rejects_padding_below_real_tokens() -> None:
    table = torch.arange(2, dtype=torch.int32)[None]
    with pytest.raises(InvalidMetadataError, match="num_tokens_padded 2"):
        CommonAttentionMetadata.from_seq_lens(
            [5], [5], table, BLOCK_SIZE, "cpu", num_tokens_padded=2
        )


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), min_size=1, max_size=6).map(
        lambda pairs: [(max(s, q), q) for s, q in pairs]
    ),
    block_size=st.sampled_from([1, 4, 16]),
    padding=st.integers(0, 4),
    seed=st.integers(0, 1000),
)
def test_slot_mapping_property(lengths, block_size, padding, seed) -> None:
    """For random batches, every real token's slot is its block's slot, padding is -1."""
    seq_lens = [s for s, _ in lengths]
    query_lens = [q for _, q in lengths]
    table = shuffled_block_table([max(s, 1) for s in seq_lens], block_size, seed)
    metadata = CommonAttentionMetadata.from_seq_lens(
        seq_lens, query_lens, table, block_size, "cpu", num_tokens_padded=sum(query_lens) + padding
    )
    positions, slots = expected_positions_and_slots(seq_lens, query_lens, table, block_size)
    assert metadata.slot_mapping.tolist() == slots + [-1] * padding
    assert metadata.positions[: len(positions)].tolist() == positions
    assert metadata.max_query_len == max(query_lens)
    metadata.validate()
