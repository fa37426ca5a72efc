"""Tensor parallelism for the engine's models (Megatron style, as vLLM shards).

Query heads, MLP / expert intermediate columns and state-layer heads split
evenly over the ranks; KV heads split too, or are replicated when there are
fewer KV heads than ranks (``attngroup.reference_engine.layers.heads_per_rank``). The
projections into the split dimension are column-parallel, the projections out
of it (o_proj, down_proj, out_proj) row-parallel followed by one all-reduce.
Embeddings, norms, routers, lm_head and the drafters' input/output
projections are replicated.

A module that owns split weights lists how to cut each full checkpoint tensor
in ``tp_shard_rules`` (parameter name -> ``ShardRule``); ``shard_for`` turns
them into the ``shard`` callback of ``attngroup.reference_engine.models.weights.load_weights``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor parallel rank {self.rank} is not in [0, {self.size})")

    def split(self, count: int, what: str) -> int:
        if count % self.size:
            raise ValueError(f"{count} {what} do not divide over tp={self.size}")
        return count // self.size

    def kv_heads(self, count: int) -> int:
        """Per-rank KV heads: split, or one replicated head when there are fewer than ranks."""
        if count >= self.size:
            return self.split(count, "KV heads")
        if self.size % count:
            raise ValueError(f"{count} KV heads cannot be replicated evenly over tp={self.size}")
        return 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(tensor, group=self.group)
        return tensor


SINGLE = TensorParallel()


@dataclass(frozen=True)
class ShardRule:
    """Cut ``dim`` of a full tensor: each of ``segments`` (sizes along ``dim``;
    one segment = the whole dim) splits evenly over the ranks and this rank's
    parts are concatenated. ``kv_heads`` (with ``head_size``) marks a KV
    projection, replicated per head when there are fewer KV heads than ranks."""

    dim: int
    segments: tuple[int, ...] = ()
    kv_heads: int = 0
    head_size: int = 0

    def apply(self, tensor: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        if tp.size == 1:
            return tensor
        if self.kv_heads and self.kv_heads < tp.size:
            head = tp.rank // (tp.size // self.kv_heads)
            return tensor.narrow(self.dim, head * self.head_size, self.head_size).contiguous()
        segments = self.segments or (tensor.shape[self.dim],)
        parts, start = [], 0
        for length in segments:
            piece = tp.split(length, f"rows of a {tuple(tensor.shape)} tensor")
            parts.append(tensor.narrow(self.dim, start + tp.rank * piece, piece))
            start += length
        return torch.cat(parts, dim=self.dim).contiguous()


COLUMN = ShardRule(dim=0)
ROW = ShardRule(dim=1)


def kv_column(num_kv_heads: int, head_size: int) -> ShardRule:
    return ShardRule(dim=0, kv_heads=num_kv_heads, head_size=head_size)


def segments(dim: int, sizes: Sequence[int]) -> ShardRule:
    return ShardRule(dim=dim, segments=tuple(sizes))


def shard_for(model: nn.Module, tp: TensorParallel) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """The loader's ``shard`` callback: cut each full tensor by its module's rule."""
    rules: dict[str, ShardRule] = {}
    for prefix, module in model.named_modules():
        for name, rule in getattr(module, "tp_shard_rules", {}).items():
            rules[f"{prefix}.{name}" if prefix else name] = rule

    def shard(name: str, tensor: torch.Tensor) -> torch.Tensor:
        rule = rules.get(name)
        return tensor if rule is None else rule.apply(tensor, tp)

    return shard
