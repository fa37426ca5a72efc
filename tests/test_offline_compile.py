"""The offline sm_90 compile: Triton's compiler and ptxas, no GPU and no interpreter.

It checks on the CPU what the interpreter never runs: the kernels' GPU-only branches compile
for Hopper, and the tuned entries still buy the occupancy they were adopted for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import triton

from tests.sm90_compile import COMPILED_ENV, run_tool

E4B_DECODE_512 = "decode.gemma4-e4b-full-d512.b64x8k"
E4B_DRAFT_256 = "draft.gemma4-e4b-sliding-d256.b64x8k"


def _offline_compile(*args: str, env: dict[str, str] = COMPILED_ENV) -> subprocess.CompletedProcess:
    return run_tool("offline_compile", *args, env=env)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict]:
    report = tmp_path_factory.mktemp("offline") / "compile.json"
    cases = f"{E4B_DECODE_512},{E4B_DRAFT_256}"
    done = _offline_compile("--cases", cases, "--variants", "current", "--json", str(report))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Triton {triton.__version__}, sm_90\n")
    return {(row["case"], row["variant"]): row for row in json.loads(report.read_text())}


def test_the_register_cap_buys_a_third_program_per_sm(rows) -> None:
    """The e4b head-256 draft's entry caps registers at 168 for 3 programs per SM, and the
    launcher fits one wave of 3 segments per (request, KV head) to them."""
    draft = rows[(E4B_DRAFT_256, "current")]
    assert draft["config"]["max_registers"] == 168
    assert draft["attention"]["registers"] <= 168
    assert draft["attention"]["programs_per_sm"] == 3
    assert draft["grid"] == [64, 2, 3]


def test_head_512_runs_one_wave_of_two_programs_per_sm(rows) -> None:
    """The head-512 tensor-descriptor entry: 2 programs per SM, so the e4b at 64 x 8k takes
    one wave of 2 segments (Nsight Compute on the H200: 255 registers, one wave of 256)."""
    decode = rows[(E4B_DECODE_512, "current")]
    assert decode["attention"]["programs_per_sm"] == 2
    assert decode["grid"] == [64, 2, 2]


def test_under_the_interpreter_it_refuses_and_writes_nothing(tmp_path: Path) -> None:
    report = tmp_path / "compile.json"
    done = _offline_compile(
        "--cases",
        E4B_DRAFT_256,
        "--json",
        str(report),
        env=COMPILED_ENV | {"TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 2
    assert "TRITON_INTERPRET is set" in done.stderr
    assert not report.exists()


def test_an_unknown_variant_is_named(tmp_path: Path) -> None:
    done = _offline_compile("--cases", E4B_DRAFT_256, "--variants", "current,no-such-variant")
    assert done.returncode == 2
    assert "no-such-variant" in done.stderr


def test_a_triton_without_the_launchers_binder_is_named(tmp_path: Path) -> None:
    """Our tool's failure, not a kernel's: a Triton whose internals moved gets a clear error,
    exit 2 and no file."""
    report = tmp_path / "compile.json"
    script = (
        "import sys, triton.runtime.jit as jit; del jit.create_function_from_signature; "
        "from attngroup.benchmarks.tuning.offline_compile import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "--cases", E4B_DRAFT_256, "--json", str(report)],
        capture_output=True,
        text=True,
        env=COMPILED_ENV,
        timeout=600,
    )
    assert done.returncode == 2
    assert "create_function_from_signature" in done.stderr
    assert "Traceback" not in done.stderr
    assert not report.exists()


def test_a_program_over_the_shared_memory_an_sm_grants_fits_none() -> None:
    """A kernel asking more shared memory than an H200 program may have cannot launch: 0 per
    SM, not the one a too-large kernel would be rounded up to."""
    from attngroup.benchmarks.tuning.offline_compile import (
        H200_SHARED_BYTES_PER_PROGRAM,
        CompiledKernel,
    )

    def kernel(shared_bytes: int) -> CompiledKernel:
        return CompiledKernel(registers=168, stack_bytes=0, shared_bytes=shared_bytes, num_warps=12)

    assert kernel(H200_SHARED_BYTES_PER_PROGRAM).programs_per_sm == 1
    assert kernel(H200_SHARED_BYTES_PER_PROGRAM + 1).programs_per_sm == 0
