"""What a run ran on: git revision, package versions, device, CI job.

Cheap and import-free: versions come from package metadata, never by importing torch;
the device name is read from torch only when the tests already imported it.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from attngroup.reports.record import Scalar

# record key -> distribution names to try, first installed wins
PACKAGES = {
    "torch": ("torch",),
    "triton": ("triton",),
    "transformers": ("transformers",),
    "flashinfer": ("flashinfer-python", "flashinfer"),
}
CI_VARIABLES = {  # record key -> environment variable (Buildkite)
    "ci_build_url": "BUILDKITE_BUILD_URL",
    "ci_build_number": "BUILDKITE_BUILD_NUMBER",
    "ci_job_id": "BUILDKITE_JOB_ID",
    "ci_pipeline": "BUILDKITE_PIPELINE_SLUG",
}
GIT_TIMEOUT_S = 5


def package_version(distributions: tuple[str, ...]) -> str | None:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _git(root: Path, *args: str) -> str | None:
    try:
        completed = subprocess.run(
            ["git", *args],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    output = completed.stdout.strip()
    return output if completed.returncode == 0 and output else None


def git_revision(root: Path) -> dict[str, Scalar]:
    """sha, branch and dirtiness; CI variables win (CI checks out a detached HEAD)."""
    sha = os.environ.get("BUILDKITE_COMMIT") or _git(root, "rev-parse", "HEAD")
    branch = os.environ.get("BUILDKITE_BRANCH") or _git(root, "rev-parse", "--abbrev-ref", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no") if sha else None
    return {
        "git_sha": sha,
        "git_branch": None if branch == "HEAD" else branch,
        "git_dirty": bool(status) if sha else None,
    }


def device_name() -> str:
    """The accelerator when torch (already imported by the tests) sees one, else the CPU."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                count = torch.cuda.device_count()
                return f"{torch.cuda.get_device_name(0)} x{count}"
        except Exception:  # a broken CUDA setup must not break the record
            pass
    return cpu_name()


def cpu_name() -> str:
    """The CPU as records name a device: ``CPU: <model>``."""
    return f"CPU: {_cpu_model()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect_environment(root: Path) -> dict[str, Scalar]:
    environment: dict[str, Scalar] = {
        **git_revision(root),
        **{key: package_version(names) for key, names in PACKAGES.items()},
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "device": device_name(),
        "cpu_count": os.cpu_count(),
    }
    environment.update(
        {key: os.environ[name] for key, name in CI_VARIABLES.items() if name in os.environ}
    )
    return environment
