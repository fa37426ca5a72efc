"""A captured step's padding requests run over the null block on every replay, whatever
the passes before it left in the bucket's buffers.

vLLM PR #39773: EAGLE draft decodes under piecewise CUDA graphs padded the token count up
to the capture size while FlashInfer's builder refreshed its page-index buffers for the
real requests only, so the padded rows read the paged-KV indptr and indices an earlier,
larger batch left there (stale pages, out-of-bounds reads). Here a bucket of 4 first
serves 4 requests, the fourth finishes (its blocks freed and poisoned with NaN), then 3
requests replay in the same bucket: the fourth row is padding and must attend over the
null block alone, as a fresh capture's padding does.

The captured step is the engine's ``CapturedStep`` with a small torch paged-attention
model that reads only the graph's persistent buffers (``HostReplay`` on the CPU); every
row's output is checked against a float64 oracle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from attngroup.kernels.backend import MetadataBuilder
from attngroup.kernels.metadata import CommonAttentionMetadata
from attngroup.reference_engine.engine.cuda_graphs.graph_steps import (
    CapturedStep,
    GraphContext,
    GraphGroup,
)
from attngroup.reference_engine.engine.step_rows import StepRows
from attngroup.reference_engine.models.common import ForwardContext

BLOCK_SIZE = 4
CAPACITY = 16  # context tokens per request: block tables 4 wide
NUM_BLOCKS = 24  # block 0 is the null block
HEADS, HEAD_DIM, VOCAB = 2, 8, 50
BUCKET = 4
LAYER = "layer.0"
RTOL = 1e-5


class PassThroughBuilder(MetadataBuilder):
    """A group whose metadata is the common metadata itself (plans nothing)."""

    def __init__(self) -> None:
        self.layer_names = (LAYER,)
        self.num_heads_q = HEADS
        self.device = torch.device("cpu")

    def build(self, common: CommonAttentionMetadata) -> CommonAttentionMetadata:
        return common


def _attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """query [q, H, D], keys/values [n, H, D]: every query over every key (no mask)."""
    scores = torch.einsum("qhd,nhd->hqn", query, keys) / HEAD_DIM**0.5
    return torch.einsum("hqn,nhd->qhd", scores.softmax(-1), values)


def _gather(cache: torch.Tensor, table: Sequence[int], seq_len: int) -> torch.Tensor:
    return cache[list(table)].reshape(-1, HEADS, HEAD_DIM)[:seq_len]


class PagedModel:
    """Embeds the ids as queries and attends each request over its pages, reading its
    sequence lengths and block tables from the step's metadata (the graph's buffers)."""

    def __init__(self, embed: torch.Tensor, caches: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.embed, self.caches = embed, caches

    def __call__(self, input_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        common = ctx.attn_metadata[LAYER]
        query = self.embed[input_ids].float()
        starts = common.query_start_loc.tolist()
        out = torch.empty_like(query)
        for row, seq_len in enumerate(common.seq_lens.tolist()):
            table = common.block_table[row].tolist()
            keys, values = (_gather(cache, table, seq_len).float() for cache in self.caches)
            out[starts[row] : starts[row + 1]] = _attention(
                query[starts[row] : starts[row + 1]], keys, values
            )
        return out


def _tables(request_ids, seq_lens, block_ids, group_ids) -> dict[int, np.ndarray]:
    width = CAPACITY // BLOCK_SIZE
    tables = {}
    for g in group_ids:
        table = np.zeros((len(request_ids), width), dtype=np.int32)
        for row, blocks in enumerate(block_ids):
            table[row, : len(blocks[g])] = blocks[g]
        tables[g] = table
    return tables


def _rows(
    ids: Sequence[str], seq_lens: Sequence[int], blocks: dict[str, tuple[int, ...]], q: int, gen
) -> StepRows:
    return StepRows(
        request_ids=tuple(ids),
        token_ids=torch.randint(0, VOCAB, (len(ids) * q,), generator=gen),
        seq_lens=tuple(seq_lens),
        query_lens=(q,) * len(ids),
        block_ids=tuple((blocks[i],) for i in ids),
    )


def _oracle(
    embed: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    ids: torch.Tensor,
    table: Sequence[int],
    seq_len: int,
) -> torch.Tensor:
    """float64 attention of ``ids``' queries over ``seq_len`` keys of ``table``'s pages."""
    keys, values = (_gather(cache.double(), table, seq_len) for cache in caches)
    return _attention(embed[ids].double(), keys, values)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


@pytest.mark.parametrize(
    "query_len", [pytest.param(1, id="draft-1-token"), pytest.param(3, id="verify-3-tokens")]
)
@pytest.mark.parametrize("seed", [pytest.param(11, id="seed11"), pytest.param(23, id="seed23")])
def test_padding_rows_attend_the_null_block_after_a_full_bucket(query_len: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(VOCAB, HEADS, HEAD_DIM, generator=gen)
    shape = (NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM)
    caches = (torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
    context = GraphContext(
        device=torch.device("cpu"),
        block_sizes=(BLOCK_SIZE,),
        capacity=CAPACITY,
        kv_caches={LAYER: caches},
        state_caches={},
        block_tables=_tables,
    )
    group = GraphGroup("full", 0, PassThroughBuilder(), (LAYER,))
    step = CapturedStep(
        context,
        bucket=BUCKET,
        query_len=query_len,
        groups=(group,),
        model=PagedModel(embed, caches),
        extra_inputs=(),
    )
    blocks = {
        f"r{i}": tuple(range(1 + 4 * i, 5 + 4 * i)) for i in range(BUCKET)
    }  # 4 pages each, none the null block
    long_lens = [int(n) for n in torch.randint(10, CAPACITY + 1, (BUCKET,), generator=gen)]
    full = _rows(list(blocks), long_lens, blocks, query_len, gen)
    step.fill(full)
    step.replay(full.token_ids, ())

    # r3 finishes: its pages are freed (poisoned); r0..r2 run again, shorter, padded to 4.
    caches[0][list(blocks["r3"])] = float("nan")
    caches[1][list(blocks["r3"])] = float("nan")
    ids = ["r0", "r1", "r2"]
    short_lens = [int(n) for n in torch.randint(query_len, 9, (3,), generator=gen)]
    padded = _rows(ids, short_lens, blocks, query_len, gen)
    step.fill(padded)
    outputs: Any = step.graph.outputs
    outputs.fill_(float("nan"))
    real = step.replay(padded.token_ids, ())

    for row, (request, seq_len) in enumerate(zip(ids, short_lens, strict=True)):
        tokens = padded.token_ids[row * query_len : (row + 1) * query_len]
        want = _oracle(embed, caches, tokens, blocks[request], seq_len)
        error = _relative_error(real[row * query_len : (row + 1) * query_len], want)
        assert error <= RTOL, f"request {request} (seq_len {seq_len}): {error:.2e}"
    pad = slice(3 * query_len, 4 * query_len)
    want = _oracle(embed, caches, step.input_ids[pad], [0], query_len)
    error = _relative_error(outputs[pad], want)
    common = step.common[0]
    assert error <= RTOL, (
        f"padding row 3 after a full bucket: error {error:.2e} against attention over the null "
        f"block; it ran seq_len {int(common.seq_lens[3])} over blocks "
        f"{common.block_table[3].tolist()} (stale from the finished request r3?)"
    )
