"""Continuous batching with chunked prefill and preemption by recompute.

Each step has a token budget (``max_num_batched_tokens``). Running requests
go first, in arrival order: a decoding request costs 1 + its drafts, a
request still prefilling gets the next chunk of its prompt that fits. Then
waiting requests are admitted while the budget, ``max_num_seqs`` and the
block pools allow.

When a running request cannot get the blocks it needs, the most recently
admitted running request is preempted: all its blocks go back to the pools,
it forgets its cache (``num_computed_tokens = 0``) and returns to the front
of the waiting queue; on readmission its prompt *and* the tokens it already
generated are prefilled again (recompute), so it continues where it stopped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from attngroup.reference_engine.engine.block_manager import BlockManager
from attngroup.reference_engine.engine.request import Request, RequestStatus
from attngroup.reference_engine.engine.step import ScheduledChunk, StepBatch


class SchedulerCapacityError(RuntimeError):
    """The pools cannot hold even one request on its own: it could never finish."""


@dataclass(frozen=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # known tokens run this step (prefill chunk or the last sample)
    num_draft_tokens: int  # drafts appended for verification


@dataclass(frozen=True)
class SchedulerOutput:
    batch: StepBatch
    scheduled: tuple[ScheduledRequest, ...]
    preempted: tuple[str, ...]

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 256,
        num_lookahead_tokens: int = 0,
    ) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # Slots past the verified tokens a drafter writes KV into after the step.
        self.num_lookahead_tokens = num_lookahead_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add_request(self, request: Request) -> None:
        worst_case = request.num_tokens + request.num_tokens_left + self.num_lookahead_tokens
        for group_id, (layout, pool) in enumerate(
            zip(self.block_manager.layouts, self.block_manager.pools, strict=True)
        ):
            # A sliding-window group holds only the window; every other group its worst case.
            needed = layout.num_new_blocks((), worst_case)
            if layout.sliding_window is None and needed > pool.capacity:
                raise SchedulerCapacityError(
                    f"request {request.request_id} needs {needed} blocks of KV-cache "
                    f"group {group_id} but the pool has {pool.capacity}: raise num_blocks or lower "
                    "the prompt length / max_tokens"
                )
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            item = self._try_schedule(request, budget)
            while item is None:
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
                item = self._try_schedule(request, budget)
            if item is None:
                break
            scheduled.append(item)
            budget -= item.num_new_tokens + item.num_draft_tokens
            index += 1
        while (
            not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
        ):
            request = self.waiting[0]
            item = self._try_schedule(request, budget)
            if item is None:
                if not self.running:
                    raise SchedulerCapacityError(
                        f"request {request.request_id} cannot be allocated even with every pool empty"
                    )
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(item)
            budget -= item.num_new_tokens
        return SchedulerOutput(
            StepBatch(tuple(self._chunk(item) for item in scheduled)),
            tuple(scheduled),
            tuple(preempted),
        )

    def _try_schedule(self, request: Request, budget: int) -> ScheduledRequest | None:
        """Blocks for the request's next chunk, or None when the pools are short."""
        num_new = min(request.num_uncomputed_tokens, budget)
        drafts = request.spec_token_ids if request.is_decoding else ()
        if len(drafts) + num_new > budget:
            drafts = ()  # no room to verify this step: decode one token and drop the drafts
            request.clear_drafts()
        self.block_manager.free_out_of_window(request.request_id, request.num_computed_tokens)
        end = request.num_computed_tokens + num_new + len(drafts) + self.num_lookahead_tokens
        if not self.block_manager.allocate(request.request_id, end):
            return None
        return ScheduledRequest(request, num_new, len(drafts))

    def _chunk(self, item: ScheduledRequest) -> ScheduledChunk:
        request = item.request
        start = request.num_computed_tokens
        tokens = request.token_ids_between(start, start + item.num_new_tokens)
        if item.num_draft_tokens:
            logits = "all"
        elif start + item.num_new_tokens == request.num_tokens:
            logits = "last"
        else:
            logits = "none"
        return ScheduledChunk(
            request_id=request.request_id,
            token_ids=(*tokens, *request.spec_token_ids[: item.num_draft_tokens]),
            start_position=start,
            block_ids=self.block_manager.block_ids(request.request_id),
            logits=logits,
        )

    def _preempt(self, request: Request) -> None:
        self.block_manager.free(request.request_id)
        request.num_computed_tokens = 0
        request.clear_drafts()
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def update_after_step(self, item: ScheduledRequest, emitted: list[int]) -> None:
        """Advance a scheduled request by the tokens its step emitted.

        ``emitted`` is empty for a mid-prefill chunk, one sampled token after a
        prefill end or plain decode, and ``a + 1`` tokens after verification
        (``a`` accepted drafts, then a recovered or bonus token). Rejected
        drafts' KV is rolled back by not counting it: the next chunk starts
        right after the accepted prefix and overwrites it.
        """
        request = item.request
        num_accepted_drafts = max(0, len(emitted) - 1) if item.num_draft_tokens else 0
        request.num_computed_tokens += item.num_new_tokens + num_accepted_drafts
        request.clear_drafts()
        request.append_output(emitted)
        if request.num_tokens_left <= 0:
            self.finish(request)
        elif request.num_uncomputed_tokens < 1:
            raise RuntimeError(
                f"request {request.request_id}: {request.num_computed_tokens} tokens computed of "
                f"{request.num_tokens} known; an unfinished request always has one to compute"
            )

    def finish(self, request: Request) -> None:
        request.status = RequestStatus.FINISHED
        self.running.remove(request)
        self.block_manager.free(request.request_id)
