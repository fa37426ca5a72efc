"""Tensor parallelism in the model runner: two ranks (one process each through
``attngroup.suites.tp_launch``: NCCL on two GPUs, gloo on the CPU) must give the logits
and draft distributions of the unsharded runner.

Each rank builds its shard of the target and the draft (query heads, MLP and
expert columns and state heads split; KV heads split or replicated), runs a
prefill, drafts, and verifies the unsharded runner's tokens, so both runs see
the same inputs; each rank returns what it saw and its attention groups, which
must carry that rank's heads (``attngroup.suites.tp_checks``).

Bounds: fp32 as the runner suite's other same-weights comparisons (1e-5);
bf16 per logits row as ``attngroup/suites/spec_decode/test_greedy_identity.py`` (same
weights, only the split of the work differs). The bf16 bounds were measured
there on one device, not across TP sizes: no two-GPU machine was available
when these cases were written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attngroup.kernels.registry import get_backend
from attngroup.reference_engine.engine.model_runner import ModelRunner
from attngroup.reference_engine.engine.step import (
    ProposeInput,
    ProposeRequest,
    ScheduledChunk,
    StepBatch,
)
from attngroup.reference_engine.model_pairs import MODEL_PAIRS, get_model_pair
from attngroup.suites.spec_decode.test_greedy_identity import (
    BF16_MAX_ROW_RTOL,
    BF16_MEDIAN_ROW_RTOL,
)
from attngroup.suites.tp_checks import rank_group_problems, rank_groups
from attngroup.suites.tp_launch import RankContext, launch, missing_devices_reason

#: Two model processes on a CPU take minutes; on two GPUs these cases are quick.
pytestmark = [] if torch.cuda.is_available() else [pytest.mark.slow]

TP_SIZE = 2
RTOL = 1e-5
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PROMPT = (31, 8, 250, 77, 5, 19, 140)
NUM_DRAFTS = 2
LAUNCH_TIMEOUT_S = 540
#: Triton runs under its interpreter on the CPU, minutes per pair in two rank processes:
#: there only this pair checks Triton's TP path (its scratch sized by per-rank heads).
CPU_TRITON_PAIR = "gemma4-e2b-mtp"


def _runner(pair: str, backend: str, dtype: str, device, weights_dir: Path, **tp) -> ModelRunner:
    return ModelRunner(
        get_model_pair(pair),
        backend=backend,
        dtype=DTYPES[dtype],
        device=device,
        num_blocks=8,
        num_spec_tokens=NUM_DRAFTS,
        weights_dir=weights_dir,
        **tp,
    )


def _steps(runner: ModelRunner, follow: dict | None = None) -> dict:
    """Prefill, draft 2 tokens at temperature 1, verify: every output.

    With ``follow`` (an earlier run's result) the verify step takes that run's
    next token and drafts, so two runs verify the same tokens even when a
    bf16 near-tie made them pick differently."""
    blocks = (tuple(range(4)),) * len(runner.kv_cache_groups)
    prefill = runner.execute_target(
        StepBatch((ScheduledChunk("r", PROMPT, 0, blocks, "all"),))
    ).logits[0]
    next_token = int(prefill[-1].argmax()) if follow is None else follow["next_token"]
    tokens = (*PROMPT, next_token)
    request = ProposeRequest("r", tokens, blocks, temperature=1.0)
    drafts = runner.propose(ProposeInput((request,), torch.Generator().manual_seed(5)), NUM_DRAFTS)
    verify_drafts = drafts.draft_token_ids[0] if follow is None else follow["draft_tokens"][0]
    verify = runner.execute_target(
        StepBatch(
            (
                ScheduledChunk(
                    "r", (next_token, *verify_drafts.tolist()), len(PROMPT), blocks, "all"
                ),
            )
        )
    ).logits[0]
    return {
        "prefill": prefill.float().cpu(),
        "next_token": next_token,
        "draft_tokens": drafts.draft_token_ids.cpu(),
        "draft_probs": drafts.draft_probs.float().cpu(),
        "verify": verify.float().cpu(),
    }


def rank_steps(
    ctx: RankContext, pair: str, backend: str, dtype: str, weights_dir: str, follow_file: str
) -> dict:
    """Rank entry for ``attngroup.suites.tp_launch``: this rank's outputs and attention groups."""
    runner = _runner(
        pair,
        backend,
        dtype,
        ctx.device,
        Path(weights_dir),
        tp_rank=ctx.rank,
        tp_size=ctx.world_size,
        tp_group=ctx.group,
    )
    follow = torch.load(follow_file, weights_only=True)
    return {"steps": _steps(runner, follow), "groups": rank_groups(runner)}


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm())


def _check_bf16_rows(name: str, actual: torch.Tensor, expected: torch.Tensor) -> list[float]:
    errors = (actual - expected).norm(dim=-1) / expected.norm(dim=-1)
    assert float(errors.max()) < BF16_MAX_ROW_RTOL, f"{name}: bf16 row errors {errors.tolist()}"
    return errors.tolist()


CASES = [
    pytest.param(pair, backend, dtype, id=f"{pair}-{backend}-{dtype}-tp{TP_SIZE}")
    for pair, model_pair in MODEL_PAIRS.items()
    if TP_SIZE in model_pair.supported_tp_sizes
    for backend in ("torch", "triton", "flashinfer")
    for dtype in DTYPES
    if DTYPES[dtype] in get_backend(backend).supported_dtypes
]


@pytest.mark.parametrize(("pair", "backend", "dtype"), CASES)
def test_two_ranks_match_one(
    tmp_path: Path, pair: str, backend: str, dtype: str, device: torch.device
) -> None:
    if not get_backend(backend).is_available(device):
        pytest.skip(f"the {backend} backend is not available on {device.type} here")
    if device.type == "cpu" and dtype != "fp32":
        pytest.skip("bf16 TP cases run on CUDA only (their bounds are for GPU kernels)")
    if device.type == "cpu" and backend == "triton" and pair != CPU_TRITON_PAIR:
        pytest.skip(f"Triton TP on the CPU (interpreter) runs for {CPU_TRITON_PAIR} only")
    reason = missing_devices_reason(device.type, TP_SIZE)
    if reason is not None:
        pytest.skip(reason)
    weights = tmp_path / "weights"
    unsharded = _runner(pair, backend, dtype, device, weights)
    single = _steps(unsharded)
    follow_file = tmp_path / "follow.pt"
    torch.save({key: single[key] for key in ("next_token", "draft_tokens")}, follow_file)
    ranks = launch(
        f"{__name__}:rank_steps",
        {
            "pair": pair,
            "backend": backend,
            "dtype": dtype,
            "weights_dir": str(weights),
            "follow_file": str(follow_file),
        },
        world_size=TP_SIZE,
        device_type=device.type,
        work_dir=tmp_path / "ranks",
        timeout_s=LAUNCH_TIMEOUT_S,
    )
    groups = rank_groups(unsharded)
    for rank, result in enumerate(ranks):
        problems = rank_group_problems(rank, result["groups"], groups, TP_SIZE)
        assert not problems, "\n".join(problems)
    sharded = ranks[0]["steps"]
    for rank, result in enumerate(ranks[1:], start=1):
        for name in ("prefill", "draft_probs", "verify"):
            assert torch.equal(result["steps"][name], sharded[name]), (
                f"rank {rank}'s {name} differs from rank 0's: the all-reduce must give every "
                "rank the same values"
            )
    if dtype == "fp32":
        assert torch.equal(sharded["draft_tokens"], single["draft_tokens"])
        for name in ("prefill", "draft_probs", "verify"):
            error = _relative_error(sharded[name], single[name])
            assert error < RTOL, f"{name}: relative error {error:.2e}"
        return
    errors = [
        error
        for name in ("prefill", "verify")
        for error in _check_bf16_rows(name, sharded[name], single[name])
    ]
    median = float(torch.tensor(errors).median())
    assert median < BF16_MEDIAN_ROW_RTOL, f"median bf16 row error {median:.3g}"
