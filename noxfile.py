"""nox sessions: `nox -l` lists them.

CPU sessions install the CPU build of torch (pinned: an unpinned torch pulls a
multi-GB CUDA build) and the project in a virtualenv. GPU machines are
prepared images without network, so `gpu_tests` and `bench` run in the
current interpreter (``venv_backend="none"``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

CPU_TORCH = "torch==2.13.0"
OUT = Path("out")


def _install_project(session: nox.Session, extras: str = "test") -> None:
    session.install(CPU_TORCH)
    session.install("-e", f".[{extras}]")


def _run_suites_with_report(
    session: nox.Session, name: str, pytest_args: list[str], env: dict[str, str] | None = None
) -> None:
    """Run pytest writing a run record and JUnit XML, then the HTML report;
    the report is written even when tests fail, and the session still fails."""
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    record = out / "run-record.json"
    try:
        session.run(
            "python",
            "-m",
            "pytest",
            *pytest_args,
            f"--run-record={record}",
            f"--junitxml={out / 'junit.xml'}",
            *session.posargs,
            env=env,
        )
    finally:
        if record.exists():
            history = out / "history"
            history.mkdir(exist_ok=True)
            args = ["--history", str(history)] if any(history.glob("*.json")) else []
            session.run(
                "python",
                "-m",
                "reports",
                "build",
                "--run",
                str(record),
                *args,
                "-o",
                str(out / "report.html"),
            )
            session.run(
                "python",
                "-m",
                "reports",
                "archive",
                "--run",
                str(record),
                "--history",
                str(history),
            )
            session.log(f"report: {(out / 'report.html').resolve()}")


@nox.session(venv_backend="none", default=False)
def dev(session: nox.Session) -> None:
    """A .venv for everyday commands: the project with its test extras and the CPU torch.

    Then `source .venv/bin/activate` and run pytest or `python -m reference_engine`
    directly (the nox virtualenvs are rebuilt per session and not meant for that)."""
    session.run(sys.executable, "-m", "venv", ".venv", external=True)
    python = str(Path(".venv") / "bin" / "python")
    session.run(python, "-m", "pip", "install", "-q", CPU_TORCH, external=True)
    session.run(python, "-m", "pip", "install", "-q", "-e", ".[test]", external=True)
    session.log("ready: source .venv/bin/activate")


@nox.session
def tests(session: nox.Session) -> None:
    """The project's whole test suite on the CPU (suites and harness tests)."""
    _install_project(session)
    session.run(
        "python",
        "-m",
        "pytest",
        "-n",
        "2",
        "-m",
        "not slow",
        *session.posargs,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )


@nox.session
def conformance(session: nox.Session) -> None:
    """The main job: the conformance suites on the default device, then the HTML report."""
    _install_project(session)
    _run_suites_with_report(session, "conformance", ["suites", "-n", "2", "-m", "not slow"])


@nox.session(venv_backend="none", default=False)
def gpu_tests(session: nox.Session) -> None:
    """Every suite on CUDA in the current (prepared, offline) interpreter, with the report.

    bf16 and FlashInfer included; the run record and the HTML report go to out/gpu."""
    session.run(
        "python",
        "-c",
        "import torch; assert torch.cuda.is_available(), 'gpu_tests needs a CUDA device'",
    )
    # The raw FlashInfer probe launches with a wrong head count on purpose and may fault the
    # device: it runs in its own process (see suites/kernels/test_merged_group_hazard.py).
    # One torch CPU thread per xdist worker: a worker per core, each with a pool as wide as the
    # machine, would oversubscribe the cores that model set-up and Triton compiles need.
    _run_suites_with_report(
        session,
        "gpu",
        ["suites", "tests", "-k", "not unguarded_probe"],
        env={"OMP_NUM_THREADS": "1"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, ruff format --check and the import contracts (lint-imports) over the repository."""
    session.install("ruff", "import-linter")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")


@nox.session(default=False)
def ci(session: nox.Session) -> None:
    """CI harness gate on this repository: YAML lint, dependency gaps, the selection.

    Strict YAML lint, the dependency-gap check, and the selection for a base ref
    (`nox -s ci -- BASE`, default origin/main)."""
    session.install("pyyaml", "jsonschema", "buildkite-sdk", "pytest>=8.4")
    base = session.posargs[0] if session.posargs else "origin/main"
    session.run("python", "-m", "ci", "lint", "--strict")
    session.run("python", "-m", "ci", "check-deps")
    session.run("python", "-m", "ci", "select", "--base", base, "--explain")


@nox.session(default=False)
def bugzoo(session: nox.Session) -> None:
    """The bug zoo: every cited bug (bugzoo/entries.yaml) planted in a scratch copy, each caught.

    Fails unless the unpatched tree passes the tests an entry names and every patch makes
    one of them fail."""
    _install_project(session)
    session.run(
        "python",
        "-m",
        "bugzoo",
        "--table",
        "--json",
        str(OUT / "bugzoo" / "results.json"),
        *session.posargs,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )


@nox.session(venv_backend="none", default=False)
def bench(session: nox.Session) -> None:
    """Kernel benchmarks on the GPU: metric list and run record under out/bench."""
    OUT.joinpath("bench").mkdir(parents=True, exist_ok=True)
    session.run(
        "python",
        "-m",
        "benchmarks.bench_attention",
        "--json",
        str(OUT / "bench" / "attention.json"),
        "--record",
        str(OUT / "bench" / "record.json"),
        *session.posargs,
    )


# nox loads this file without its folder on sys.path; the vLLM sessions live beside it.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from noxfile_vllm import vllm_conformance  # noqa: E402,F401  (the session registers on import)
