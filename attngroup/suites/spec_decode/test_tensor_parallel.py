"""Tensor parallelism: greedy speculative decoding at tp = 2 (one process per
rank through ``attngroup.suites.tp_launch``: NCCL on two GPUs, gloo on the CPU) emits the
tokens of tp = 1, and each rank's attention groups and builders carry per-rank
head counts (``attngroup.suites.tp_checks``).

fp32 only: token equality across TP sizes is exact there; bf16 TP is judged on
logits by ``attngroup/suites/engine_runner/test_tensor_parallel.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attngroup.reference_engine.model_pairs import MODEL_PAIRS
from attngroup.suites.spec_decode.harness import DEVICE, ON_GPU, case_marks
from attngroup.suites.tp_checks import rank_group_problems, rank_groups
from attngroup.suites.tp_launch import launch, missing_devices_reason

TP_SIZE = 2
NUM_SPEC_TOKENS = 1
LAUNCH_TIMEOUT_S = 540
#: The CPU runs this case by default; the rest are slow there (two model processes on two cores).
CPU_TP_CASE = ("gemma4-e2b-mtp", "torch")
MISSING_DEVICES = missing_devices_reason(DEVICE, TP_SIZE)
CPU_TRITON_SKIP = (
    "Triton spec decode over TP runs on CUDA only (the interpreter takes minutes per rank); "
    "on the CPU attngroup/suites/engine_runner/test_tensor_parallel.py covers Triton's TP path"
)


def _marks(pair: str, backend: str) -> list:
    marks = case_marks(pair, backend, "fp32", tp=TP_SIZE)
    if MISSING_DEVICES:
        marks.append(pytest.mark.skip(reason=MISSING_DEVICES))
    elif not ON_GPU and backend == "triton":
        marks.append(pytest.mark.skip(reason=CPU_TRITON_SKIP))
    slow = any(mark.name == "slow" for mark in marks)
    if not ON_GPU and (pair, backend) != CPU_TP_CASE and not slow:
        marks.append(pytest.mark.slow)
    return marks


CASES = [
    pytest.param(
        pair, backend, marks=_marks(pair, backend), id=f"{pair}-{backend}-fp32-tp{TP_SIZE}"
    )
    for pair, model_pair in MODEL_PAIRS.items()
    if TP_SIZE in model_pair.supported_tp_sizes
    for backend in ("torch", "triton")
]


@pytest.mark.parametrize(("pair", "backend"), CASES)
def test_tp2_matches_tp1(
    engines, target_only_tokens, pair: str, backend: str, tmp_path: Path
) -> None:
    unsharded = rank_groups(
        engines.engine(pair, backend=backend, num_spec_tokens=NUM_SPEC_TOKENS).runner
    )
    ranks = launch(
        "attngroup.suites.spec_decode.tp_worker:greedy_rank",
        {
            "pair": pair,
            "backend": backend,
            "dtype": "fp32",
            "num_spec_tokens": NUM_SPEC_TOKENS,
            "weights_root": str(engines.weights_root),
        },
        world_size=TP_SIZE,
        device_type=DEVICE,
        work_dir=tmp_path,
        timeout_s=LAUNCH_TIMEOUT_S,
    )
    reference = target_only_tokens(pair, backend, "fp32")
    for rank, result in enumerate(ranks):
        assert result["tokens"] == reference, (
            f"rank {rank} of tp={TP_SIZE} emitted other tokens than tp=1"
        )
        problems = rank_group_problems(rank, result["groups"], unsharded, TP_SIZE)
        assert not problems, "\n".join(problems)
