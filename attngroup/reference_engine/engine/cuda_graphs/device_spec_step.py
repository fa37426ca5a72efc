"""Greedy speculative steps that stay on the device: one graph per bucket, no host in the loop.

A speculative step replayed as separate graphs still returns to the host twice (the
verify's tokens before emission, the drafts before the next verify), so host work and
kernels run one after the other. ``DeviceSpecStep`` keeps the batch on the device between
steps and captures the whole step as one graph (``capture``): the verify metadata
computed from each request's cached length and block table (``CapturedStep.fill_on_device``),
the verify pass, the target's lm-head, greedy rejection (``greedy_rejection_sample``),
the next cached lengths, then the constant-position draft's k passes with their lm-head
and argmax, whose tokens become the next verify's input. Each replay leaves its emitted
tokens and the next drafts in a result buffer that ``launch`` copies to pinned host memory
behind an event, so the host reads a step's result while the device runs the next one.

The draft follows ``spec_decode.constant_position`` (the Gemma 4 assistant: Q-only, no KV
writes): a request holding L tokens after the verify drafts at RoPE position L - 1 over
the target's cache at 0 .. L - 2, fed the token at L - 1 and the target's hidden state at
L - 2, then its own post-projected state. Only drafters that keep no host state and
write no KV of their own qualify; ``device_spec_steps`` and the engine's
``spec_decode.device_loop`` decide which batches run here.

Padding rows (``real`` False) run as ``CapturedStep`` pads them: query-long sequences
over the null block with the padding slot, so they write no KV; their lengths never move.
On the CPU the graph is ``HostReplay``: the step's Python runs on every launch, over the
same persistent buffers, so CI runs this path too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attngroup.reference_engine.engine.cuda_graphs.capture_plan import StepKind
from attngroup.reference_engine.engine.cuda_graphs.graph_steps import (
    CapturedStep,
    GraphSteps,
    capture,
    plans_on_host,
)
from attngroup.reference_engine.engine.rejection_sampler import (
    greedy_rejection_sample,
    num_emitted,
)


@dataclass(frozen=True)
class SpecResult:
    """One launched step's result on its way to the host: read it with ``wait``."""

    host: torch.Tensor  # int64 [bucket, 2 (k + 1)], pinned on CUDA
    done: torch.cuda.Event | None  # None on the CPU (the copy has happened)
    num_spec_tokens: int

    def wait(self) -> np.ndarray:
        """[bucket, 2 (k + 1)]: per row the emitted tokens (placeholders after them), then
        the next verify's input (the last emitted token and the k new drafts)."""
        if self.done is not None:
            self.done.synchronize()
        return self.host.numpy()


class DeviceSpecStep:
    """One bucket's verify and draft steps captured together, and the batch they carry."""

    def __init__(
        self, verify: CapturedStep, draft: CapturedStep, *, target: Any, draft_model: Any
    ) -> None:
        if verify.bucket != draft.bucket or draft.query_len != 1:
            raise ValueError("the verify and its one-token draft steps must share one bucket")
        self.verify, self.draft = verify, draft
        self.target, self.draft_model = target, draft_model
        self.bucket, self.k = verify.bucket, verify.query_len - 1
        device = verify.context.device
        self.device = device
        bucket, k = self.bucket, self.k
        self.capacity = verify.context.capacity  # context tokens a request may reach here
        self.kv_groups = tuple(sorted({*verify.kv_groups, *draft.kv_groups}))
        widths = {**verify.widths, **draft.widths}
        self.widths = {g: widths[g] for g in self.kv_groups}
        # The batch between steps: the next verify's tokens (last emitted, then k drafts),
        # each request's cached target tokens, which rows are real, and the block tables.
        self.verify_ids = torch.zeros((bucket, k + 1), dtype=torch.long, device=device)
        self.context_lens = torch.zeros(bucket, dtype=torch.long, device=device)
        self.real = torch.zeros(bucket, dtype=torch.bool, device=device)
        self.tables = {
            g: torch.zeros((bucket, self.widths[g]), dtype=torch.int32, device=device)
            for g in self.kv_groups
        }
        self.result = torch.zeros((bucket, 2 * (k + 1)), dtype=torch.long, device=device)
        self._row_starts = torch.arange(bucket, device=device) * (k + 1)
        # Two host buffers: a step's result is read while the next step's copy is queued.
        pinned = device.type == "cuda"
        self._host = [torch.zeros_like(self.result, device="cpu") for _ in range(2)]
        self._host = [host.pin_memory() for host in self._host] if pinned else self._host
        self._events = [torch.cuda.Event() if pinned else None for _ in range(2)]
        self._next_host = 0
        with torch.inference_mode():
            self.graph = capture(self._step, device)  # every row padding: nothing written

    def _step(self) -> tuple[()]:
        """The captured step (see the module docstring); results in ``self.result``."""
        verify, draft, k = self.verify, self.draft, self.k
        verify.fill_on_device(self.context_lens, self.real, self.tables)
        verify.input_ids.copy_(self.verify_ids.view(-1))
        hidden = verify.forward()
        logits = self.target.compute_logits(hidden).view(self.bucket, k + 1, -1)
        emitted = greedy_rejection_sample(self.verify_ids[:, 1:], logits)
        accepted = num_emitted(emitted) - 1
        next_lens = self.context_lens + 1 + accepted
        last = emitted.gather(1, accepted[:, None])
        # The assistant drafts at position L - 1 = next_lens over the cache 0 .. L - 2.
        draft.fill_on_device(next_lens - 1, self.real, self.tables, rope_positions=next_lens)
        draft.input_ids.copy_(last.view(-1))
        draft.extra[0].copy_(hidden[self._row_starts + accepted])
        self.result[:, : k + 1].copy_(emitted)
        self.result[:, k + 1 : k + 2].copy_(last)
        for step in range(k):
            normed, feedback = draft.forward()
            token = self.draft_model.compute_logits(normed).argmax(-1)
            self.result[:, k + 2 + step].copy_(token)
            draft.input_ids.copy_(token)
            draft.extra[0].copy_(feedback)
        self.verify_ids.copy_(self.result[:, k + 1 :])
        self.context_lens.copy_(torch.where(self.real, next_lens, self.context_lens))
        return ()

    @torch.inference_mode()
    def load(
        self,
        verify_ids: Sequence[Sequence[int]],
        context_lens: Sequence[int],
        block_ids: Sequence[Sequence[Sequence[int]]],
    ) -> None:
        """Start a batch of ``len(context_lens)`` requests: each one's next verify tokens,
        cached target tokens and blocks per KV-cache group, which must cover every position
        a launch writes (entries past the capacity are never read: the engine keeps
        contexts within it)."""
        num_real = len(context_lens)
        if not 0 < num_real <= self.bucket:
            raise ValueError(f"{num_real} requests do not fit bucket {self.bucket}")
        ids = torch.zeros_like(self.verify_ids, device="cpu")
        ids[:num_real] = torch.tensor(verify_ids, dtype=torch.long)
        lens = torch.zeros_like(self.context_lens, device="cpu")
        lens[:num_real] = torch.tensor(context_lens, dtype=torch.long)
        self.verify_ids.copy_(ids)
        self.context_lens.copy_(lens)
        self.real.copy_(torch.arange(self.bucket) < num_real)
        for g in self.kv_groups:
            width = self.widths[g]
            padded = np.zeros((self.bucket, width), dtype=np.int32)
            for row, blocks in enumerate(block_ids):
                table = blocks[g][:width]
                padded[row, : len(table)] = table
            self.tables[g].copy_(torch.from_numpy(padded))

    @torch.inference_mode()
    def write_blocks(
        self, group: int, rows: list[int], columns: list[int], blocks: list[int]
    ) -> None:
        """Blocks the host allocated since the last launch, written before the next one.

        From pinned memory without waiting: a copy from pageable memory would hold the
        host until the device reached it, i.e. until the step in flight ended."""
        if not rows:
            return
        update = torch.tensor([rows, columns, blocks], dtype=torch.long)
        if self.device.type == "cuda":
            update = update.pin_memory()  # the caching host allocator keeps it until copied
        update = update.to(self.device, non_blocking=True)
        self.tables[group][update[0], update[1]] = update[2].to(torch.int32)

    @torch.inference_mode()
    def launch(self) -> SpecResult:
        """Replay the step and start copying its result to the host (not waited for)."""
        self.graph.replay()
        index = self._next_host
        self._next_host = 1 - index
        host, event = self._host[index], self._events[index]
        host.copy_(self.result, non_blocking=event is not None)
        if event is not None:
            event.record()
        return SpecResult(host=host, done=event, num_spec_tokens=self.k)


class DeviceSpecSteps:
    """The runner's device speculative steps over its ``GraphSteps``, one per bucket."""

    def __init__(self, graphs: GraphSteps, target: Any, draft: Any, draft_extra: torch.Tensor):
        self.graphs, self.target, self.draft = graphs, target, draft
        self.draft_extra = draft_extra  # a draft pass's extra input, [0, hidden]: its shape
        self._steps: dict[int, DeviceSpecStep] = {}

    def get(self, num_reqs: int) -> tuple[DeviceSpecStep | None, str]:
        """The step for ``num_reqs`` requests (captured on first use), or None and why not."""
        plan = self.graphs.plan
        verify, drafting = plan.step(StepKind.VERIFY), plan.step(StepKind.DRAFT)
        if verify is None or drafting is None:
            return None, "no verify or draft step is planned"
        bucket = verify.bucket_for(num_reqs)
        if bucket is None or drafting.bucket_for(num_reqs) != bucket:
            return None, f"no bucket captures both the verify and the draft of {num_reqs} requests"
        groups = [*self.graphs.groups[verify.kind], *self.graphs.groups[drafting.kind]]
        planned = sorted({group.name for group in groups if plans_on_host(group.builder)})
        if planned:
            return None, f"groups {', '.join(planned)} plan with the step's lengths on the host"
        step = self._steps.get(bucket)
        if step is None:
            with torch.inference_mode():
                step = DeviceSpecStep(
                    self.graphs.captured_step(verify, bucket, self.target),
                    self.graphs.captured_step(drafting, bucket, self.draft, (self.draft_extra,)),
                    target=self.target,
                    draft_model=self.draft,
                )
            self._steps[bucket] = step
        return step, f"bucket {bucket}"
