"""Random paged batches for kernel tests: what a scheduler step hands attention.

A ``BatchSpec`` names the shape of a step (per request: total length and new tokens);
``make_paged_batch`` fills a paged KV cache for it with fresh random keys and values behind a
shuffled block table. Every cache slot that no query may read holds NaN: block 0 (the null
block, as in vLLM), spare blocks, the tail of each request's last block, and with a sliding
window the positions that slid out of it (whole blocks of those point at the null block, as
vLLM's sliding-window manager frees them). A kernel that reads a slot it must not see turns
its output into NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import pytest
import torch

from attngroup.kernels.attention_oracle import paged_attention_reference

NULL_BLOCK = 0

gpu_only = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (bf16 and large shapes run on GPU)"
)
"""Skip marker for GPU-only cases; use together with ``pytest.mark.gpu``."""


class BatchMetadata(TypedDict):
    """A batch's description as keyword arguments: typed per key, so mypy checks each one
    against the kernel's and the oracle's parameters when it is unpacked."""

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor


@dataclass(frozen=True)
class BatchSpec:
    """One step: request ``r`` has ``seq_lens[r]`` tokens, the last ``query_lens[r]`` new."""

    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.seq_lens or len(self.seq_lens) != len(self.query_lens):
            raise ValueError(f"need one query length per request: {self}")
        if any(not 1 <= q <= s for q, s in zip(self.query_lens, self.seq_lens, strict=True)):
            raise ValueError(f"every request needs 1 <= query_len <= seq_len: {self}")

    @classmethod
    def decode(cls, *seq_lens: int) -> BatchSpec:
        return cls(tuple(seq_lens), (1,) * len(seq_lens))

    @classmethod
    def prefill(cls, *seq_lens: int) -> BatchSpec:
        return cls(tuple(seq_lens), tuple(seq_lens))

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens)


@dataclass(frozen=True, eq=False)
class PagedBatch:
    """Tensors of one step, in the kernels' layout (see ``attngroup.kernels.cache_layout``).

    ``keys[r]``/``values[r]`` [seq_len_r, num_kv_heads, head_size] are request ``r``'s dense
    K/V (what was scattered into the cache); ``slot_mapping`` gives the new tokens' slots.
    """

    spec: BatchSpec
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    sliding_window: int | None

    @property
    def head_size(self) -> int:
        return self.query.shape[2]

    def metadata(self) -> BatchMetadata:
        """The batch-description keyword arguments shared by the oracle and the kernels."""
        return {
            "query_start_loc": self.query_start_loc,
            "seq_lens": self.seq_lens,
            "block_table": self.block_table,
        }

    def oracle(
        self,
        *,
        sm_scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> torch.Tensor:
        """The float64 oracle's attention over this batch."""
        return paged_attention_reference(
            self.query,
            self.key_cache,
            self.value_cache,
            **self.metadata(),
            sm_scale=sm_scale,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
        )


def make_paged_batch(
    spec: BatchSpec,
    *,
    num_heads_q: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    seed: int = 0,
    sliding_window: int | None = None,
    spare_blocks: int = 2,
) -> PagedBatch:
    """A random batch for ``spec``; blocks are handed out in a shuffled order. Values are
    drawn on ``device`` (so GPU-sized batches are quick to make), block ids on the CPU."""
    device = torch.device(device)
    block_generator = torch.Generator().manual_seed(seed)
    value_generator = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=value_generator, device=device).to(dtype)

    blocks_per_req = [-(-seq_len // block_size) for seq_len in spec.seq_lens]
    num_blocks = 1 + sum(blocks_per_req) + spare_blocks
    shuffled = (torch.randperm(num_blocks - 1, generator=block_generator) + 1).tolist()
    block_table = torch.full((spec.num_reqs, max(blocks_per_req) + 1), NULL_BLOCK)
    cache_shape = (num_blocks * block_size, num_kv_heads, head_size)
    flat_keys = torch.full(cache_shape, float("nan"), dtype=dtype, device=device)
    flat_values = torch.full(cache_shape, float("nan"), dtype=dtype, device=device)
    keys, values, slots = [], [], []
    for request, (seq_len, query_len) in enumerate(
        zip(spec.seq_lens, spec.query_lens, strict=True)
    ):
        own = shuffled[: blocks_per_req[request]]
        shuffled = shuffled[blocks_per_req[request] :]
        first_seen = 0
        if sliding_window is not None:
            first_seen = max(0, seq_len - query_len - sliding_window + 1)
        table_row = torch.tensor(own)
        table_row[: first_seen // block_size] = NULL_BLOCK  # freed: slid out of the window
        block_table[request, : len(own)] = table_row
        positions = torch.arange(seq_len)
        request_slots = table_row[positions // block_size] * block_size + positions % block_size
        request_slots = request_slots.to(device)
        keys.append(randn(seq_len, num_kv_heads, head_size))
        values.append(randn(seq_len, num_kv_heads, head_size))
        flat_keys[request_slots[first_seen:]] = keys[-1][first_seen:]
        flat_values[request_slots[first_seen:]] = values[-1][first_seen:]
        slots.append(request_slots[seq_len - query_len :])

    query_start_loc = [0, *torch.tensor(spec.query_lens).cumsum(0).tolist()]
    cache_view = (num_blocks, block_size, num_kv_heads, head_size)
    return PagedBatch(
        spec=spec,
        query=randn(spec.num_tokens, num_heads_q, head_size),
        key_cache=flat_keys.view(cache_view),
        value_cache=flat_values.view(cache_view),
        query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(spec.seq_lens, dtype=torch.int32, device=device),
        block_table=block_table.to(torch.int32).to(device),
        slot_mapping=torch.cat(slots).to(torch.int64),
        keys=tuple(keys),
        values=tuple(values),
        sliding_window=sliding_window,
    )


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64."""
    expected = expected.to(torch.float64)
    return float((actual.to(torch.float64) - expected).norm() / expected.norm())


RELATIVE_ERROR_BOUND = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
"""Bounds on ``relative_error`` against the float64 oracle, by kernel dtype."""


def assert_within_bound(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = "relative error"
) -> None:
    """Fail, naming the error, when ``actual`` is further from ``expected`` than ``dtype``'s
    bound (``RELATIVE_ERROR_BOUND``)."""
    error = relative_error(actual, expected)
    assert error < RELATIVE_ERROR_BOUND[dtype], (
        f"{what} {error:.3g} (bound {RELATIVE_ERROR_BOUND[dtype]:g})"
    )


BATCHES_CPU = {
    "decode": BatchSpec.decode(1, 17, 40, 95),
    "prefill": BatchSpec.prefill(5, 33, 50),
    "chunked": BatchSpec((60, 1, 45, 23), (20, 1, 1, 23)),
    "verify": BatchSpec((12, 31, 50, 70, 9, 64, 77), (2, 3, 4, 5, 6, 7, 8)),
    "verify9": BatchSpec((40, 9, 73), (9, 9, 9)),
}
"""Small steps for the interpreter: lengths 1 and not multiples of any block size; chunked
mixes a chunk with context, decodes (one of length 1) and a fresh prefill; verify has q_len
2..8 (split-KV eligible), verify9 the 9-token verify of an 8-token draft (2D only)."""

BATCHES_GPU = {
    "decode": BatchSpec.decode(1, 17, 300, 1023, 2048, 4097, 511, 8000),
    "decode64": BatchSpec.decode(*((997 * i) % 4096 + 1 for i in range(64))),
    "prefill": BatchSpec.prefill(1, 100, 777, 1500),
    "chunked": BatchSpec((3000, 1, 4500, 600, 77), (512, 1, 1, 600, 5)),
    "verify": BatchSpec((130, 2047, 4096, 513, 999, 3000, 65), (2, 3, 4, 5, 6, 7, 8)),
    "verify9": BatchSpec((5000, 9, 731), (9, 9, 9)),
}
"""The same kinds at GPU sizes, plus a 64-request decode with lengths up to 4096."""

SPLIT_KV_KINDS = frozenset({"decode", "decode64", "verify"})
"""Kinds with max_query_len <= 8, which the split-KV (3D) path serves."""
