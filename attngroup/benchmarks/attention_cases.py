"""The attention benchmark's cases: shapes, modes and contexts, and the order they run in.

Plain data without torch, so the command line can list and check them before the
kernels load (``--help`` and argument errors answer at once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BLOCK_SIZE = 16
KV_BYTES_PER_ELEMENT = 2  # the benchmark's caches are bf16
DRAFT_HEADS = 4
VERIFY_QUERY_LEN = 4


@dataclass(frozen=True)
class Shape:
    num_heads_q: int
    num_kv_heads: int
    head_size: int

    @property
    def has_draft(self) -> bool:
        """Gemma 4 MTP: a 4-head draft reads an 8-head target's pages."""
        return self.num_heads_q == 8


SHAPES = {
    "gemma4-e2b-sliding-d256": Shape(8, 1, 256),
    "gemma4-e2b-full-d512": Shape(8, 1, 512),
    "gemma4-e4b-sliding-d256": Shape(8, 2, 256),
    "gemma4-e4b-full-d512": Shape(8, 2, 512),
    "llama3-8b-d128": Shape(32, 8, 128),
}
ALL_MODES = ("decode", "verify", "draft")
CONTEXTS = {"b64x8k": (64, 8192), "b16x32k": (16, 32768)}
TINY_CONTEXTS = {"b3x80": (3, 80), "b2x150": (2, 150)}
QUICK_CASES = {  # shape -> modes; first context only
    "gemma4-e2b-sliding-d256": ("decode", "verify", "draft"),
    "gemma4-e2b-full-d512": ("decode",),
    "llama3-8b-d128": ("decode",),
}


@dataclass(frozen=True)
class Case:
    shape_name: str
    mode: str  # decode | verify | draft
    context_name: str
    batch_size: int
    context_len: int

    @property
    def shape(self) -> Shape:
        return SHAPES[self.shape_name]

    @property
    def num_heads_q(self) -> int:
        return DRAFT_HEADS if self.mode == "draft" else self.shape.num_heads_q

    @property
    def query_len(self) -> int:
        return VERIFY_QUERY_LEN if self.mode == "verify" else 1

    @property
    def name(self) -> str:
        return f"{self.mode}.{self.shape_name}.{self.context_name}"

    @property
    def kv_bytes(self) -> int:
        """K and V bytes the step must read: every request's whole context, once."""
        shape = self.shape
        per_token = 2 * shape.num_kv_heads * shape.head_size * KV_BYTES_PER_ELEMENT
        return self.batch_size * self.context_len * per_token


def cases(
    quick: bool,
    tiny: bool,
    shape_names: Sequence[str],
    context_names: Sequence[str] | None = None,
    mode_names: Sequence[str] = ALL_MODES,
) -> list[Case]:
    """Shape by shape (a shape's contexts reuse its JIT-compiled kernels), then context, then mode."""
    contexts = TINY_CONTEXTS if tiny else CONTEXTS
    if context_names is not None:
        contexts = {name: contexts[name] for name in context_names}
    if quick:
        contexts = dict(list(contexts.items())[:1])
    result: list[Case] = []
    for shape_name in shape_names:
        modes: Sequence[str] = ALL_MODES if SHAPES[shape_name].has_draft else ALL_MODES[:2]
        if quick:
            modes = QUICK_CASES.get(shape_name, ())
        modes = [mode for mode in modes if mode in mode_names]
        for context_name, (batch_size, context_len) in contexts.items():
            result.extend(
                Case(shape_name, mode, context_name, batch_size, context_len) for mode in modes
            )
    return result
