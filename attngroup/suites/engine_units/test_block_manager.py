"""The per-group block allocator: coverage, windows, state slots, all-or-nothing, no leaks."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from attngroup.reference_engine.engine.block_manager import BlockManager, GroupKind, GroupLayout
from attngroup.reference_engine.engine.step import NULL_BLOCK_ID

FULL = GroupLayout(4, GroupKind.FULL)
SLIDING = GroupLayout(8, GroupKind.SLIDING, sliding_window=10)
STATE = GroupLayout(16, GroupKind.STATE)


@pytest.mark.parametrize(
    ("layout", "num_tokens", "expected"),
    [(FULL, 1, 1), (FULL, 4, 1), (FULL, 5, 2), (SLIDING, 17, 3)],
    ids=["full-1", "full-4", "full-5", "sliding-17"],
)
def test_table_covers_tokens(layout: GroupLayout, num_tokens: int, expected: int) -> None:
    manager = BlockManager([layout], num_blocks=8)
    assert manager.allocate("a", num_tokens)
    (table,) = manager.block_ids("a")
    assert len(table) == expected
    assert NULL_BLOCK_ID not in table
    manager.check_invariants()


def test_allocation_is_all_or_nothing_across_groups() -> None:
    manager = BlockManager([FULL, SLIDING], num_blocks=4)  # 3 usable blocks per group
    assert manager.allocate("a", 12)  # full: 3 blocks, sliding: 2
    free_before = [pool.num_free for pool in manager.pools]
    assert not manager.allocate("b", 8)  # sliding could, full cannot
    assert [pool.num_free for pool in manager.pools] == free_before
    assert manager.block_ids("b") == ((), ())
    manager.check_invariants()


def test_sliding_window_frees_blocks_that_left_the_window() -> None:
    manager = BlockManager([FULL, SLIDING], num_blocks=16)
    assert manager.allocate("a", 40)  # sliding: 5 blocks of 8
    # A query at position 30 sees positions 21..30: sliding blocks 0 and 1 (positions 0..15) are out.
    assert manager.free_out_of_window("a", 30) == 2
    full, sliding = manager.block_ids("a")
    assert NULL_BLOCK_ID not in full
    assert sliding[:2] == (NULL_BLOCK_ID, NULL_BLOCK_ID)
    assert NULL_BLOCK_ID not in sliding[2:]
    assert manager.free_out_of_window("a", 30) == 0  # idempotent
    manager.check_invariants()
    manager.free("a")
    assert manager.num_used_blocks() == 0
    manager.check_invariants()


@pytest.mark.parametrize(
    ("num_tokens", "table_len"), [(1, 1), (17, 2), (100, 7)], ids=["t1", "t17", "t100"]
)
def test_state_group_keeps_one_slot_per_request(num_tokens: int, table_len: int) -> None:
    manager = BlockManager([STATE], num_blocks=3)
    assert manager.allocate("a", 1)
    (slot,) = manager.block_ids("a")[0]
    assert manager.allocate("a", num_tokens)
    (table,) = manager.block_ids("a")
    assert table == (slot,) + (NULL_BLOCK_ID,) * (table_len - 1)
    assert manager.pools[0].num_free == 1
    assert manager.free_out_of_window("a", num_tokens) == 0
    manager.free("a")
    manager.check_invariants()
    assert manager.num_used_blocks() == 0


def test_null_block_is_never_handed_out() -> None:
    manager = BlockManager([FULL], num_blocks=5)
    assert manager.allocate("a", 16)
    assert sorted(manager.block_ids("a")[0]) == [1, 2, 3, 4]
    assert not manager.allocate("b", 1)


def test_invariant_check_catches_a_shared_block() -> None:
    manager = BlockManager([FULL], num_blocks=8)
    assert manager.allocate("a", 4)
    assert manager.allocate("b", 4)
    manager._tables["b"][0][0] = manager._tables["a"][0][0]  # corrupt on purpose
    with pytest.raises(AssertionError, match="owned by a and b"):
        manager.check_invariants()


_OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["grow", "slide", "free"]), st.sampled_from("abcd"), st.integers(1, 60)
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(operations=_OPERATIONS)
def test_random_operations_keep_every_block_owned_once(operations) -> None:
    manager = BlockManager([FULL, SLIDING, STATE], num_blocks=12)
    lengths: dict[str, int] = {}
    for operation, request, amount in operations:
        if operation == "grow":
            target = lengths.get(request, 0) + amount
            if manager.allocate(request, target):
                lengths[request] = target
        elif operation == "slide" and request in lengths:
            manager.free_out_of_window(request, min(amount, lengths[request]))
        elif operation == "free":
            manager.free(request)
            lengths.pop(request, None)
        manager.check_invariants()
    for request in list(lengths):
        manager.free(request)
    assert manager.num_used_blocks() == 0


class _WalkingManager(BlockManager):
    """The same allocator with its per-request shortcuts forgotten before every call, so
    each ``allocate`` and window free walks the whole tables."""

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        self._covered.clear()
        return super().allocate(request_id, num_tokens)

    def free_out_of_window(self, request_id: str, num_computed_tokens: int) -> int:
        self._window_start.clear()
        return super().free_out_of_window(request_id, num_computed_tokens)


# A request freed and grown again starts with no shortcut of its first life.
_REGROWN = [("grow", "a", 40), ("slide", "a", 40), ("free", "a", 1), ("grow", "a", 8)]


@settings(max_examples=60, deadline=None)
@given(operations=_OPERATIONS)
@example(operations=[*_REGROWN, ("grow", "a", 32), ("slide", "a", 40)])
def test_steady_decode_shortcuts_change_nothing(operations) -> None:
    """The kept covered-token count and first freeable window index give the same answers
    and the same tables as walking the tables on every call."""
    fast = BlockManager([FULL, SLIDING, STATE], num_blocks=12)
    walking = _WalkingManager([FULL, SLIDING, STATE], num_blocks=12)
    lengths: dict[str, int] = {}
    for operation, request, amount in operations:
        if operation == "grow":
            target = lengths.get(request, 0) + amount
            allocated = fast.allocate(request, target)
            assert allocated == walking.allocate(request, target)
            if allocated:
                lengths[request] = target
        elif operation == "slide" and request in lengths:
            computed = min(amount, lengths[request])
            assert fast.free_out_of_window(request, computed) == walking.free_out_of_window(
                request, computed
            )
        elif operation == "free":
            fast.free(request)
            walking.free(request)
            lengths.pop(request, None)
        for known in lengths:
            assert fast.block_ids(known) == walking.block_ids(known)
