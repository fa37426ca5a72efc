"""The FlashInfer backend's wrapper choice table: one rule per head size and query shape.

The GPU kernel suite runs every chosen path against the oracle; here the rule
itself is checked on the CPU: which wrapper and options each geometry gets, and
that every row carries the measurement that justifies it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from attngroup.kernels.backends.flashinfer_attn import (
    FA2_PREFILL,
    TENSOR_CORE_DECODE,
    VERIFY_DECODE,
    WRAPPER_CHOICES,
    WrapperChoice,
    choose_wrapper,
    query_shape,
)

pytestmark = pytest.mark.kernels

REPO_ROOT = Path(__file__).resolve().parents[3]

HEAD_SIZES = (64, 128, 256, 512)


@pytest.mark.parametrize("head_dim", HEAD_SIZES, ids=lambda size: f"d{size}")
@pytest.mark.parametrize(
    ("queries", "expected"),
    [("single", TENSOR_CORE_DECODE), ("uniform", FA2_PREFILL), ("mixed", FA2_PREFILL)],
    ids=["decode", "verify", "mixed"],
)
def test_choice_per_geometry(head_dim: int, queries, expected: WrapperChoice) -> None:
    """FlashInfer 0.7.4 runs the tensor-core decode at every head size, and any longer query
    on FA2 prefill (a hair faster on verify than its decode with q_len_per_req)."""
    assert choose_wrapper(head_dim, queries) == expected


@pytest.mark.parametrize(
    ("query_lens", "expected"),
    [((1, 1, 1), "single"), ((4, 4), "uniform"), ((4, 1), "mixed"), ((9, 4, 4), "mixed")],
    ids=["one-token", "verify", "verify-and-decode", "prefill-chunk"],
)
def test_query_shape(query_lens: tuple[int, ...], expected: str) -> None:
    assert query_shape(torch.tensor(query_lens)) == expected


def test_no_choice_beyond_head_512() -> None:
    with pytest.raises(ValueError, match="no wrapper choice for head size 1024"):
        choose_wrapper(1024, "single")


@pytest.mark.parametrize(
    ("choice", "serves"),
    [
        (TENSOR_CORE_DECODE, {"single"}),
        (WrapperChoice("decode", tensor_cores=False), {"single"}),
        (VERIFY_DECODE, {"uniform"}),
        (WrapperChoice("decode", tensor_cores=False, q_len_per_req=True), set()),
        (FA2_PREFILL, {"single", "uniform", "mixed"}),
    ],
    ids=lambda value: value.describe() if isinstance(value, WrapperChoice) else "",
)
def test_which_batches_a_wrapper_serves(choice: WrapperChoice, serves: set[str]) -> None:
    """Decode takes one token per request, or one uniform length with q_len_per_req (tensor
    cores only, as FlashInfer 0.7.4 requires)."""
    assert {
        queries for queries in ("single", "uniform", "mixed") if choice.serves(queries)
    } == serves


def test_every_row_serves_its_queries() -> None:
    for row in WRAPPER_CHOICES:
        assert row.choice.serves(row.queries), row.choice.describe()


@pytest.mark.parametrize("row", WRAPPER_CHOICES, ids=lambda row: row.choice.describe())
def test_every_row_names_its_evidence(row) -> None:
    """Each row names a committed result file that exists in the repository."""
    files = re.findall(r"attngroup/benchmarks/results/[\w.-]+\.json", row.evidence)
    assert files, f"row {row.choice.describe()} names no result file"
    missing = [name for name in files if not (REPO_ROOT / name).is_file()]
    assert not missing, f"row {row.choice.describe()} cites missing result files {missing}"
