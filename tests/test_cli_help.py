"""Every command line prints its help quickly and states its exit statuses.

argparse formats help strings with ``%``, so a stray percent sign in one option's
help breaks ``--help`` for the whole subcommand. ``--help``, argument errors and
the pair listing must answer without importing torch, transformers, triton or tqdm
(seconds each on a loaded machine): a probe runs the command as ``python -m``
does and reports which of them were imported and the CPU time it took (CPU time,
unlike wall time, barely moves when other jobs load the machine).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
HEAVY_MODULES = ("torch", "transformers", "triton", "tqdm")
MAX_CPU_SECONDS = 1.0

COMMANDS = [
    ("attngroup.ci",),
    ("attngroup.ci", "select"),
    ("attngroup.ci", "pipeline"),
    ("attngroup.ci", "check-deps"),
    ("attngroup.ci", "lint"),
    ("attngroup.reports",),
    ("attngroup.reports", "build"),
    ("attngroup.reports", "compare"),
    ("attngroup.reports", "archive"),
    ("attngroup.reference_engine",),
    ("attngroup.reference_engine", "pairs"),
    ("attngroup.reference_engine", "inspect"),
    ("attngroup.reference_engine", "generate"),
    ("attngroup.benchmarks.bench_attention",),
    ("attngroup.benchmarks.bench_metadata",),
    ("attngroup.benchmarks.bench_spec_decode",),
    ("attngroup.benchmarks.tuning.sweep",),
    ("attngroup.benchmarks.tuning.ab",),
    ("attngroup.benchmarks.tuning.offline_compile",),
    ("attngroup.benchmarks.table",),
    ("attngroup.benchmarks.run_record",),
    ("attngroup.suites.engines.vllm_releases",),
    ("attngroup.suites.engines.vllm_checkout",),
    ("attngroup.suites.grouping.vllm_timeline",),
    ("attngroup.suites.grouping.vllm_timeline", "run"),
]

# Runs a module as ``python -m`` would, then reports on stderr what it imported.
PROBE = f"""
import json, runpy, sys, time
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
start = time.process_time()
code = 0
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as exit:
    code = exit.code
heavy = [name for name in {HEAVY_MODULES!r} if name in sys.modules]
print("PROBE " + json.dumps({{"code": code, "heavy": heavy, "cpu_s": time.process_time() - start}}),
      file=sys.stderr)
"""


def probe(*argv: str) -> tuple[subprocess.CompletedProcess, dict]:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = completed.stderr.strip().splitlines()[-1]
    assert line.startswith("PROBE "), completed.stderr
    return completed, json.loads(line.removeprefix("PROBE "))


def ids(commands) -> list[str]:
    return [" ".join(command) for command in commands]


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_help_exits_0_with_usage_and_exit_statuses(command: tuple[str, ...]) -> None:
    completed, report = probe(*command, "--help")
    assert report["code"] == 0, completed.stderr
    assert completed.stdout.startswith(f"usage: python -m {command[0]}"), completed.stdout[:200]
    assert "exit status" in completed.stdout.lower(), completed.stdout


FAST_COMMANDS = [
    *[(*command, "--help") for command in COMMANDS],
    ("attngroup.reference_engine", "pairs"),
    ("attngroup.reference_engine", "inspect", "gemma4-e2b-mtp", "--tp", "abc"),
    ("attngroup.reference_engine", "generate", "gemma4-e2b-mtp", "--backend", "mamba"),
    ("attngroup.benchmarks.bench_metadata", "--pair", "bogus"),
    ("attngroup.benchmarks.bench_attention", "--shapes", "bogus"),
    ("attngroup.benchmarks.bench_attention", "--runs", "3"),
]


@pytest.mark.parametrize("argv", FAST_COMMANDS, ids=ids(FAST_COMMANDS))
def test_answers_without_torch_transformers_or_triton(argv: tuple[str, ...]) -> None:
    completed, report = probe(*argv)
    assert report["code"] in (0, 2), completed.stderr
    assert report["heavy"] == [], f"{' '.join(argv)} imported {report['heavy']}"
    assert report["cpu_s"] < MAX_CPU_SECONDS, report


def _session_docstrings() -> list:
    sessions = []
    for path in (REPO_ROOT / "noxfile.py", REPO_ROOT / "noxfile_vllm.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                "nox.session" in ast.unparse(decorator) for decorator in node.decorator_list
            ):
                sessions.append(
                    pytest.param(node.name, ast.get_docstring(node) or "", id=node.name)
                )
    return sessions


@pytest.mark.parametrize(("name", "doc"), _session_docstrings())
def test_nox_session_summary_is_one_whole_sentence(name: str, doc: str) -> None:
    """``nox -l`` shows a docstring's first line: it must be the whole summary."""
    first_line = doc.splitlines()[0] if doc else ""
    assert first_line.endswith("."), f"session {name}: first docstring line {first_line!r}"
