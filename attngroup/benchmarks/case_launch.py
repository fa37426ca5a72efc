"""Our Triton launcher's path and heuristic launch parameters for a benchmark case.

Pure planning over the case's sizes: importing this loads no kernel, so it neither picks
Triton's interpreter nor needs a device (the offline compile relies on both).
"""

from __future__ import annotations

from attngroup.benchmarks.attention_cases import Case
from attngroup.kernels.ops.triton_launch_config import (
    LaunchConfig,
    LaunchKind,
    choose_launch_config,
    select_path,
)


def triton_path(case: Case, seq_threshold_3d: int | None = None) -> LaunchKind:
    """The path our Triton launcher takes for a case (with split-KV scratch allocated)."""
    return select_path(
        num_seqs=case.batch_size,
        max_query_len=case.query_len,
        num_heads_q=case.num_heads_q,
        num_kv_heads=case.shape.num_kv_heads,
        head_size=case.shape.head_size,
        has_scratch=True,
        seq_threshold_3d=seq_threshold_3d,
    )


def heuristic_launch_config(case: Case) -> LaunchConfig:
    """The launch configuration our heuristic picks for a case on its Triton path."""
    return choose_launch_config(
        num_heads_q=case.num_heads_q,
        num_kv_heads=case.shape.num_kv_heads,
        head_size=case.shape.head_size,
        num_seqs=case.batch_size,
        max_query_len=case.query_len,
        max_seq_len=case.context_len,
        path=triton_path(case),
    )
