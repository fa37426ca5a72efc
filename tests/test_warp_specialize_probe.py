"""The warp-specialization probe: Triton's automatic warp specialization on sm_90, compiled
without a GPU.

docs/performance.md states where Triton splits an attention loop into producer and consumer
partitions and at what cost; these tests hold the installed Triton to those statements, so a
Triton that changes them fails here before the page goes stale.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.sm90_compile import COMPILED_ENV, run_tool


def _probe(*args: str, env: dict[str, str] = COMPILED_ENV) -> subprocess.CompletedProcess:
    return run_tool("warp_specialize_probe", *args, env=env)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, dict]:
    report = tmp_path_factory.mktemp("probe") / "probe.json"
    done = _probe("--head-sizes", "256", "--rows", "64", "--warps", "4,8", "--json", str(report))
    assert done.returncode == 0, done.stderr
    record = json.loads(report.read_text())
    assert record["triton"]
    return {
        (row["key"]["loop"], row["key"]["num_warps"], row["key"]["warp_specialize"]): row
        for row in record["rows"]
    }


def test_a_query_loaded_by_descriptor_splits_into_a_producer_and_consumers(rows) -> None:
    """Head 256, 64 rows, 4 warps asked: two consumer warp groups and a producer (12 warps),
    registers traded with ``setmaxnreg``, one program per SM where the plain loop holds 2
    (Triton 3.6 and 3.7) or 3 (Triton 3.9, at 168 registers instead of 198-200)."""
    plain = rows[("attention-query-descriptor", 4, False)]
    split = rows[("attention-query-descriptor", 4, True)]
    assert plain["outcome"] == "unchanged"
    assert split["outcome"] == "split"
    assert split["compiled"]["num_warps"] == 12
    assert split["setmaxnreg"] > 0
    assert plain["compiled"]["programs_per_sm"] in (2, 3)
    assert split["compiled"]["programs_per_sm"] == 1


def test_a_query_loaded_by_pointer_is_refused_by_the_partitioning_pass(rows) -> None:
    """The attention kernel loads its query rows by pointer: the pass fails on that loop, and
    the probe reports the compiler's refusal instead of raising."""
    refused = rows[("attention-query-pointer", 4, True)]
    assert refused["outcome"] == "refused"
    assert refused["compiled"] is None
    assert "pass NVGPUWarpSpecialization" in refused["refusal"]


@pytest.mark.parametrize("loop", ["matmul", "attention-query-descriptor"])
def test_eight_warps_are_left_unchanged(rows, loop: str) -> None:
    assert rows[(loop, 8, True)]["outcome"] == "unchanged"
    assert rows[(loop, 8, True)]["compiled"]["num_warps"] == 8


def test_under_the_interpreter_it_refuses_and_writes_nothing(tmp_path: Path) -> None:
    report = tmp_path / "probe.json"
    done = _probe("--json", str(report), env=COMPILED_ENV | {"TRITON_INTERPRET": "1"})
    assert done.returncode == 2
    assert "TRITON_INTERPRET is set" in done.stderr
    assert not report.exists()
