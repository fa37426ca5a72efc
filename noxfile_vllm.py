"""nox session ``vllm_conformance``: the grouping suite against vLLM's own code, release by
release, and against vLLM source trees (your checkout of main or of a branch).

Imported by ``noxfile.py`` (the decorator registers the session). Each release is judged in
its own venv, built once and cached (``attngroup.suites.engines.vllm_releases``): the CPU
torch, vLLM's sdist built without kernels, and what vLLM's own metadata requires. Each
``--source`` tree gets its own venv with vLLM installed editable
(``attngroup.suites.engines.vllm_checkout``), so an edit is judged without a rebuild. The
cache lives in ``--cache DIR``, else ``$AGC_VLLM_CACHE``, else ``~/.cache/attngroup/vllm``.
The session writes ``out/vllm/verdicts-*.json``, ``timeline.md`` and ``timeline.html``
(pairs x trees, a changed verdict marked); with ``--suite`` also each tree's grouping-suite
run record.

    nox -s vllm_conformance -- --versions 0.22.1..0.34.0          # every minor release
    nox -s vllm_conformance -- --versions 0.29.0 --runner v2       # one release, the V2 runner
    nox -s vllm_conformance -- --source ~/src/vllm                 # your tree beside 0.34.0
    nox -s vllm_conformance -- --versions none --source ~/src/vllm@origin/main --source ~/src/vllm
    nox -s vllm_conformance -- --versions 0.34.0 --suite           # plus the suite's run record

Exits 1 when a ``--source`` tree fails a pair, 3 when any cell is an adapter error (a
harness failure is never a verdict)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import nox

from attngroup.suites.engines.vllm_checkout import SourceSpec, checkout_venv, tree_path
from attngroup.suites.engines.vllm_releases import default_versions, parse_versions, release_venv

LOCK = "requirements/lock.txt"  # the CPU torch that every release venv gets, and the project's deps
OUT = Path("out") / "vllm"


def _options(posargs: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nox -s vllm_conformance --")
    parser.add_argument(
        "--versions", default=None, help="releases and ranges, or none (default: see the timeline)"
    )
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        help="a vLLM source tree (git checkout) to judge, or DIR@REF for one commit of it; repeatable",
    )
    parser.add_argument("--runner", choices=("auto", "v1", "v2"), default="auto")
    parser.add_argument("--cache", default=None, help="the venv cache folder")
    parser.add_argument("--suite", action="store_true", help="also run the grouping suite")
    return parser.parse_args(posargs)


@nox.session(default=False)
def vllm_conformance(session: nox.Session) -> None:
    """The verdict timeline over ``--versions`` releases and ``--source`` checkouts."""
    options = _options(session.posargs)
    session.install("-c", LOCK, "-e", ".[test]", "torch")
    env = {"CUDA_VISIBLE_DEVICES": "", "VLLM_LOGGING_LEVEL": "WARNING"}
    invoked_from = Path(session.invoked_from)
    if options.cache:
        env["AGC_VLLM_CACHE"] = str((invoked_from / Path(options.cache).expanduser()).resolve())
    versions = options.versions or default_versions(bool(options.source))
    sources = [SourceSpec.parse(text, invoked_from).text for text in options.source]
    if options.suite:
        _run_suites(session, versions, sources, options.runner, env)
    timeline = ["python", "-m", "attngroup.suites.grouping.vllm_timeline", "run"]
    trees = ["--versions", versions, *(f"--source={source}" for source in sources)]
    session.run(*timeline, *trees, "--runner", options.runner, "--out", str(OUT), env=env)


def _run_suites(
    session: nox.Session, versions: str, sources: list[str], runner: str, env: dict[str, str]
) -> None:
    """The grouping suite in each release's and checkout's venv, with its run record
    (failures are findings: recorded, not fatal; adapter errors show as their own outcome)."""
    session.run("python", "-m", "attngroup.suites.engines.vllm_releases", versions, env=env)
    cache = Path(env["AGC_VLLM_CACHE"]) if "AGC_VLLM_CACHE" in env else None
    venvs = {version: release_venv(version, cache).python for version in parse_versions(versions)}
    for source in sources:  # builds (or finds) the venv, then names it
        session.run("python", "-m", "attngroup.suites.engines.vllm_checkout", source, env=env)
        built = checkout_venv(tree_path(SourceSpec.parse(source), cache), cache)
        venvs[built.root.name] = built.python
    for name, python in venvs.items():
        session.run(
            str(python),
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
            f"--run-record={OUT / f'run-record-{name}.json'}",
            external=True,
            # Plugins named, not discovered: the checkout's own metadata (an editable
            # install's egg-info) would register the run-record plugin a second time.
            env={
                **env,
                "PYTHONPATH": os.getcwd(),
                "AGC_VLLM_RUNNER": runner,
                "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            },
            success_codes=[0, 1],
        )
