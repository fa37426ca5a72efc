"""Scheduler decisions without a model: admission, capacity checks and preemption order."""

from __future__ import annotations

import pytest

from attngroup.reference_engine.engine.block_manager import BlockManager, GroupKind, GroupLayout
from attngroup.reference_engine.engine.request import Request, RequestStatus, SamplingParams
from attngroup.reference_engine.engine.scheduler import Scheduler, SchedulerCapacityError

FULL = GroupLayout(4, GroupKind.FULL)
STATE = GroupLayout(4, GroupKind.STATE)


def _request(index: int, prompt_len: int, max_tokens: int = 4) -> Request:
    return Request(
        f"r{index}", tuple(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens)
    )


@pytest.mark.parametrize(("layout", "fits"), [(STATE, True), (FULL, False)], ids=["state", "full"])
def test_capacity_check_counts_a_state_group_as_one_block(layout: GroupLayout, fits: bool) -> None:
    scheduler = Scheduler(BlockManager([layout], num_blocks=3))
    request = _request(0, prompt_len=100)
    if fits:
        scheduler.add_request(request)
        assert scheduler.waiting[0] is request
    else:
        with pytest.raises(SchedulerCapacityError, match="needs 26 blocks of KV-cache group 0"):
            scheduler.add_request(request)


def test_preemption_takes_the_latest_request_and_keeps_its_outputs() -> None:
    scheduler = Scheduler(BlockManager([FULL], num_blocks=5), max_num_batched_tokens=64)
    first, second = _request(0, 4, max_tokens=8), _request(1, 8, max_tokens=8)
    scheduler.add_request(first)
    scheduler.add_request(second)
    output = scheduler.schedule()  # 1 + 2 of the 4 usable blocks
    assert [item.request for item in output.scheduled] == [first, second]
    for item in output.scheduled:
        scheduler.update_after_step(item, [7])
    # first now needs a second block (5 tokens), second a third (9 tokens): only one is free.
    output = scheduler.schedule()
    assert output.preempted == ("r1",)
    assert [item.request for item in output.scheduled] == [first]
    assert second.status is RequestStatus.PREEMPTED and second.num_computed_tokens == 0
    assert second.output_token_ids == [7]  # recomputed later, not regenerated
    assert scheduler.waiting[0] is second
    assert scheduler.block_manager.block_ids("r1") == ((),)
    scheduler.block_manager.check_invariants()
