"""One tensor-parallel rank of a greedy speculative-decoding run.

``greedy_rank`` is the rank entry that ``test_tensor_parallel`` hands to
``attngroup.suites.tp_launch.launch``: it builds this rank's shard of the engine on the
rank's device (all-reduces over the launcher's process group: NCCL on CUDA,
gloo on the CPU), decodes the suite's prompts greedily, and returns its tokens
and its attention groups (``attngroup.suites.tp_checks.rank_groups``).
"""

from __future__ import annotations

from pathlib import Path

from attngroup.suites.spec_decode.harness import DTYPES, EngineFactory, greedy_generate, prompts_for
from attngroup.suites.tp_checks import rank_groups
from attngroup.suites.tp_launch import RankContext


def greedy_rank(
    ctx: RankContext, pair: str, backend: str, dtype: str, num_spec_tokens: int, weights_root: str
) -> dict:
    engine = EngineFactory(Path(weights_root)).engine(
        pair,
        backend=backend,
        dtype=DTYPES[dtype],
        device=str(ctx.device),
        num_spec_tokens=num_spec_tokens,
        tp_rank=ctx.rank,
        tp_size=ctx.world_size,
        tp_group=ctx.group,
    )
    return {
        "tokens": greedy_generate(engine, prompts_for(pair)),
        "groups": rank_groups(engine.runner),
    }
