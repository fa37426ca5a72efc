"""Engine steps replayed from CUDA graphs, one per step kind and batch-size bucket.

``GraphSteps`` serves the model runner's uniform passes (every request runs the same
number of tokens: target decode, verify, the draft's decode steps) from graphs captured
on first use per ``capture_plan`` bucket. Each ``CapturedStep`` owns:

- persistent buffers: input ids, positions, the draft's extra inputs, and its own
  ``StepMetadataBuilder`` sized exactly for the bucket, so every step's metadata lands in
  the same device addresses (query_start_loc, seq_lens, block tables ``capacity`` wide,
  slot mappings); ``fill`` refills them in place for a pass's rows and re-plans, and
  every ``replay`` until the next fill copies in only the inputs (the k steps of a
  constant-position draft share one fill; inputs that come from the previous replay are
  device-to-device copies, so the draft loop needs no trip through the host);
- padding: a batch of ``n`` requests runs ``bucket - n`` padding requests of the same
  query length over the null block, whose slots are the padding slot (they write no KV);
- per attention group, the metadata the graph was captured with: Triton's launch plan is
  fixed per bucket by capturing with ``max_seq_len`` = the context capacity (its grid and
  split-KV segments never change; programs read their own sequence's length), FlashInfer
  gets a CUDA-graph wrapper per group and bucket (``flashinfer_graph``) planned by every
  fill with the step's real lengths.

``fill_on_device`` writes the same buffers from device tensors alone, for a graph that
captures a pass together with the one that decides its lengths
(``device_spec_step``); ``captured_step`` hands such a graph the bucket's step.

On the CPU there is no graph: ``HostReplay`` re-runs the captured callable, which reads
only the persistent buffers, so CI exercises the fill-before-replay path and the padding.
A batch that fits no captured bucket, mixes query lengths or outgrows the capacity runs
eagerly (``counts`` records both).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

import numpy as np
import torch

from attngroup.kernels.backend import MetadataBuilder
from attngroup.kernels.backends.flashinfer_attn import FlashInferMetadataBuilder
from attngroup.kernels.backends.flashinfer_graph import FlashInferGraphWrapper
from attngroup.kernels.metadata import CommonAttentionMetadata, cdiv
from attngroup.kernels.ops.kv_cache_write import PADDING_SLOT
from attngroup.kernels.step_metadata import StepMetadataBuilder
from attngroup.reference_engine.engine.cuda_graphs.capture_plan import (
    CapturePlan,
    StepKind,
    StepPlan,
)
from attngroup.reference_engine.engine.step_rows import StepRows
from attngroup.reference_engine.models.common import ForwardContext

Outputs = Any  # a tensor or a tuple of tensors, [tokens, ...] each


@dataclass(frozen=True)
class GraphGroup:
    """One attention group a captured step runs: its eager builder and its layers."""

    name: str
    kv_cache_group: int
    builder: MetadataBuilder  # attention or state
    layer_names: tuple[str, ...]


@dataclass(frozen=True)
class GraphContext:
    """What every captured step shares with the runner."""

    device: torch.device
    block_sizes: tuple[int, ...]  # per KV-cache group
    capacity: int  # context tokens a captured step holds per request
    kv_caches: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
    state_caches: Mapping[str, tuple[torch.Tensor, ...]]
    # (request ids, seq_lens, block ids, group ids) -> host block tables: the runner's checked path
    block_tables: Callable[..., dict[int, np.ndarray]]


class HostReplay:
    """The CPU's stand-in for a CUDA graph: replaying re-runs the callable, which reads only
    persistent buffers, and copies its results into the outputs of the capture."""

    def __init__(self, fn: Callable[[], Outputs]) -> None:
        self.fn = fn
        self.outputs = fn()

    def replay(self) -> None:
        for static, fresh in zip(_as_tuple(self.outputs), _as_tuple(self.fn()), strict=True):
            static.copy_(fresh)


class CudaGraphReplay:
    """``fn`` captured into a CUDA graph after two warm-up runs on a side stream (Triton
    compiles and FlashInfer's first run happen there, outside the capture)."""

    def __init__(self, fn: Callable[[], Outputs], device: torch.device) -> None:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn()

    def replay(self) -> None:
        self.graph.replay()


def capture(fn: Callable[[], Outputs], device: torch.device) -> HostReplay | CudaGraphReplay:
    """``fn`` as a CUDA graph on CUDA, else as its CPU stand-in."""
    return CudaGraphReplay(fn, device) if device.type == "cuda" else HostReplay(fn)


def plans_on_host(builder: MetadataBuilder) -> TypeGuard[FlashInferMetadataBuilder]:
    """Whether a group's metadata needs a plan made on the host from the step's lengths
    (FlashInfer: a CUDA-graph wrapper planned before each replay); the rest read only
    device buffers, so a captured pass can take its lengths from the pass before it."""
    return isinstance(builder, FlashInferMetadataBuilder)


class CapturedStep:
    """One step kind at one bucket: persistent buffers, the graph, and its replay."""

    def __init__(
        self,
        context: GraphContext,
        *,
        bucket: int,
        query_len: int,
        groups: Sequence[GraphGroup],
        model: Callable[..., Outputs],
        extra_inputs: Sequence[torch.Tensor],
    ) -> None:
        self.context, self.bucket, self.query_len = context, bucket, query_len
        self.num_tokens = bucket * query_len
        self.kv_groups = tuple(sorted({group.kv_cache_group for group in groups}))
        self.widths = {g: cdiv(context.capacity, context.block_sizes[g]) for g in self.kv_groups}
        device = context.device
        self.step = StepMetadataBuilder(
            context.block_sizes,
            device,
            max_num_seqs=bucket,
            max_num_tokens=self.num_tokens,
            max_blocks_per_seq=[self.widths.get(g, 1) for g in range(len(context.block_sizes))],
        )
        self.input_ids = torch.zeros(self.num_tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(self.num_tokens, dtype=torch.long, device=device)
        self.extra = tuple(
            torch.zeros((self.num_tokens, *e.shape[1:]), dtype=e.dtype, device=device)
            for e in extra_inputs
        )
        self.groups = tuple((group, self._graph_builder(group)) for group in groups)
        common = self._fill(num_real=0, seq_lens=(), tables={})  # all padding: writes no KV
        attn_metadata = {}
        slot_mappings = {}
        for group, builder in self.groups:
            metadata = builder.build(common[group.kv_cache_group])
            attn_metadata.update(dict.fromkeys(group.layer_names, metadata))
            slot_mappings.update(
                dict.fromkeys(group.layer_names, common[group.kv_cache_group].slot_mapping)
            )
        self.common = (
            common  # the captured metadata per KV-cache group (fill_on_device rewrites it)
        )
        self._offsets = torch.arange(query_len, device=device)
        ctx = ForwardContext(
            positions=self.positions,
            attn_metadata=attn_metadata,
            kv_caches=context.kv_caches,
            slot_mappings=slot_mappings,
            state_caches=context.state_caches,
        )

        def forward() -> Outputs:
            return model(self.input_ids, *self.extra, ctx)

        self.forward = forward  # the uncaptured pass, for a graph that captures more than it
        self.graph = capture(forward, device)

    def _graph_builder(self, group: GraphGroup) -> Any:
        """What builds the group's metadata for this bucket: a FlashInfer CUDA-graph wrapper,
        or the group's own builder (Triton's metadata plans nothing)."""
        if plans_on_host(group.builder):
            return FlashInferGraphWrapper(
                group.builder,
                num_reqs=self.bucket,
                query_len=self.query_len,
                block_table_width=self.widths[group.kv_cache_group],
            )
        return group.builder

    def _fill(
        self, *, num_real: int, seq_lens: Sequence[int], tables: Mapping[int, np.ndarray]
    ) -> dict[int, CommonAttentionMetadata]:
        """Write the step's metadata into the persistent buffers: ``num_real`` requests, then
        padding requests of the same query length over the null block with padding slots."""
        bucket, query_len = self.bucket, self.query_len
        padded_seq_lens = np.full(bucket, query_len, dtype=np.int64)
        padded_seq_lens[:num_real] = seq_lens
        padded_tables = {}
        for g in self.kv_groups:
            table = np.zeros((bucket, self.widths[g]), dtype=np.int32)
            if num_real:
                # Columns past the capacity are never read: run() refused longer contexts.
                real = tables[g][:, : self.widths[g]]
                table[:num_real, : real.shape[1]] = real
            padded_tables[g] = table
        step = self.step.build(
            padded_seq_lens,
            np.full(bucket, query_len, dtype=np.int64),
            padded_tables,
            num_tokens_padded=self.num_tokens,
        )
        real_tokens = num_real * query_len
        common = {}
        for g, metadata in step.common.items():
            if real_tokens < self.num_tokens:
                metadata.slot_mapping[real_tokens:].fill_(PADDING_SLOT)
            # The launch plan of the capture covers any context up to the capacity.
            common[g] = replace(metadata, max_seq_len=self.widths[g] * self.context.block_sizes[g])
        self.positions.copy_(step.positions)
        return common

    def fill(self, rows: StepRows) -> None:
        """Refill the metadata buffers with ``rows`` and re-plan every group: valid for every
        ``replay`` until the next ``fill`` (the k steps of a constant-position draft share one)."""
        self.num_real = len(rows.request_ids)
        tables = self.context.block_tables(
            rows.request_ids, rows.seq_lens, rows.block_ids, self.kv_groups
        )
        common = self._fill(num_real=self.num_real, seq_lens=rows.seq_lens, tables=tables)
        for group, builder in self.groups:
            builder.build(common[group.kv_cache_group])
        if rows.rope_positions is not None:
            real_tokens = self.num_real * self.query_len
            self.positions[:real_tokens].copy_(rows.rope_positions, non_blocking=True)

    def fill_on_device(
        self,
        context_lens: torch.Tensor,
        real: torch.Tensor,
        tables: Mapping[int, torch.Tensor],
        rope_positions: torch.Tensor | None = None,
    ) -> None:
        """Write the pass's metadata from device tensors alone (no host, no plan): what a
        graph capturing this pass after the one that decides its lengths needs.

        ``context_lens`` int64 [bucket]: tokens before each request's queries; ``real`` bool
        [bucket]: False for padding rows, which get ``_fill``'s padding (query_len-long
        sequences over the null block, padding slots); ``tables[g]`` int32 [bucket, width]
        with zero rows for padding; ``rope_positions`` int64 [bucket] replaces the positions
        of a one-token pass. Only for groups whose metadata plans nothing (``plans_on_host``)."""
        bucket, query_len = self.bucket, self.query_len
        positions = context_lens[:, None] + self._offsets  # [bucket, query_len]
        seq_lens = torch.where(real, context_lens + query_len, query_len)
        real_tokens = real[:, None].expand(bucket, query_len)
        for index, g in enumerate(self.kv_groups):
            common, block_size = self.common[g], self.context.block_sizes[g]
            if index == 0:  # query_start_loc, seq_lens and positions are shared by every group
                common.seq_lens.copy_(seq_lens)
            common.block_table.copy_(tables[g])
            columns = torch.clamp(positions // block_size, max=self.widths[g] - 1)
            slots = tables[g].gather(1, columns).long() * block_size + positions % block_size
            common.slot_mapping.copy_(torch.where(real_tokens, slots, PADDING_SLOT).view(-1))
        if rope_positions is not None:
            positions = rope_positions[:, None].expand(bucket, query_len)
        self.positions.copy_(positions.reshape(-1))

    def replay(self, token_ids: torch.Tensor, extra_inputs: Sequence[torch.Tensor]) -> Outputs:
        """Copy the inputs in (device to device where they come from an earlier step), replay;
        the real rows' outputs (copies: the next replay overwrites the graph's)."""
        real_tokens = self.num_real * self.query_len
        self.input_ids[:real_tokens].copy_(token_ids, non_blocking=True)
        for static, given in zip(self.extra, extra_inputs, strict=True):
            static[:real_tokens].copy_(given)
        self.graph.replay()
        outputs = tuple(output[:real_tokens].clone() for output in _as_tuple(self.graph.outputs))
        return outputs if isinstance(self.graph.outputs, tuple) else outputs[0]


class GraphSteps:
    """The runner's captured steps: which bucket serves a pass, capture on first use."""

    def __init__(
        self,
        plan: CapturePlan,
        context: GraphContext,
        groups: Mapping[StepKind, Sequence[GraphGroup]],
    ) -> None:
        self.plan = plan
        self.context = context
        self.groups = groups
        self._captured: dict[tuple[StepKind, int], CapturedStep] = {}
        self.counts: Counter[tuple[str, str]] = Counter()  # (step kind, "graph" | "eager")

    def kind_of(self, query_lens: Sequence[int], drafting: bool) -> StepKind | None:
        """The step kind of a pass whose requests all run ``query_lens[0]`` tokens."""
        if drafting:
            return StepKind.DRAFT if set(query_lens) == {1} else None
        for kind in (StepKind.TARGET_DECODE, StepKind.VERIFY):
            step = self.plan.step(kind)
            if step is not None and set(query_lens) == {step.query_len}:
                return kind
        return None

    def prepare(
        self,
        kind: StepKind | None,
        rows: StepRows,
        model: Callable[..., Outputs],
        extra_inputs: Sequence[torch.Tensor] = (),
    ) -> Callable[[torch.Tensor, Sequence[torch.Tensor]], Outputs] | None:
        """The captured step for the pass, filled for ``rows``: call it with the pass's token
        ids and extra inputs to replay (counted per replay); None: run the pass eagerly."""
        step = self.plan.step(kind) if kind is not None else None
        bucket = step.bucket_for(len(rows.request_ids)) if step is not None else None
        label = kind.value if kind is not None else "other"
        if (
            step is None
            or bucket is None
            or set(rows.query_lens) != {step.query_len}
            or max(rows.seq_lens) > self.context.capacity
        ):
            self.counts[label, "eager"] += 1
            return None
        captured = self.captured_step(step, bucket, model, extra_inputs)
        captured.fill(rows)

        def replay(token_ids: torch.Tensor, extra: Sequence[torch.Tensor]) -> Outputs:
            self.counts[label, "graph"] += 1
            return captured.replay(token_ids, extra)

        return replay

    def captured_step(
        self,
        step: StepPlan,
        bucket: int,
        model: Callable[..., Outputs],
        extra_inputs: Sequence[torch.Tensor] = (),
    ) -> CapturedStep:
        """The step kind's captured step at ``bucket``, captured on first use."""
        captured = self._captured.get((step.kind, bucket))
        if captured is None:
            captured = CapturedStep(
                self.context,
                bucket=bucket,
                query_len=step.query_len,
                groups=self.groups[step.kind],
                model=model,
                extra_inputs=extra_inputs,
            )
            self._captured[step.kind, bucket] = captured
        return captured

    def run(
        self,
        kind: StepKind | None,
        rows: StepRows,
        model: Callable[..., Outputs],
        extra_inputs: Sequence[torch.Tensor] = (),
    ) -> Outputs | None:
        """The pass from its captured graph, or None: run it eagerly (counted either way)."""
        replay = self.prepare(kind, rows, model, extra_inputs)
        return None if replay is None else replay(rows.token_ids, extra_inputs)


def _as_tuple(outputs: Outputs) -> tuple[torch.Tensor, ...]:
    return outputs if isinstance(outputs, tuple) else (outputs,)
