"""The FlashInfer backend's wrapper choice table: one rule per head size and query length.

The GPU kernel suite runs every chosen path against the oracle; here the rule
itself is checked on the CPU: which wrapper and options each geometry gets, and
that every row carries the measurement that justifies it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attngroup.kernels.backends.flashinfer_attn import (
    WRAPPER_CHOICES,
    WrapperChoice,
    choose_wrapper,
)

pytestmark = pytest.mark.kernels

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("head_dim", "multi_token", "expected"),
    [
        (128, False, WrapperChoice("decode", tensor_cores=True, prefill_backend=None)),
        (256, False, WrapperChoice("decode", tensor_cores=True, prefill_backend=None)),
        (128, True, WrapperChoice("prefill", tensor_cores=True, prefill_backend="fa2")),
        (256, True, WrapperChoice("prefill", tensor_cores=True, prefill_backend="fa2")),
        (512, False, WrapperChoice("decode", tensor_cores=False, prefill_backend=None)),
        (512, True, WrapperChoice("expanded_decode", tensor_cores=False, prefill_backend=None)),
    ],
    ids=["d128-decode", "d256-decode", "d128-verify", "d256-verify", "d512-decode", "d512-verify"],
)
def test_choice_per_geometry(head_dim: int, multi_token: bool, expected: WrapperChoice) -> None:
    """Tensor-core decode and FA2 prefill up to head 256; CUDA-core decode at head 512."""
    assert choose_wrapper(head_dim, multi_token) == expected


def test_no_choice_beyond_head_512() -> None:
    with pytest.raises(ValueError, match="no wrapper choice for head size 1024"):
        choose_wrapper(1024, multi_token=False)


def test_no_row_uses_fa3_or_cuda_core_decode_below_head_512() -> None:
    """The two slow paths the measurements ruled out stay out of the table."""
    for row in WRAPPER_CHOICES:
        assert row.choice.prefill_backend in (None, "fa2")
        if row.max_head_dim <= 256:
            assert row.choice.tensor_cores


@pytest.mark.parametrize("row", WRAPPER_CHOICES, ids=lambda row: row.choice.describe())
def test_every_row_names_its_evidence(row) -> None:
    """Each row names a committed result file that exists in the repository."""
    files = re.findall(r"attngroup/benchmarks/results/[\w.-]+\.json", row.evidence)
    assert files, f"row {row.choice.describe()} names no result file"
    missing = [name for name in files if not (REPO_ROOT / name).is_file()]
    assert not missing, f"row {row.choice.describe()} cites missing result files {missing}"
