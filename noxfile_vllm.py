"""nox session ``vllm_conformance``: the grouping suite against vLLM's own code, release by release.

Imported by ``noxfile.py`` (the decorator registers the session). Each release is judged in
its own venv, built once and cached (``attngroup.suites.engines.vllm_releases``): the CPU
torch, vLLM's sdist built without kernels, and what vLLM's own metadata requires. The
cache lives in ``--cache DIR``, else ``$AGC_VLLM_CACHE``, else ``~/.cache/attngroup/vllm``.
The session writes ``out/vllm/verdicts-<release>.json``, ``timeline.md`` and
``timeline.html`` (pairs x releases, the release where a verdict changes marked); with
``--suite`` also each release's grouping-suite run record.

    nox -s vllm_conformance -- --versions 0.22.1..0.34.0          # every minor release
    nox -s vllm_conformance -- --versions 0.29.0 --runner v2       # one release, the V2 runner
    nox -s vllm_conformance -- --versions 0.34.0 --suite           # plus the suite's run record

Exits non-zero (3) when any cell is an adapter error: a harness failure is never a verdict.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import nox

from attngroup.suites.engines.vllm_releases import parse_versions, release_venv

LOCK = "requirements/lock.txt"  # the CPU torch that every release venv gets, and the project's deps
OUT = Path("out") / "vllm"


def _options(posargs: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nox -s vllm_conformance --")
    parser.add_argument("--versions", default="0.22.1..0.34.0", help="releases and ranges")
    parser.add_argument("--runner", choices=("auto", "v1", "v2"), default="auto")
    parser.add_argument("--cache", default=None, help="release venv cache folder")
    parser.add_argument("--suite", action="store_true", help="also run the grouping suite")
    return parser.parse_args(posargs)


@nox.session(default=False)
def vllm_conformance(session: nox.Session) -> None:
    """The verdict timeline over ``--versions`` (default every minor release 0.22.1..0.34.0)."""
    options = _options(session.posargs)
    session.install("-c", LOCK, "-e", ".[test]", "torch")
    env = {"CUDA_VISIBLE_DEVICES": "", "VLLM_LOGGING_LEVEL": "WARNING"}
    if options.cache:
        env["AGC_VLLM_CACHE"] = str(Path(options.cache).resolve())
    timeline = ["python", "-m", "attngroup.suites.grouping.vllm_timeline"]
    if options.suite:
        _run_suites(session, options, env)
    session.run(
        *timeline,
        "run",
        "--versions",
        options.versions,
        "--runner",
        options.runner,
        "--out",
        str(OUT),
        env=env,
    )


def _run_suites(session: nox.Session, options: argparse.Namespace, env: dict[str, str]) -> None:
    """The grouping suite per release, in the release's venv, with its run record (failures
    are findings: recorded, not fatal; adapter errors show as their own outcome)."""
    builder = ["python", "-m", "attngroup.suites.engines.vllm_releases"]
    session.run(*builder, options.versions, env=env)  # builds what the cache lacks
    cache = Path(env["AGC_VLLM_CACHE"]) if "AGC_VLLM_CACHE" in env else None
    for version in parse_versions(options.versions):
        session.run(
            str(release_venv(version, cache).python),
            "-m",
            "pytest",
            "attngroup/suites/grouping",
            "--engine",
            "vllm",
            "-n",
            "2",
            "-p",
            "xdist.plugin",
            "-p",
            "attngroup.reports.pytest_plugin",
            "-p",
            "no:cacheprovider",
            f"--run-record={OUT / f'run-record-{version}.json'}",
            external=True,
            # Plugins named, not discovered: the checkout's own metadata (an editable
            # install's egg-info) would register the run-record plugin a second time.
            env={
                **env,
                "PYTHONPATH": os.getcwd(),
                "AGC_VLLM_RUNNER": options.runner,
                "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            },
            success_codes=[0, 1],
        )
