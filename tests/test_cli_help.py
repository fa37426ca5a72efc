"""Every command line prints its help: argparse formats help strings with ``%``, so a
stray percent sign in one option's help breaks ``--help`` for the whole subcommand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

COMMANDS = [
    ("ci",),
    ("ci", "select"),
    ("ci", "pipeline"),
    ("ci", "check-deps"),
    ("ci", "lint"),
    ("reports",),
    ("reports", "build"),
    ("reports", "compare"),
    ("reports", "archive"),
    ("reference_engine",),
    ("reference_engine", "pairs"),
    ("reference_engine", "inspect"),
    ("reference_engine", "generate"),
    ("benchmarks.bench_attention",),
    ("benchmarks.bench_metadata",),
    ("benchmarks.bench_spec_decode",),
    ("benchmarks.tune_attention",),
    ("benchmarks.table",),
    ("benchmarks.run_record",),
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_help_exits_0_with_usage(command: tuple[str, ...]) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", command[0], *command[1:], "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("usage:"), completed.stdout[:200]
