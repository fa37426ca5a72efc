"""Running a compile-only tool (``attngroup.benchmarks.tuning``) as CI does: the interpreter
off and no GPU visible, so Triton compiles for sm_90 and launches nothing."""

from __future__ import annotations

import os
import subprocess
import sys

COMPILED_ENV = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | {
    "CUDA_VISIBLE_DEVICES": ""
}


def run_tool(
    module: str, *args: str, env: dict[str, str] = COMPILED_ENV
) -> subprocess.CompletedProcess:
    """``python -m attngroup.benchmarks.tuning.MODULE ARGS``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", f"attngroup.benchmarks.tuning.{module}", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
