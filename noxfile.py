"""nox sessions: `nox -l` lists them.

CPU sessions install the project in a virtualenv at the versions of the lock,
requirements/lock.txt (`nox -s lock` refreshes it; torch is the CPU build pinned in
requirements/lock.in: an unpinned torch pulls a multi-GB CUDA build). `tests_latest`
alone takes the newest releases, as an upstream canary. GPU machines are prepared
images without network, so `gpu_tests` and `bench` run in the current interpreter
(``venv_backend="none"``).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

OUT = Path("out")
LOCK = "requirements/lock.txt"
LOCK_INPUT = Path("requirements/lock.in")
EXTRAS = tomllib.loads(Path("pyproject.toml").read_text())["project"]["optional-dependencies"]


def _pinned(name: str) -> str:
    """A hand-written pin of requirements/lock.in, e.g. ``torch==2.13.0``."""
    match = re.search(rf"^{re.escape(name)}==\S+", LOCK_INPUT.read_text(), flags=re.M)
    if match is None:
        raise RuntimeError(f"{LOCK_INPUT} pins no {name}")
    return match.group(0)


def _install_project(session: nox.Session, extras: str = "test") -> None:
    """The project, its extras and the CPU torch, at the versions of the lock."""
    session.install("-c", LOCK, "torch", "-e", f".[{extras}]")


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
                "attngroup.reports",
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
                "attngroup.reports",
                "archive",
                "--run",
                str(record),
                "--history",
                str(history),
            )
            session.log(f"report: {(out / 'report.html').resolve()}")


@nox.session(venv_backend="none", default=False)
def dev(session: nox.Session) -> None:
    """A .venv for everyday commands: the project with its test and lint extras and the CPU torch (locked).

    Then `source .venv/bin/activate` and run pytest or `python -m attngroup.reference_engine`
    directly (the nox virtualenvs are rebuilt per session and not meant for that)."""
    session.run(sys.executable, "-m", "venv", ".venv", external=True)
    python = str(Path(".venv") / "bin" / "python")
    session.run(
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "-c",
        LOCK,
        "torch",
        "-e",
        ".[test,lint]",
        external=True,
    )
    session.log("ready: source .venv/bin/activate")


def _run_quick_suite(session: nox.Session) -> None:
    """The CPU suite without the slow cases, two workers, no GPU visible."""
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
def tests(session: nox.Session) -> None:
    """The project's whole test suite on the CPU (suites and harness tests)."""
    _install_project(session)
    _run_quick_suite(session)


@nox.session(default=False)
def tests_latest(session: nox.Session) -> None:
    """Upstream canary: the quick suite on the newest release of every dependency (no lock).

    torch stays the CPU pin of requirements/lock.in; the versions it ran with are printed
    first, so an upstream break is one named failing job, never every submission failing."""
    session.install("--upgrade", "--upgrade-strategy", "eager", _pinned("torch"), "-e", ".[test]")
    session.run("python", "-m", "pip", "freeze", "--exclude-editable")
    _run_quick_suite(session)


@nox.session(default=False)
def lock(session: nox.Session) -> None:
    """Refresh requirements/lock.txt from pyproject.toml and requirements/lock.in (newest releases)."""
    session.install("uv")
    session.run(
        "uv",
        "pip",
        "compile",
        "pyproject.toml",
        str(LOCK_INPUT),
        "--all-extras",
        "--upgrade",
        "--python-version",
        "3.11",
        "--python-platform",
        "x86_64-manylinux_2_28",
        "-o",
        LOCK,
    )


@nox.session
def conformance(session: nox.Session) -> None:
    """The main job: the conformance suites on the default device, then the HTML report."""
    _install_project(session)
    _run_suites_with_report(
        session, "conformance", ["attngroup/suites", "-n", "2", "-m", "not slow"]
    )


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
    # device: it runs in its own process (see attngroup/suites/kernels/test_merged_group_hazard.py).
    # One torch CPU thread per xdist worker: a worker per core, each with a pool as wide as the
    # machine, would oversubscribe the cores that model set-up and Triton compiles need.
    _run_suites_with_report(
        session,
        "gpu",
        ["attngroup/suites", "tests", "-k", "not unguarded_probe"],
        env={"OMP_NUM_THREADS": "1"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, ruff format --check, the import contracts (lint-imports) and mypy held to its baseline.

    mypy sees the project's dependencies (torch's types), so the project is installed as for the
    tests; `python scripts/mypy_ratchet.py --update` shrinks scripts/mypy-baseline.json."""
    _install_project(session, extras="test,lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")
    session.run("python", "scripts/mypy_ratchet.py")


@nox.session(default=False)
def ci(session: nox.Session) -> None:
    """CI harness gate on this repository: YAML lint, dependency gaps, the selection.

    Strict YAML lint, the dependency-gap check, and the selection for a base ref
    (`nox -s ci -- BASE`, default origin/main)."""
    session.install("-c", LOCK, *EXTRAS["ci"])
    base = session.posargs[0] if session.posargs else "origin/main"
    session.run("python", "-m", "attngroup.ci", "lint", "--strict")
    session.run("python", "-m", "attngroup.ci", "check-deps")
    session.run("python", "-m", "attngroup.ci", "select", "--base", base, "--explain")


@nox.session(default=False)
def bugzoo(session: nox.Session) -> None:
    """The bug zoo: every cited bug (attngroup/bugzoo/entries.yaml) planted in a scratch copy, each caught.

    Fails unless the unpatched tree passes the tests an entry names and every patch makes
    one of them fail."""
    _install_project(session)
    session.run(
        "python",
        "-m",
        "attngroup.bugzoo",
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
        "attngroup.benchmarks.bench_attention",
        "--json",
        str(OUT / "bench" / "attention.json"),
        "--record",
        str(OUT / "bench" / "record.json"),
        *session.posargs,
    )


# nox loads this file without its folder on sys.path; the vLLM sessions live beside it.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from noxfile_vllm import vllm_conformance  # noqa: E402,F401  (the session registers on import)
