"""``StepMetadataBuilder``: the engine's per-step fast path against ``from_seq_lens``.

The fast path skips every check, so these tests hold it to the validated
constructor: for the same inputs each KV-cache group's metadata must equal
``CommonAttentionMetadata.from_seq_lens`` field by field and pass
``validate()``, across mixed query lengths, CUDA-graph padding, padded
requests, block sizes and several KV-cache groups; the step tensors are shared
by the groups; the persistent buffers are reused in a steady state, grow when a
step outgrows them, and (on CUDA) a step never overwrites data that the
previous step's copy still reads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pytest
import torch

from attngroup.kernels.metadata import CommonAttentionMetadata
from attngroup.kernels.step_metadata import StepMetadata, StepMetadataBuilder
from attngroup.suites.kernels.batches import gpu_only

pytestmark = pytest.mark.kernels


@dataclass(frozen=True)
class StepCase:
    """One step: request ``r`` has ``seq_lens[r]`` tokens, the last ``query_lens[r]`` new;
    KV-cache group ``g`` has block size ``block_sizes[g]``; the pass builds ``groups``
    (all by default); ``padding`` extra token entries as a CUDA-graph batch has."""

    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    block_sizes: tuple[int, ...]
    padding: int = 0
    groups: tuple[int, ...] | None = None

    @property
    def group_ids(self) -> tuple[int, ...]:
        return tuple(range(len(self.block_sizes))) if self.groups is None else self.groups

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def num_tokens_padded(self) -> int:
        return self.num_tokens + self.padding


GEMMA4_E2B_BLOCK_SIZES = (32, 32, 32, 32, 16)  # four sliding groups, one full

CASES = {
    "decode-one-group": StepCase((9, 17, 1), (1, 1, 1), (4,)),
    "prefill-two-groups": StepCase((5, 12), (5, 12), (4, 16)),
    "chunked-prefill-padded": StepCase((13, 8), (6, 8), (1, 4), padding=5),
    "verify-gemma4-groups": StepCase((40, 33, 64, 5), (4, 4, 4, 4), GEMMA4_E2B_BLOCK_SIZES),
    "mixed-query-lens": StepCase((3, 21, 9, 4), (3, 1, 4, 2), (2, 4, 8), padding=2),
    "padded-requests": StepCase((7, 12, 0, 0), (2, 5, 0, 0), (4, 16), padding=3),
    "block-sizes-not-powers-of-two": StepCase((10, 25), (3, 7), (3, 5)),
    "draft-pass-two-of-five-groups": StepCase(
        (40, 33), (1, 1), GEMMA4_E2B_BLOCK_SIZES, groups=(3, 4)
    ),
    "groups-out-of-order": StepCase((20, 6), (2, 6), (4, 8, 16), groups=(2, 0)),
}


def block_tables(case: StepCase, seed: int = 0) -> dict[int, np.ndarray]:
    """Per group of the pass: distinct shuffled blocks per request and one spare column."""
    generator = torch.Generator().manual_seed(seed)
    tables = {}
    for group_id in case.group_ids:
        block_size = case.block_sizes[group_id]
        width = max(-(-s // block_size) for s in case.seq_lens) + 1
        blocks = torch.randperm(len(case.seq_lens) * width + 7, generator=generator)
        table = blocks[: len(case.seq_lens) * width].reshape(len(case.seq_lens), width)
        tables[group_id] = table.to(torch.int32).numpy()
    return tables


def make_builder(case: StepCase, device: torch.device, **sizes) -> StepMetadataBuilder:
    sizing = {
        "max_num_seqs": len(case.seq_lens),
        "max_num_tokens": case.num_tokens_padded,
        "max_blocks_per_seq": 1 + max(case.seq_lens) // min(case.block_sizes),
    }
    return StepMetadataBuilder(case.block_sizes, device, **{**sizing, **sizes})


def build(builder: StepMetadataBuilder, case: StepCase, tables) -> StepMetadata:
    return builder.build(
        case.seq_lens, case.query_lens, tables, num_tokens_padded=case.num_tokens_padded
    )


def reference(case: StepCase, tables, device: torch.device) -> dict[int, CommonAttentionMetadata]:
    """``from_seq_lens`` per group of the pass: the validated constructor."""
    return {
        group_id: CommonAttentionMetadata.from_seq_lens(
            case.seq_lens,
            case.query_lens,
            torch.from_numpy(tables[group_id]),
            case.block_sizes[group_id],
            device,
            num_tokens_padded=case.num_tokens_padded,
        )
        for group_id in case.group_ids
    }


def plain(metadata: CommonAttentionMetadata) -> dict:
    """Every field, tensors as (dtype, device type, shape, values): comparable with ==."""
    return {
        field.name: (
            (value.dtype, value.device.type, tuple(value.shape), value.tolist())
            if isinstance(value, torch.Tensor)
            else value
        )
        for field in fields(CommonAttentionMetadata)
        for value in [getattr(metadata, field.name)]
    }


def plain_step(common: dict[int, CommonAttentionMetadata]) -> dict[int, dict]:
    return {group_id: plain(metadata) for group_id, metadata in common.items()}


def validate_all(step: StepMetadata) -> None:
    for metadata in step.common.values():
        metadata.validate()


@pytest.fixture(params=list(CASES), ids=list(CASES))
def case(request) -> StepCase:
    return CASES[request.param]


def test_fast_path_equals_from_seq_lens(case: StepCase, device) -> None:
    tables = block_tables(case)
    step = build(make_builder(case, device), case, tables)
    assert list(step.common) == list(case.group_ids)
    assert plain_step(step.common) == plain_step(reference(case, tables, device))


def test_fast_path_passes_validate(case: StepCase, device) -> None:
    step = build(make_builder(case, device), case, block_tables(case))
    validate_all(step)


def test_groups_share_the_step_tensors(case: StepCase, device) -> None:
    """query_start_loc, seq_lens and positions are computed once per step, not per group."""
    step = build(make_builder(case, device), case, block_tables(case))
    shared = ("query_start_loc", "query_start_loc_cpu", "seq_lens", "seq_lens_cpu", "positions")
    objects = {name: {id(getattr(m, name)) for m in step.common.values()} for name in shared}
    assert objects == {name: {id(getattr(step.common[case.group_ids[0]], name))} for name in shared}
    assert step.positions is step.common[case.group_ids[0]].positions
    assert step.num_actual_tokens == case.num_tokens


def test_every_field_is_set(device) -> None:
    """The fast path fills the instance dict directly: it must set exactly the fields."""
    case = CASES["verify-gemma4-groups"]
    step = build(make_builder(case, device), case, block_tables(case))
    names = {field.name for field in fields(CommonAttentionMetadata)}
    assert {group_id: set(vars(m)) for group_id, m in step.common.items()} == dict.fromkeys(
        case.group_ids, names
    )


def test_tensor_block_tables_are_accepted(device) -> None:
    case = CASES["mixed-query-lens"]
    tables = block_tables(case)
    as_tensors = {g: torch.from_numpy(table).long() for g, table in tables.items()}
    step = build(make_builder(case, device), case, as_tensors)
    assert plain_step(step.common) == plain_step(reference(case, tables, device))


def test_steady_state_reuses_the_buffers(device) -> None:
    """A step of the same shape writes the same memory and allocates nothing; the
    previous step's metadata then shows the new step (valid until the next build)."""
    case = CASES["verify-gemma4-groups"]
    builder = make_builder(case, device)
    first = build(builder, case, block_tables(case, seed=1))
    capacity = builder.capacity_bytes
    shorter = StepCase(tuple(s - 1 for s in case.seq_lens), case.query_lens, case.block_sizes)
    tables = block_tables(shorter, seed=2)  # same widths: the same layout
    second = build(builder, shorter, tables)
    assert builder.capacity_bytes == capacity
    assert plain_step(second.common) == plain_step(reference(shorter, tables, device))
    assert second.common[4].block_table.data_ptr() == first.common[4].block_table.data_ptr()
    assert first.common[0].seq_lens_cpu.tolist() == list(shorter.seq_lens)


def _with_table_width(name: str) -> StepCase:
    case = CASES[name]
    return StepCase(case.seq_lens, case.query_lens, (4, 1), case.padding)


# Two steps through one builder: other batch sizes, token counts and table widths,
# and padding entries (position 0, slot -1) over a layout whose previous step had
# real tokens there.
STEP_PAIRS = {
    "small-then-large": (
        _with_table_width("decode-one-group"),
        _with_table_width("chunked-prefill-padded"),
    ),
    "large-then-small": (
        _with_table_width("chunked-prefill-padded"),
        _with_table_width("decode-one-group"),
    ),
    "padding-reset-after-fuller-step": (
        StepCase((9, 17), (4, 4), (4, 16)),
        StepCase((9, 17), (1, 4), (4, 16), padding=3),
    ),
}


@pytest.mark.parametrize("steps", list(STEP_PAIRS), ids=list(STEP_PAIRS))
def test_second_step_matches_the_reference(steps: str, device) -> None:
    first_case, second_case = STEP_PAIRS[steps]
    builder = make_builder(first_case, device)
    build(builder, first_case, block_tables(first_case, seed=3))
    tables = block_tables(second_case, seed=4)
    step = build(builder, second_case, tables)
    assert plain_step(step.common) == plain_step(reference(second_case, tables, device))


def test_buffers_grow_past_their_sizing(device) -> None:
    case = CASES["verify-gemma4-groups"]
    builder = make_builder(case, device, max_num_seqs=1, max_num_tokens=1, max_blocks_per_seq=1)
    capacity = builder.capacity_bytes
    tables = block_tables(case)
    step = build(builder, case, tables)
    assert builder.capacity_bytes > capacity
    assert plain_step(step.common) == plain_step(reference(case, tables, device))


def test_host_buffer_is_pinned_only_for_cuda(device) -> None:
    case = CASES["mixed-query-lens"]
    builder = make_builder(case, device)
    common = build(builder, case, block_tables(case)).common[0]
    on_cuda = device.type == "cuda"
    assert builder.pin_memory == on_cuda
    assert common.query_start_loc_cpu.is_pinned() == on_cuda
    assert (common.query_start_loc_cpu.device.type, common.block_table.device.type) == (
        "cpu",
        device.type,
    )


BAD_INPUT = {
    "one-row-table-for-two-requests": (
        ((5, 6), (1, 1), {0: np.zeros((1, 2), np.int32)}, None),
        r"block table \(1, 2\) for 2 requests",
    ),
    "seq-lens-length": (((5,), (1, 1), {0: np.zeros((2, 2), np.int32)}, None), "1 seq_lens"),
    "padding-below-tokens": (
        ((5, 6), (2, 2), {0: np.zeros((2, 2), np.int32)}, 3),
        "4 tokens padded to 3",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT), ids=list(BAD_INPUT))
def test_rejects_inputs_that_would_write_out_of_place(case: str) -> None:
    """The fast path does not validate, but never writes outside its regions."""
    (seq_lens, query_lens, tables, padded), message = BAD_INPUT[case]
    builder = StepMetadataBuilder(
        (4,), "cpu", max_num_seqs=2, max_num_tokens=4, max_blocks_per_seq=2
    )
    with pytest.raises(ValueError, match=message):
        builder.build(seq_lens, query_lens, tables, num_tokens_padded=padded)


@pytest.mark.gpu
@gpu_only
def test_next_step_waits_for_the_previous_copy() -> None:
    """A step rewrites the pinned host buffer while the previous step's non_blocking
    copy may still be queued behind a busy stream: the builder must wait for it."""
    device = torch.device("cuda")
    case = CASES["verify-gemma4-groups"]
    builder = make_builder(case, device)
    first_tables, second_tables = block_tables(case, seed=5), block_tables(case, seed=6)
    torch.cuda._sleep(50_000_000)  # keep the stream busy so the first copy is still queued
    first = build(builder, case, first_tables)
    first_slots = torch.stack([m.slot_mapping for m in first.common.values()]).clone()
    second = build(builder, case, second_tables)
    expected_first = torch.stack(
        [m.slot_mapping for m in reference(case, first_tables, device).values()]
    )
    assert torch.equal(first_slots, expected_first)
    assert plain_step(second.common) == plain_step(reference(case, second_tables, device))
