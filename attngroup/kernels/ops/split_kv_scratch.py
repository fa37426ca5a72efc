"""The split-KV scratch of the Triton attention kernel and the check that it covers a launch.

An attention group's metadata builder owns one ``SplitKVScratch``; the launch plan states what
it needs (``ScratchNeeds``), and ``check_scratch`` refuses a scratch that falls short before
any kernel runs (the Gemma 4 MTP hazard: a draft's 4-head scratch serving the 8-head target).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton


class ScratchTooSmallError(ValueError):
    """The split-KV scratch does not cover this launch (it was sized for other heads or rows)."""


@dataclass(frozen=True, eq=False)
class SplitKVScratch:
    """Per-step scratch of the split-KV path, owned by an attention group's metadata builder.

    Shapes follow vLLM's ``softmax_segm_*`` buffers, all float32 and contiguous:
    ``segm_output`` [rows, num_heads_q, num_segments, head_size_padded], ``segm_max`` and
    ``segm_expsum`` [rows, num_heads_q, num_segments]. A launch needs ``rows >= num_tokens`` and
    exactly the query's head count, because the kernels index the buffers with it.
    """

    segm_output: torch.Tensor
    segm_max: torch.Tensor
    segm_expsum: torch.Tensor

    def __post_init__(self) -> None:
        if self.segm_output.dim() != 4:
            raise ValueError(
                "segm_output must be [rows, num_heads_q, num_segments, head_size_padded]; "
                f"got {tuple(self.segm_output.shape)}"
            )
        head_size_padded = self.segm_output.shape[3]
        if head_size_padded != triton.next_power_of_2(head_size_padded):
            raise ValueError(f"head_size_padded {head_size_padded} is not a power of two")
        for name in ("segm_max", "segm_expsum"):
            tensor = getattr(self, name)
            if tuple(tensor.shape) != tuple(self.segm_output.shape[:3]):
                raise ValueError(
                    f"{name} shape {tuple(tensor.shape)} must equal segm_output's leading "
                    f"[rows, num_heads_q, num_segments] = {tuple(self.segm_output.shape[:3])}"
                )
        for name in ("segm_output", "segm_max", "segm_expsum"):
            tensor = getattr(self, name)
            if tensor.dtype != torch.float32 or not tensor.is_contiguous():
                raise ValueError(f"{name} must be a contiguous float32 tensor")
            if tensor.device != self.segm_output.device:
                raise ValueError("the scratch tensors must share a device")

    @classmethod
    def allocate(
        cls,
        rows: int,
        num_heads_q: int,
        num_segments: int,
        head_size: int,
        device: torch.device | str,
    ) -> SplitKVScratch:
        """Uninitialised scratch for ``rows`` query tokens of ``num_heads_q`` heads."""
        if min(rows, num_heads_q, num_segments, head_size) < 1:
            raise ValueError(
                f"scratch sizes must be positive; got rows={rows}, num_heads_q={num_heads_q}, "
                f"num_segments={num_segments}, head_size={head_size}"
            )
        shape = (rows, num_heads_q, num_segments)
        return cls(
            segm_output=torch.empty(
                (*shape, triton.next_power_of_2(head_size)), dtype=torch.float32, device=device
            ),
            segm_max=torch.empty(shape, dtype=torch.float32, device=device),
            segm_expsum=torch.empty(shape, dtype=torch.float32, device=device),
        )

    @property
    def rows(self) -> int:
        return self.segm_output.shape[0]

    @property
    def num_heads_q(self) -> int:
        return self.segm_output.shape[1]

    @property
    def num_segments(self) -> int:
        return self.segm_output.shape[2]

    @property
    def head_size_padded(self) -> int:
        return self.segm_output.shape[3]


@dataclass(frozen=True)
class ScratchNeeds:
    """What a split-KV launch indexes in its scratch: ``rows`` query tokens of exactly
    ``num_heads_q`` heads, ``num_segments`` segments, rows of ``head_size_padded`` floats,
    on the query's ``device``."""

    rows: int
    num_heads_q: int
    num_segments: int
    head_size_padded: int
    device: torch.device


def check_scratch(scratch: SplitKVScratch, needs: ScratchNeeds) -> None:
    """Raise ScratchTooSmallError unless ``scratch`` covers ``needs``, naming every shortfall."""
    problems = []
    if scratch.num_heads_q != needs.num_heads_q:
        problems.append(f"num_heads_q: scratch {scratch.num_heads_q}, query {needs.num_heads_q}")
    if scratch.rows < needs.rows:
        problems.append(f"rows: scratch {scratch.rows}, needed {needs.rows} tokens")
    if scratch.num_segments < needs.num_segments:
        problems.append(f"segments: scratch {scratch.num_segments}, launch {needs.num_segments}")
    if scratch.head_size_padded != needs.head_size_padded:
        problems.append(
            f"head_size_padded: scratch {scratch.head_size_padded}, needed {needs.head_size_padded}"
        )
    if scratch.segm_output.device != needs.device:
        problems.append(f"device: scratch {scratch.segm_output.device}, query {needs.device}")
    if problems:
        raise ScratchTooSmallError(
            "split-KV scratch does not cover this launch (" + "; ".join(problems) + "); size it "
            "by the attention group's num_heads_q and at least the step's query tokens"
        )
