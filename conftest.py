"""Repository-wide pytest options: the suites' ``--engine``, ``--device`` and ``--pairs``
(used in ``attngroup/suites/conftest.py``; declared here so that a run naming no path, such as
``pytest -k mtp --pairs FILE``, knows them), and ``--shard INDEX/COUNT``, which runs one
deterministic slice; and, while several pytest-xdist workers share one GPU, each test hands
its cached GPU memory back when it ends.

A GPU suite that needs longer than one CI job (or one lent machine) may be split
across jobs, as Buildkite's ``parallelism`` does: job ``INDEX`` of ``COUNT``
(0-based, e.g. ``--shard $BUILDKITE_PARALLEL_JOB/$BUILDKITE_PARALLEL_JOB_COUNT``)
keeps the tests whose node id hashes to it, so the shards are disjoint, cover
every test, and do not depend on collection order or on which process collects.
Tests outside the shard are reported as deselected (the run record says so).
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Iterator

import pytest

from attngroup.reference_engine.pairs.pair_options import PAIRS_ENV, pairs_file_from_env
from attngroup.reports.pytest_plugin import xdist_workers


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attention-grouping conformance")
    group.addoption(
        "--engine",
        default="reference",
        help="implementation under test: reference (default) or vllm (needs vLLM installed)",
    )
    group.addoption(
        "--device",
        default=None,
        help="device for kernels and the engine (default: cuda when available, else cpu)",
    )
    group.addoption(
        "--pairs",
        default=pairs_file_from_env(),
        metavar="FILE",
        help=f"a pairs file (YAML) whose model pairs join every suite's parametrization "
        f"(default: ${PAIRS_ENV})",
    )
    parser.addoption(
        "--shard",
        default=None,
        metavar="INDEX/COUNT",
        help="run only shard INDEX (0-based) of COUNT, chosen by a hash of each test's node id",
    )


def parse_shard(text: str) -> tuple[int, int]:
    """``"1/4"`` -> ``(1, 4)``; raises ``pytest.UsageError`` naming the problem."""
    index_text, separator, count_text = text.partition("/")
    if not separator or not index_text.isdigit() or not count_text.isdigit():
        raise pytest.UsageError(f"--shard {text!r}: expected INDEX/COUNT, for example 0/2")
    index, count = int(index_text), int(count_text)
    if count < 1 or index >= count:
        raise pytest.UsageError(f"--shard {text!r}: INDEX must be in [0, COUNT) and COUNT >= 1")
    return index, count


def shard_of(nodeid: str, count: int) -> int:
    return zlib.crc32(nodeid.encode()) % count


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    text = config.getoption("shard")
    if text is None:
        return
    index, count = parse_shard(text)
    kept = [item for item in items if shard_of(item.nodeid, count) == index]
    deselected = [item for item in items if shard_of(item.nodeid, count) != index]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = kept


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory(request: pytest.FixtureRequest) -> Iterator[None]:
    """Workers sharing a GPU each keep what torch's caching allocator once reserved, so one
    worker may hold many GiB a finished test no longer uses while another runs out of memory:
    hand the cache back after each test when more than one worker shares the device."""
    yield
    torch = sys.modules.get("torch")  # a run that never imported torch has no CUDA to release
    if xdist_workers(request.config) > 1 and torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
