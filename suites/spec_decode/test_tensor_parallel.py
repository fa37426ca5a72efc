"""Tensor parallelism: tp = 2 as two processes (torch.distributed, gloo on the CPU,
all-reduce after attention output and MLP) emits the tokens of tp = 1, and each
rank's attention groups carry per-rank head counts (half of tp = 1's)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from suites.spec_decode.harness import ON_GPU, case_marks

REPO_ROOT = Path(__file__).resolve().parents[2]
TP_SIZE = 2
WORKER_TIMEOUT_S = 540
#: Run on the CPU by default; the rest are slow there (two model processes on two cores).
CPU_TP_PAIR = "gemma4-e2b-mtp"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cases() -> list:
    pairs = ["gemma4-e2b-mtp", "qwen3-next-mtp", "llama3-eagle", "qwen3-8b-draft-1.7b"]
    gpu_skip = pytest.mark.skipif(
        ON_GPU, reason="TP here is gloo on the CPU; multi-GPU NCCL TP is not part of this suite"
    )
    return [
        pytest.param(
            pair,
            marks=[
                *case_marks(pair, "torch", "fp32"),
                gpu_skip,
                *([] if ON_GPU or pair == CPU_TP_PAIR else [pytest.mark.slow]),
            ],
            id=f"{pair}-torch-fp32-tp{TP_SIZE}",
        )
        for pair in pairs
    ]


def _launch(pair: str, weights_root: Path, out_dir: Path) -> list[dict]:
    port = _free_port()
    outs = [out_dir / f"rank{rank}.json" for rank in range(TP_SIZE)]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "OMP_NUM_THREADS": "1",
        "TRITON_INTERPRET": "1",
    }
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "suites.spec_decode.tp_worker",
                "--pair",
                pair,
                "--rank",
                str(rank),
                "--world-size",
                str(TP_SIZE),
                "--port",
                str(port),
                "--weights-root",
                str(weights_root),
                "--out",
                str(outs[rank]),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(TP_SIZE)
    ]
    logs = []
    try:
        for worker in workers:
            logs.append(worker.communicate(timeout=WORKER_TIMEOUT_S)[0])
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    for rank, worker in enumerate(workers):
        assert worker.returncode == 0, f"tp rank {rank} failed:\n{logs[rank][-4000:]}"
    return [json.loads(path.read_text()) for path in outs]


@pytest.mark.parametrize("pair", _cases())
def test_tp2_matches_tp1(engines, target_only_tokens, pair: str, tmp_path: Path) -> None:
    tp1 = engines.engine(pair, num_spec_tokens=1)
    tp1_heads = [[group.num_heads_q for group in row] for row in tp1.runner.attention_groups]
    ranks = _launch(pair, engines.weights_root, tmp_path)
    reference = target_only_tokens(pair, "torch", "fp32")
    for rank, result in enumerate(ranks):
        assert result["tokens"] == reference, (
            f"rank {rank} of tp={TP_SIZE} emitted other tokens than tp=1"
        )
        assert result["heads"] == [[heads // TP_SIZE for heads in row] for row in tp1_heads], (
            f"rank {rank}: attention groups must carry per-rank head counts"
        )
