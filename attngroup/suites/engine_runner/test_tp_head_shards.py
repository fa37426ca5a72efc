"""Tensor-parallel head shards against a float64 GQA oracle, in one process.

Each rank's query heads must attend with the KV head that the unsharded model
pairs them with (query head ``h`` reads KV head ``h // (num_q / num_kv)``).
When there are fewer KV heads than ranks, consecutive ranks replicate one KV
head: ranks ``0, 1`` take head 0 and ranks ``2, 3`` head 1 at tp 4 over 2 KV
heads, never ``0, 1, 0, 1`` (SGLang PR #30997). The two-process runner test
(``test_tensor_parallel.py``) runs tp 2 only, where every rank-to-head map that
stays in range is right, so these shapes are checked here without processes:
each rank's shards of the full projections go through one attention pass and
write its query-head slice of a NaN-poisoned output, compared with the
unsharded attention.
"""

from __future__ import annotations

import secrets

import pytest
import torch

from attngroup.reference_engine.layers import heads_per_rank
from attngroup.reference_engine.models.parallel import COLUMN, TensorParallel, kv_column

HIDDEN = 24
HEAD_SIZE = 8
NUM_TOKENS = 7
#: float64 throughout: the split only reorders which rank computes which head.
RTOL = 1e-12

#: (query heads, KV heads, tp size): replicated KV heads (the shapes tp 2 cannot
#: tell apart), one replicated head, and plain splits.
SHAPES = [
    pytest.param(8, 2, 4, id="q8-kv2-tp4-replicated"),
    pytest.param(8, 2, 8, id="q8-kv2-tp8-replicated"),
    pytest.param(16, 4, 8, id="q16-kv4-tp8-replicated"),
    pytest.param(8, 1, 4, id="q8-kv1-tp4-one-kv-head"),
    pytest.param(8, 4, 2, id="q8-kv4-tp2-split"),
    pytest.param(8, 8, 4, id="q8-kv8-tp4-split"),
]


def _attention(
    x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor
) -> torch.Tensor:
    """Causal GQA attention of the heads the projections hold: [tokens, q heads, head size]."""
    tokens = x.shape[0]
    q = (x @ wq.T).view(tokens, -1, HEAD_SIZE).transpose(0, 1)
    k = (x @ wk.T).view(tokens, -1, HEAD_SIZE).transpose(0, 1)
    v = (x @ wv.T).view(tokens, -1, HEAD_SIZE).transpose(0, 1)
    group = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    scores = q @ k.transpose(1, 2) * HEAD_SIZE**-0.5
    future = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return (probs @ v).transpose(0, 1)


@pytest.mark.parametrize(("num_q", "num_kv", "tp_size"), SHAPES)
def test_every_rank_attends_with_its_query_heads_kv_head(
    num_q: int, num_kv: int, tp_size: int
) -> None:
    seed = secrets.randbits(31)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = rand(NUM_TOKENS, HIDDEN)
    wq, wk, wv = (
        rand(num_q * HEAD_SIZE, HIDDEN),
        rand(num_kv * HEAD_SIZE, HIDDEN),
        rand(num_kv * HEAD_SIZE, HIDDEN),
    )
    expected = _attention(x, wq, wk, wv)

    kv_rule = kv_column(num_kv, HEAD_SIZE)
    q_per_rank, kv_per_rank = heads_per_rank("layer", num_q, num_kv, tp_size)
    sharded = torch.full_like(expected, float("nan"))
    for rank in range(tp_size):
        tp = TensorParallel(rank=rank, size=tp_size)
        wk_rank, wv_rank = kv_rule.apply(wk, tp), kv_rule.apply(wv, tp)
        assert wk_rank.shape[0] == wv_rank.shape[0] == kv_per_rank * HEAD_SIZE, (
            f"rank {rank}: {wk_rank.shape[0] // HEAD_SIZE} KV heads, want {kv_per_rank}"
        )
        heads = slice(rank * q_per_rank, (rank + 1) * q_per_rank)
        sharded[:, heads] = _attention(x, COLUMN.apply(wq, tp), wk_rank, wv_rank)

    assert not sharded.isnan().any(), f"query heads no rank wrote (seed {seed})"
    for rank in range(tp_size):
        heads = slice(rank * q_per_rank, (rank + 1) * q_per_rank)
        error = float((sharded[:, heads] - expected[:, heads]).norm() / expected[:, heads].norm())
        assert error < RTOL, (
            f"rank {rank} of tp {tp_size} (query heads {heads.start}..{heads.stop - 1}, "
            f"KV head {heads.start // (num_q // num_kv)} in the full model): relative error "
            f"{error:.3g} against the unsharded attention (seed {seed})"
        )
