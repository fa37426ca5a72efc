"""The engine's greedy speculative steps kept on the device, their bookkeeping one step behind.

While every running request decodes greedily with k drafts and nothing waits, the engine
stops rebuilding the batch each step: the runner's device step
(``cuda_graphs.device_spec_step``) carries it from step to step, and each engine step
launches the next captured step before it does the host's part of the previous one
(emitted tokens, stops, acceptance statistics, blocks for the step after next), so that
host work runs while the device computes instead of after it.

Blocks ahead: a launched step writes KV up to position ``c + 2k + 1`` of a request whose
cached length the host knew to be ``c`` one step earlier (k + 1 tokens accepted, then
k + 1 verified): exactly what the scheduler reserves for a verify chunk with its
lookahead, so no launch waits for the step before it. New blocks reach the device's
tables before the next launch; blocks a sliding window frees stay there, outside every
later query's window, so no kernel reads them.

A request that stops (``max_tokens``) or arrivals, a failed allocation or a context
reaching the captured capacity end the run: the step still in flight is read (a stopped
request's rows, past its stop, are dropped) and the next engine step starts over from the
requests' exact state (here again, with the smaller batch, or on the scheduler's path).
``counts`` says how many steps ran here and why others did not.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from attngroup.reference_engine.engine.rejection_sampler import PLACEHOLDER_TOKEN_ID
from attngroup.reference_engine.engine.request import Request
from attngroup.reference_engine.engine.scheduler import ScheduledRequest, Scheduler


@dataclass(frozen=True)
class _InFlight:
    """A launched step: the requests of its rows and its result on the way to the host."""

    requests: tuple[Request, ...]
    result: Any  # cuda_graphs.device_spec_step.SpecResult


class DeviceLoop:
    """Runs engine steps on the runner's device step while the batch qualifies."""

    def __init__(self, runner: Any, scheduler: Scheduler, stats: Any) -> None:
        self.runner, self.scheduler, self.stats = runner, scheduler, stats
        self.block_manager = scheduler.block_manager
        self.k = stats.spec.num_spec_tokens
        # Engine steps read here ("device"), runs ended ("stopped: <why>"), and the
        # scheduler's steps with the reason the batch did not qualify ("eager: <why>").
        self.counts: Counter[str] = Counter()
        self._in_flight: deque[_InFlight] = deque()
        self._device_step: Any = None
        self._batch: tuple[Request, ...] = ()
        self._on_device: list[list[int]] = []  # per row, per group: table entries sent
        self._stop: str | None = None

    def step(self) -> list[Request] | None:
        """One engine step here: the requests that finished in the step read; None when
        the batch does not qualify (nothing in flight: the scheduler's step runs)."""
        if not self._in_flight:
            reason = self._start()
            if reason is not None:
                self.counts[f"eager: {reason}"] += 1
                return None
            self._launch()
        if self._stop is None and self.scheduler.waiting:
            self._stop = "requests are waiting"
        if self._stop is None:
            self._launch()
        elif len(self._in_flight) == 1:
            self.counts[f"stopped: {self._stop}"] += 1
        return self._read_oldest()

    def _start(self) -> str | None:
        """Load the running batch onto the device step; why not, when it does not qualify."""
        running, k = tuple(self.scheduler.running), self.k
        if self.scheduler.waiting:
            return "requests are waiting"
        if not running:
            return "no running request"
        if not all(
            r.is_decoding and len(r.spec_token_ids) == k and r.sampling_params.is_greedy
            for r in running
        ):
            return f"not every request decodes greedily with {k} drafts"
        if len(running) * (k + 1) > self.scheduler.max_num_batched_tokens:
            return "the batch's verify exceeds the token budget"
        device_step, reason = self.runner.device_spec_step(len(running))
        if device_step is None:
            return reason
        for request in running:
            shortfall = self._reserve(device_step, request)
            if shortfall is not None:
                return shortfall
        bm = self.block_manager
        device_step.load(
            [(r.output_token_ids[-1], *r.spec_token_ids) for r in running],
            [r.num_computed_tokens for r in running],
            [bm.block_ids(r.request_id) for r in running],
        )
        self._on_device = [
            [
                min(len(bm.table(r.request_id, g)), device_step.widths[g])
                for g in device_step.kv_groups
            ]
            for r in running
        ]
        self._device_step, self._batch, self._stop = device_step, running, None
        return None

    def _reserve(self, device_step: Any, request: Request) -> str | None:
        """Blocks for the step after next (see the module docstring); why not, if short."""
        end = request.num_computed_tokens + 2 * (self.k + 1)
        if end > device_step.capacity:
            return "a context reaches the captured capacity"
        self.block_manager.free_out_of_window(request.request_id, request.num_computed_tokens)
        if not self.block_manager.allocate(request.request_id, end):
            return "the pools are short of blocks"
        return None

    def _launch(self) -> None:
        self._in_flight.append(_InFlight(self._batch, self._device_step.launch()))

    def _read_oldest(self) -> list[Request]:
        """The host's part of the oldest launched step; the requests it finished."""
        started = time.perf_counter()
        flight = self._in_flight.popleft()
        rows = flight.result.wait()[: len(flight.requests)].tolist()
        self.stats.timings.device_wait += time.perf_counter() - started
        k, finished = self.k, list[Request]()
        for request, row in zip(flight.requests, rows, strict=True):
            if request.is_finished:
                continue  # stopped in an earlier step: these tokens lie past its stop
            emitted = [token for token in row[: k + 1] if token != PLACEHOLDER_TOKEN_ID]
            self.stats.spec.record(k, len(emitted) - 1)
            before = len(request.output_token_ids)
            self.scheduler.update_after_step(ScheduledRequest(request, 1, k), emitted)
            self.stats.num_generated_tokens += len(request.output_token_ids) - before
            if request.is_finished:
                finished.append(request)
            else:
                request.spec_token_ids = tuple(row[k + 2 :])
        if finished:
            self._stop = self._stop or "a request finished"
            self.runner.remove_requests([request.request_id for request in finished])
        elif self._stop is None:
            self._reserve_and_send(flight.requests)
        if self._in_flight and all(request.is_finished for request in flight.requests):
            self.counts["dropped: every request had finished"] += len(self._in_flight)
            self._in_flight.clear()  # nothing left to read in them
        self.counts["device"] += 1
        self.stats.timings.sampling += time.perf_counter() - started
        return finished

    def _reserve_and_send(self, batch: tuple[Request, ...]) -> None:
        """Blocks for the step after next, and the new ones into the device's tables."""
        step, bm = self._device_step, self.block_manager
        updates: dict[int, tuple[list[int], list[int], list[int]]] = {
            g: ([], [], []) for g in step.kv_groups
        }
        for row, request in enumerate(batch):
            shortfall = self._reserve(step, request)
            if shortfall is not None:
                self._stop = shortfall
                return
            sent = self._on_device[row]
            for index, g in enumerate(step.kv_groups):
                table = bm.table(request.request_id, g)
                end = min(len(table), step.widths[g])
                if end > sent[index]:
                    rows, columns, blocks = updates[g]
                    rows.extend([row] * (end - sent[index]))
                    columns.extend(range(sent[index], end))
                    blocks.extend(table[sent[index] : end])
                    sent[index] = end
        for g, (rows, columns, blocks) in updates.items():
            step.write_blocks(g, rows, columns, blocks)
