"""nox session ``vllm_conformance``: the grouping suite against vLLM's own code.

Imported by ``noxfile.py`` (the decorator registers the session). One venv per
vLLM version; vLLM is installed without its dependency list (its pins want a
CUDA torch) plus the light packages its grouping modules import, over the
machine's CPU torch (``--system-site-packages``: torch is shared, vLLM is not).
Each version writes a run record and a verdict file under ``out/vllm/``; the
last one prints the version x pair verdict table over every verdict file there.

    nox -s vllm_conformance                          # all versions, then the table
    nox -s "vllm_conformance(vllm='0.24.0')"         # one version
"""

from __future__ import annotations

from pathlib import Path

import nox

VLLM_VERSIONS = ("0.22.1", "0.24.0", "0.34.0")
LOCK = "requirements/lock.txt"  # the CPU torch and the project's own dependencies
#: What vLLM's grouping modules and the V1 runner import on a CPU machine.
LIGHT_PACKAGES = (
    "psutil",
    "pyzmq",
    "aiohttp",
    "requests",
    "pillow",
    "pybase64",
    "cachetools",
    "cbor2",
    "msgspec",
    "cloudpickle",
    "uvloop",
    "py-cpuinfo",
    "prometheus_client",
    "llguidance",
    "xgrammar",
    "einops",
    "gguf",
    "openai",
    "openai-harmony",
)
OUT = Path("out") / "vllm"


@nox.session(default=False, venv_params=["--system-site-packages"])
@nox.parametrize("vllm", VLLM_VERSIONS)
def vllm_conformance(session: nox.Session, vllm: str) -> None:
    """The grouping suite with ``--engine vllm`` against one vLLM version.

    Writes its run record and verdicts, then the verdict table of every version run."""
    session.install("-c", LOCK, "torch")
    session.install("--no-deps", f"vllm=={vllm}")
    session.install(*LIGHT_PACKAGES)
    # The project with its test tools (pytest-xdist, hypothesis) in the venv itself: the
    # system site-packages give nothing to rely on (torch is pinned above, so no CUDA build).
    session.install("-c", LOCK, "-e", ".[test]", "torch")
    OUT.mkdir(parents=True, exist_ok=True)
    env = {"CUDA_VISIBLE_DEVICES": "", "VLLM_LOGGING_LEVEL": "WARNING"}
    session.run(
        "python",
        "-m",
        "attngroup.suites.grouping.vllm_verdicts",
        "run",
        str(OUT / f"verdicts-{vllm}.json"),
        env=env,
    )
    # The suite's verdict is data here: failures are findings, recorded and tabled.
    session.run(
        "python",
        "-m",
        "pytest",
        "attngroup/suites/grouping",
        "--engine",
        "vllm",
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
        f"--run-record={OUT / f'run-record-{vllm}.json'}",
        f"--junitxml={OUT / f'junit-{vllm}.xml'}",
        *session.posargs,
        env=env,
        success_codes=[0, 1],
    )
    verdict_files = sorted(str(path) for path in OUT.glob("verdicts-*.json"))
    session.run("python", "-m", "attngroup.suites.grouping.vllm_verdicts", "table", *verdict_files)
