"""Tensor parallelism in the model runner: two CPU ranks (gloo) must give the
logits and draft distributions of the unsharded runner.

Each rank builds its shard of the target and the draft (query heads, MLP and
expert columns and state heads split; KV heads split or replicated), runs a
prefill, drafts, and verifies; rank 0 writes what it saw, and the test
compares it with a single-rank runner on the same batches.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reference_engine.model_pairs import get_model_pair
from reference_engine.model_runner import ModelRunner, ProposeInput, ProposeRequest
from reference_engine.step import ScheduledChunk, StepBatch

pytestmark = pytest.mark.slow

TP_SIZE = 2
RTOL = 1e-5
PROMPT = (31, 8, 250, 77, 5, 19, 140)


def _steps(runner: ModelRunner) -> dict[str, torch.Tensor]:
    """Prefill, draft 2 tokens at temperature 1, verify them: every output."""
    blocks = (tuple(range(4)),) * len(runner.kv_cache_groups)
    prefill = runner.execute_target(
        StepBatch((ScheduledChunk("r", PROMPT, 0, blocks, "all"),))
    ).logits[0]
    tokens = (*PROMPT, int(prefill[-1].argmax()))
    request = ProposeRequest("r", tokens, blocks, temperature=1.0)
    drafts = runner.propose(ProposeInput((request,), torch.Generator().manual_seed(5)), 2)
    verify_tokens = (tokens[-1], *drafts.draft_token_ids[0].tolist())
    verify = runner.execute_target(
        StepBatch((ScheduledChunk("r", verify_tokens, len(PROMPT), blocks, "all"),))
    ).logits[0]
    return {
        "prefill": prefill.cpu(),
        "draft_tokens": drafts.draft_token_ids,
        "draft_probs": drafts.draft_probs,
        "verify": verify.cpu(),
    }


def _rank_main(
    rank: int, pair_name: str, device_type: str, init_file: str, weights_dir: str, out_file: str
) -> None:
    backend = "nccl" if device_type == "cuda" else "gloo"
    device = torch.device(f"cuda:{rank}") if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, init_method=f"file://{init_file}", rank=rank, world_size=TP_SIZE
    )
    try:
        runner = ModelRunner(
            get_model_pair(pair_name),
            device=device,
            tp_rank=rank,
            tp_size=TP_SIZE,
            num_blocks=8,
            weights_dir=Path(weights_dir),
        )
        results = _steps(runner)
        if rank == 0:
            torch.save(results, out_file)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "pair_name",
    [
        pytest.param("llama3-eagle", id="llama3-eagle-torch-fp32-tp2"),
        pytest.param("gemma4-e2b-mtp", id="gemma4-e2b-mtp-torch-fp32-tp2", marks=pytest.mark.mtp),
        pytest.param("qwen3-next-mtp", id="qwen3-next-mtp-torch-fp32-tp2", marks=pytest.mark.mtp),
    ],
)
def test_two_ranks_match_one(tmp_path: Path, pair_name: str, device: torch.device) -> None:
    if not dist.is_available():
        pytest.fail("torch.distributed is not available in this torch build")
    if device.type == "cuda" and torch.cuda.device_count() < TP_SIZE:
        pytest.skip(
            f"tensor parallelism on CUDA needs {TP_SIZE} GPUs, found {torch.cuda.device_count()}"
        )
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the ranks are fresh processes
    weights = tmp_path / "weights"
    single = _steps(
        ModelRunner(get_model_pair(pair_name), device=device, num_blocks=8, weights_dir=weights)
    )
    out_file = tmp_path / "rank0.pt"
    mp.spawn(
        _rank_main,
        args=(pair_name, device.type, str(tmp_path / "init"), str(weights), str(out_file)),
        nprocs=TP_SIZE,
        join=True,
    )
    sharded = torch.load(out_file)
    assert torch.equal(sharded["draft_tokens"], single["draft_tokens"])
    for name in ("prefill", "draft_probs", "verify"):
        error = float((sharded[name] - single[name]).norm() / single[name].norm())
        assert error < RTOL, f"{name}: relative error {error:.2e}"
