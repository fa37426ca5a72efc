"""While pytest-xdist workers share one GPU, each test hands its cached GPU memory back."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

# The first test ends with CUDA in use; the second counts the caches handed back since.
TESTS = """
import os

import torch

released = []
torch.cuda.is_initialized = lambda: True
torch.cuda.empty_cache = lambda: released.append(True)


def test_first():
    pass


def test_second():
    assert len(released) == int(os.environ["EXPECTED_RELEASES"])
"""


@pytest.mark.parametrize(
    ("options", "expected_releases"),
    [
        pytest.param(["-n", "2", "--dist", "loadfile"], 1, id="two-workers-release"),
        pytest.param(["-p", "no:xdist"], 0, id="one-process-keeps-its-cache"),
    ],
)
def test_cache_is_released_only_when_workers_share_the_gpu(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    options: list[str],
    expected_releases: int,
) -> None:
    pytester.makeconftest(REPO_CONFTEST.read_text())
    pytester.makepyfile(test_shared=TESTS)
    monkeypatch.setenv("EXPECTED_RELEASES", str(expected_releases))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *options)
    result.assert_outcomes(passed=2)
