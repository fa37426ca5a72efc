"""Which engine steps run from CUDA graphs: buckets, padding, buffer sizes and per-group decisions.

A pure function of the attention groups (no device, no model), so CI checks the planning
half of CUDA graphs on the CPU. Three step kinds have one query length for every request
and are captured per batch-size bucket: the target's decode (1 token), the verify
(``k + 1`` tokens) and the draft's decode steps (1 token over the draft's groups). A batch
of ``n`` requests runs the graph of the smallest bucket ``>= n``; the ``bucket - n``
padding requests carry the padding slot, so they write no KV.

Each attention group decides for itself (``cuda_graph_support.graph_support`` on its own
head count, head size and window) whether it can be captured at a step's query length and
bucket; a step bucket is captured only when every group the step runs says yes, and
otherwise runs eagerly with the groups and reasons named (``CapturePlan.describe``). The
target's groups never decide for the draft's, nor the reverse (vLLM #56289).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from attngroup.kernels.backends.cuda_graph_support import GroupGeometry, graph_support

BUCKET_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
"""Batch sizes captured, up to ``max_num_seqs`` (which is always one; vLLM's ladder is alike)."""


class StepKind(StrEnum):
    TARGET_DECODE = "target-decode"
    VERIFY = "verify"
    DRAFT = "draft"


@dataclass(frozen=True)
class CaptureGroup:
    """One attention group as the capture plan sees it."""

    name: str  # readable and unique: "target-g0-a1" (KV-cache group 0, attention group 1)
    kv_cache_group: int
    geometry: GroupGeometry
    scratch_rows: int | None = None  # Triton split-KV scratch rows; None where there is none


@dataclass(frozen=True)
class GroupDecision:
    """One group's answer for one step kind at one bucket."""

    group: str
    step: StepKind
    bucket: int
    num_heads_q: int  # the group's own, recorded so a test sees whose heads decided
    head_size: int
    capturable: bool
    reason: str


@dataclass(frozen=True)
class GroupBuffers:
    """The persistent metadata buffers of one group in one captured step bucket."""

    group: str
    num_reqs: int  # the bucket: real and padding requests
    num_tokens: int  # num_reqs * query_len: input ids, positions, slot mapping
    block_table_width: int  # columns: the captured context capacity in blocks
    max_pages: int  # FlashInfer kv_indices capacity: num_reqs * block_table_width
    indptr_len: int  # FlashInfer indptr entries: one per planned request, plus one


@dataclass(frozen=True)
class StepPlan:
    """One step kind: its query length, the groups it runs and its captured buckets."""

    kind: StepKind
    query_len: int
    groups: tuple[str, ...]
    kv_cache_groups: tuple[int, ...]
    buckets: tuple[int, ...]  # captured buckets, ascending
    eager: tuple[GroupDecision, ...]  # the refusals that keep other buckets eager

    def bucket_for(self, num_reqs: int) -> int | None:
        """The smallest captured bucket holding ``num_reqs`` requests (None: run eagerly)."""
        return next((bucket for bucket in self.buckets if bucket >= num_reqs), None)


@dataclass(frozen=True)
class CapturePlan:
    steps: tuple[StepPlan, ...]
    decisions: tuple[GroupDecision, ...]
    buffers: tuple[tuple[StepKind, int, GroupBuffers], ...]  # (step, bucket, buffers)

    def step(self, kind: StepKind) -> StepPlan | None:
        return next((step for step in self.steps if step.kind is kind), None)

    def buffers_of(self, kind: StepKind, bucket: int) -> dict[str, GroupBuffers]:
        return {b.group: b for k, at, b in self.buffers if k is kind and at == bucket}

    def describe(self) -> list[str]:
        """One line per step kind, saying which buckets are captured and, for each group
        that keeps a bucket eager, why."""
        lines = []
        for step in self.steps:
            captured = ", ".join(map(str, step.buckets)) or "none"
            lines.append(
                f"{step.kind.value} (q_len {step.query_len}, groups {', '.join(step.groups)}): "
                f"captured buckets {captured}"
            )
            refused = {(d.group, d.reason): d for d in step.eager}
            for decision in refused.values():
                lines.append(
                    f"  eager for group {decision.group} ({decision.num_heads_q} q heads, head "
                    f"{decision.head_size}): {decision.reason}"
                )
        return lines


def buckets_up_to(max_num_seqs: int) -> tuple[int, ...]:
    """The ladder below ``max_num_seqs``, and ``max_num_seqs`` itself."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    return (*(b for b in BUCKET_LADDER if b < max_num_seqs), max_num_seqs)


def plan_capture(
    groups: Sequence[CaptureGroup],
    step_groups: Mapping[StepKind, Sequence[str]],
    *,
    num_spec_tokens: int,
    max_num_seqs: int,
    block_table_widths: Mapping[int, int],
) -> CapturePlan:
    """The capture plan of the step kinds in ``step_groups`` (kind -> names of the groups it
    runs). ``block_table_widths[g]``: KV-cache group g's columns at the captured capacity."""
    by_name = {group.name: group for group in groups}
    steps: list[StepPlan] = []
    decisions: list[GroupDecision] = []
    buffers: list[tuple[StepKind, int, GroupBuffers]] = []
    for kind, names in step_groups.items():
        query_len = num_spec_tokens + 1 if kind is StepKind.VERIFY else 1
        members = [by_name[name] for name in names]
        captured, eager = [], []
        for bucket in buckets_up_to(max_num_seqs):
            answers = [_decide(group, kind, bucket, query_len) for group in members]
            decisions.extend(answers)
            refusals = [answer for answer in answers if not answer.capturable]
            eager.extend(refusals)
            if members and not refusals:
                captured.append(bucket)
                buffers.extend(
                    (kind, bucket, _buffers(group, bucket, query_len, block_table_widths))
                    for group in members
                )
        steps.append(
            StepPlan(
                kind=kind,
                query_len=query_len,
                groups=tuple(names),
                kv_cache_groups=tuple(sorted({group.kv_cache_group for group in members})),
                buckets=tuple(captured),
                eager=tuple(eager),
            )
        )
    return CapturePlan(steps=tuple(steps), decisions=tuple(decisions), buffers=tuple(buffers))


def _decide(group: CaptureGroup, kind: StepKind, bucket: int, query_len: int) -> GroupDecision:
    answer = graph_support(
        group.geometry, query_len=query_len, num_reqs=bucket, scratch_rows=group.scratch_rows
    )
    return GroupDecision(
        group=group.name,
        step=kind,
        bucket=bucket,
        num_heads_q=group.geometry.num_heads_q,
        head_size=group.geometry.head_size,
        capturable=answer.capturable,
        reason=answer.reason,
    )


def _buffers(
    group: CaptureGroup, bucket: int, query_len: int, widths: Mapping[int, int]
) -> GroupBuffers:
    width = widths[group.kv_cache_group]
    num_tokens = bucket * query_len
    planned = bucket  # every FlashInfer choice plans one entry per request
    return GroupBuffers(
        group=group.name,
        num_reqs=bucket,
        num_tokens=num_tokens,
        block_table_width=width,
        max_pages=planned * width,
        indptr_len=planned + 1,
    )
