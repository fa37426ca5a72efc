"""Block allocation: one free list per KV-cache group, blocks owned by requests.

Each KV-cache group has its own block table, so each gets its own pool of
``num_blocks`` pages (the runner allocates every group's tensors with that
many blocks). What a request needs per group depends on the group's kind:

- full attention: ``ceil(num_tokens / block_size)`` blocks, kept to the end;
- sliding window ``W``: the same table length, but blocks wholly before the
  first position any future query can see (``num_computed - W + 1``) go back to
  the pool and their table entries become ``NULL_BLOCK_ID``;
- state (Mamba-like) layers: one real block, the request's state slot, first
  in its table; the rest of the table is ``NULL_BLOCK_ID`` padding, so the
  table covers the sequence as every group's must for the common metadata.

KV-sharing layers have no spec of their own and sit in their target's group,
so they never allocate anything. Allocation is all-or-nothing across groups:
a request that cannot get every block it needs gets none, so a failed
allocation can never leave another request's blocks touched.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from attngroup.kernels.metadata import cdiv
from attngroup.reference_engine.engine.step import NULL_BLOCK_ID


class GroupInfoLike(Protocol):
    """The fields of ``model_runner.KVCacheGroupInfo`` the allocator reads."""

    block_size: int
    sliding_window: int | None
    is_state: bool


class GroupKind(StrEnum):
    FULL = "full"
    SLIDING = "sliding"
    STATE = "state"


@dataclass(frozen=True)
class GroupLayout:
    """What the allocator needs to know of one KV-cache group."""

    block_size: int
    kind: GroupKind
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if (self.kind is GroupKind.SLIDING) != (self.sliding_window is not None):
            raise ValueError(
                f"a {self.kind} group takes a sliding window only when sliding: {self}"
            )

    @classmethod
    def from_group_info(cls, info: GroupInfoLike) -> GroupLayout:
        """The layout of a KV-cache group as the model runner describes it."""
        if info.is_state:
            return cls(info.block_size, GroupKind.STATE)
        if info.sliding_window is not None:
            return cls(info.block_size, GroupKind.SLIDING, info.sliding_window)
        return cls(info.block_size, GroupKind.FULL)

    def blocks_for(self, num_tokens: int) -> int:
        """Block-table length that covers ``num_tokens`` tokens."""
        return cdiv(num_tokens, self.block_size)

    def num_new_blocks(self, table: Sequence[int], num_tokens: int) -> int:
        """Blocks to take from the pool to cover ``num_tokens`` (a state group: its one slot)."""
        if self.kind is GroupKind.STATE:
            return 0 if table else 1
        return max(0, self.blocks_for(num_tokens) - len(table))

    def first_needed_block(self, num_computed_tokens: int) -> int:
        """Index of the first block a query at ``num_computed_tokens`` or later can read."""
        if self.sliding_window is None:  # only a sliding group has a window (__post_init__)
            return 0
        return max(0, num_computed_tokens - self.sliding_window + 1) // self.block_size


class NoFreeBlocksError(RuntimeError):
    """A pool has fewer free blocks than asked for."""


class BlockPool:
    """The free list of one KV-cache group. Block ``NULL_BLOCK_ID`` is reserved."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"a block pool needs >= 2 blocks (one is the null block), got {num_blocks}"
            )
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(b for b in range(num_blocks) if b != NULL_BLOCK_ID)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def capacity(self) -> int:
        return self.num_blocks - 1

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise NoFreeBlocksError(f"asked for {count} blocks, {len(self._free)} free")
        return [self._free.popleft() for _ in range(count)]

    def free(self, block_ids: Sequence[int]) -> None:
        self._free.extend(block_ids)

    def free_ids(self) -> list[int]:
        return list(self._free)


class BlockManager:
    """Blocks per request per KV-cache group, with all-or-nothing allocation."""

    def __init__(self, layouts: Sequence[GroupLayout], num_blocks: int) -> None:
        self.layouts = tuple(layouts)
        self.pools = tuple(BlockPool(num_blocks) for _ in self.layouts)
        self._tables: dict[str, list[list[int]]] = {}
        # Per request, tokens every group's table covers, and per group the first table
        # index a window may still free: the per-step calls of a steady decode (nothing to
        # allocate, at most a block or two to free) then cost no walk over the tables.
        self._covered: dict[str, int] = {}
        self._window_start: dict[str, list[int]] = {}

    @classmethod
    def for_group_infos(cls, infos: Sequence[GroupInfoLike], num_blocks: int) -> BlockManager:
        return cls([GroupLayout.from_group_info(info) for info in infos], num_blocks)

    def block_ids(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        """The request's block table per group (``NULL_BLOCK_ID`` where a window freed one)."""
        tables = self._tables.get(request_id) or [[] for _ in self.layouts]
        return tuple(tuple(table) for table in tables)

    def table(self, request_id: str, group_id: int) -> Sequence[int]:
        """The request's live table in one group (read only: no copy, for per-step deltas)."""
        tables = self._tables.get(request_id)
        return tables[group_id] if tables else ()

    def num_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """Per group, how many blocks covering ``num_tokens`` tokens would take from the pool."""
        tables = self._tables.get(request_id) or [[] for _ in self.layouts]
        return [
            layout.num_new_blocks(table, num_tokens)
            for layout, table in zip(self.layouts, tables, strict=True)
        ]

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        needed = self.num_new_blocks(request_id, num_tokens)
        return all(n <= pool.num_free for n, pool in zip(needed, self.pools, strict=True))

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        """Grow the request's tables to cover ``num_tokens``; False (and no change) when short."""
        if num_tokens <= self._covered.get(request_id, -1):
            return True
        needed = self.num_new_blocks(request_id, num_tokens)
        if any(n > pool.num_free for n, pool in zip(needed, self.pools, strict=True)):
            return False
        tables = self._tables.setdefault(request_id, [[] for _ in self.layouts])
        for layout, table, pool, count in zip(
            self.layouts, tables, self.pools, needed, strict=True
        ):
            table.extend(pool.allocate(count))
            padding = layout.blocks_for(num_tokens) - len(table)
            table.extend([NULL_BLOCK_ID] * max(0, padding))  # only a state group's table pads
        self._covered[request_id] = min(
            len(table) * layout.block_size
            for layout, table in zip(self.layouts, tables, strict=True)
        )
        return True

    def free_out_of_window(self, request_id: str, num_computed_tokens: int) -> int:
        """Return sliding-window blocks no future query can read; the number freed."""
        freed = 0
        starts = self._window_start.setdefault(request_id, [0] * len(self.layouts))
        for group, (layout, table, pool) in enumerate(
            zip(self.layouts, self._tables.get(request_id, ()), self.pools, strict=False)
        ):
            end = min(layout.first_needed_block(num_computed_tokens), len(table))
            for index in range(starts[group], end):  # entries before the start are freed already
                if table[index] != NULL_BLOCK_ID:
                    pool.free([table[index]])
                    table[index] = NULL_BLOCK_ID
                    freed += 1
            starts[group] = max(starts[group], end)
        return freed

    def free(self, request_id: str) -> None:
        """Return every block of the request (finished or preempted)."""
        self._covered.pop(request_id, None)
        self._window_start.pop(request_id, None)
        for table, pool in zip(self._tables.pop(request_id, ()), self.pools, strict=False):
            pool.free([block for block in table if block != NULL_BLOCK_ID])

    @property
    def request_ids(self) -> list[str]:
        return list(self._tables)

    def num_used_blocks(self) -> int:
        return sum(pool.capacity - pool.num_free for pool in self.pools)

    def check_invariants(self) -> None:
        """Every block is either free or owned by exactly one request, never both.

        Cheap enough to run after every step in the suites: it is what proves
        that preemption and window freeing never hand a block to two owners.
        """
        for group_id, pool in enumerate(self.pools):
            owners: dict[int, str] = {}
            for request_id, tables in self._tables.items():
                for block in tables[group_id]:
                    if block == NULL_BLOCK_ID:
                        continue
                    if block in owners:
                        raise AssertionError(
                            f"group {group_id}: block {block} owned by {owners[block]} and {request_id}"
                        )
                    owners[block] = request_id
            free = pool.free_ids()
            if len(set(free)) != len(free):
                raise AssertionError(f"group {group_id}: a block is on the free list twice")
            both = set(free) & owners.keys()
            if both:
                raise AssertionError(f"group {group_id}: blocks {sorted(both)} are free and owned")
            if len(free) + len(owners) != pool.capacity:
                raise AssertionError(
                    f"group {group_id}: {len(free)} free + {len(owners)} owned != {pool.capacity} blocks"
                )
