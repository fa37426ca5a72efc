"""vLLM releases to judge, and one cached venv per release that imports its grouping code on a CPU.

``--versions`` takes a list and ranges: ``0.22.1..0.34.0`` is the newest patch of every minor
release from 0.22 to 0.34 (patches within a minor do not change the grouping code; an exact
version such as ``0.25.0`` can always be listed). Each release gets its own venv under the
cache folder (``$AGC_VLLM_CACHE``, default ``~/.cache/attngroup/vllm``), built once:

1. the machine's CPU torch (the version of the interpreter that builds, pinned with its local
   label, so no resolver can swap in a CUDA build);
2. vLLM's sdist built as a pure-Python wheel (``VLLM_TARGET_DEVICE=empty``: no kernels, no torch
   build) with the build requirements its own ``pyproject.toml`` names;
3. that wheel with the dependencies its metadata (``Requires-Dist``) declares, plus the
   project's own runtime and test dependencies (from this repository's ``pyproject.toml``).

A venv counts as built only once its ``built.json`` is written; a half-built one is rebuilt.
``python -m attngroup.suites.engines.vllm_releases 0.22.1..0.34.0`` builds (or finds) them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import venv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: vLLM releases on PyPI from 0.22 on (``pip index versions vllm``); ranges pick from these.
RELEASES = (
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)
CACHE_ENV = "AGC_VLLM_CACHE"
SDIST_ENV = "AGC_VLLM_SDIST"  # where downloaded sdists are kept (default: <cache>/sdist)
TORCH_FAMILY = frozenset({"torch", "torchvision", "torchaudio"})
#: What ``pip download`` needs to prepare a vLLM sdist's metadata without build isolation
#: (the build isolation would install the CUDA torch its ``pyproject.toml`` pins).
METADATA_REQUIREMENTS = (
    "setuptools<81", "setuptools-scm", "setuptools-rust", "wheel", "packaging", "jinja2", "numpy",
)  # fmt: skip
BUILT_FILE = "built.json"
REPO_ROOT = Path(__file__).resolve().parents[3]
_VERSION = re.compile(r"\d+\.\d+\.\d+")


class ReleaseSpecError(ValueError):
    """A ``--versions`` value that names no release."""


Version = tuple[int, int, int]


def version_key(version: str) -> Version:
    major, minor, patch = (int(part) for part in version.split(".")[:3])
    return major, minor, patch


def _checked(text: str) -> str:
    if not _VERSION.fullmatch(text):
        raise ReleaseSpecError(f"{text!r} is not a release version such as 0.24.0")
    return text


def newest_patches(releases: Sequence[str]) -> list[str]:
    """The newest patch of each minor release, oldest minor first."""
    newest: dict[tuple[int, int], str] = {}
    for release in sorted(releases, key=version_key):
        newest[version_key(release)[:2]] = release
    return list(newest.values())


def parse_versions(spec: str, releases: Sequence[str] = RELEASES) -> list[str]:
    """``"0.22.1..0.34.0,0.25.0"`` -> the releases it names, oldest first, each once;
    ``"none"`` -> no release (to judge only ``--source`` trees)."""
    if spec.strip().lower() == "none":
        return []
    chosen: set[str] = set()
    for part in (item.strip() for item in spec.split(",")):
        if not part:
            raise ReleaseSpecError(f"--versions {spec!r}: an empty entry")
        low, dots, high = part.partition("..")
        if not dots:
            chosen.add(_checked(part))
            continue
        low_key, high_key = version_key(_checked(low)), version_key(_checked(high))
        if low_key > high_key:
            raise ReleaseSpecError(f"--versions {part!r}: the range runs backwards")
        inside = [r for r in releases if low_key <= version_key(r) <= high_key]
        if not inside:
            raise ReleaseSpecError(f"--versions {part!r}: no known release in that range")
        chosen.update(newest_patches(inside))
    return sorted(chosen, key=version_key)


def default_versions(with_sources: bool) -> str:
    """What ``--versions`` means when left out: every minor release; beside ``--source``
    trees only the newest release, the column a checkout's verdicts are compared with."""
    return RELEASES[-1] if with_sources else f"{newest_patches(RELEASES)[0]}..{RELEASES[-1]}"


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attngroup" / "vllm"


def sdist_folder() -> Path:
    configured = os.environ.get(SDIST_ENV)
    return Path(configured).expanduser() if configured else cache_root() / "sdist"


def cpu_torch_pin() -> str:
    """The running interpreter's torch, local label included (``torch==2.13.0+cpu``)."""
    import torch

    if torch.version.cuda is not None:
        raise RuntimeError(
            f"the interpreter building release venvs has a CUDA torch ({torch.__version__}); "
            "run it with the CPU build so that every release venv gets it"
        )
    return f"torch=={torch.__version__}"


@dataclass(frozen=True)
class ReleaseVenv:
    """One release's cached venv."""

    version: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def is_built(self) -> bool:
        return (self.root / BUILT_FILE).is_file() and self.python.exists()


def release_venv(version: str, cache: Path | None = None) -> ReleaseVenv:
    return ReleaseVenv(version, (cache or cache_root()) / f"vllm-{version}")


def run_logged(command: Sequence[str | Path], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(map(str, command))}\n")
        out.flush()
        result = subprocess.run(
            [str(part) for part in command], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"{command[0]} {command[1:4]} failed (exit {result.returncode}); see {log}"
        )


def _sdist(version: str, python: Path, env: dict[str, str], log: Path) -> Path:
    folder = sdist_folder()
    path = folder / f"vllm-{version}.tar.gz"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        run_logged(
            [
                python, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
                "--no-binary", "vllm", "--no-build-isolation", "-d", folder,
            ],
            log,
            env,
        )  # fmt: skip
    return path


def sdist_pyproject(sdist: Path) -> dict:
    """The ``pyproject.toml`` of a vLLM sdist, read without unpacking it."""
    with tarfile.open(sdist) as archive:
        member = next(
            m
            for m in archive.getmembers()
            if m.name.count("/") == 1 and m.name.endswith("/pyproject.toml")
        )
        return tomllib.load(archive.extractfile(member))  # type: ignore[arg-type]


def build_requirements(pyproject: dict) -> list[str]:
    """The ``[build-system] requires`` of vLLM's ``pyproject.toml``, torch left out (the CPU
    one is there)."""
    requires: list[str] = pyproject["build-system"]["requires"]
    return [req for req in requires if _name(req) not in TORCH_FAMILY]


def project_requirements(root: Path = REPO_ROOT) -> list[str]:
    """This project's runtime and test dependencies (it runs from its checkout, not installed)."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["test"]]


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement.strip())
    return match.group(0).lower().replace("_", "-") if match else ""


def installer(python: Path) -> list[str | Path]:
    """``uv pip install`` into ``python``'s venv where uv is at hand (several times faster
    than pip; it gets pip's ``PIP_FIND_LINKS``, where a local CPU torch may lie), else
    that venv's pip. The torch pin holds either way: a CUDA build cannot match it."""
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        return [python, "-m", "pip", "install"]
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    return [uv, "pip", "install", "--python", python, *(f"--find-links={link}" for link in links)]


def build_env() -> dict[str, str]:
    """The environment vLLM is built in: no kernels (``VLLM_TARGET_DEVICE=empty``)."""
    return {**os.environ, "VLLM_TARGET_DEVICE": "empty", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@dataclass(frozen=True)
class VenvBuild:
    """One venv being built for a vLLM tree: its log, the build environment (no kernels, and
    ``extra_env``) and an installer held to the CPU torch by a constraint file."""

    root: Path
    torch_pin: str
    started: float
    extra_env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def start(cls, root: Path, torch_pin: str, **extra_env: str) -> VenvBuild:
        """A fresh venv at ``root`` (a stale or half-built one removed) with the CPU torch and
        what vLLM's build needs without build isolation."""
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        build = cls(root, torch_pin, time.monotonic(), tuple(extra_env.items()))
        venv.create(root, with_pip=True)
        (root / "constraints.txt").write_text(torch_pin + "\n")
        build.install(torch_pin, *METADATA_REQUIREMENTS)
        return build

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def env(self) -> dict[str, str]:
        return {**build_env(), **dict(self.extra_env)}

    def run(self, *command: str | Path) -> None:
        run_logged(command, self.root / "build.log", self.env)

    def install(self, *requirements: str | Path) -> None:
        self.run(*installer(self.python), "-c", self.root / "constraints.txt", *requirements)

    def finish(self, **record: str) -> None:
        """Marks the venv built: ``built.json`` with ``record``, the torch and the seconds taken."""
        seconds = round(time.monotonic() - self.started)
        built = {**record, "torch": self.torch_pin, "seconds": seconds}
        (self.root / BUILT_FILE).write_text(json.dumps(built, indent=1) + "\n")


def build_release_venv(version: str, cache: Path | None = None) -> ReleaseVenv:
    """The release's venv, built unless the cache has it."""
    target = release_venv(version, cache)
    if target.is_built:
        return target
    build = VenvBuild.start(target.root, cpu_torch_pin(), VLLM_VERSION_OVERRIDE=version)
    sdist = _sdist(version, build.python, build.env, build.root / "build.log")
    build.install(*build_requirements(sdist_pyproject(sdist)))
    wheels = target.root / "wheel"
    build.run(
        build.python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, sdist
    )
    # pip resolves the wheel's own Requires-Dist; the constraint keeps the CPU torch.
    build.install(next(wheels.glob("vllm-*.whl")), *project_requirements())
    build.finish(vllm=version)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attngroup.suites.engines.vllm_releases",
        description="Build (or find) the cached venv of each vLLM release named.",
        epilog="exit status: 0 built or found; 2 bad input (a version that names no release); "
        "a failed build raises, naming its log",
    )
    parser.add_argument("versions", help="releases and ranges, e.g. 0.22.1..0.34.0,0.25.0")
    args = parser.parse_args(argv)
    try:
        versions = parse_versions(args.versions)
    except ReleaseSpecError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for version in versions:
        started = time.monotonic()
        built = build_release_venv(version)
        print(f"vllm {version}: {built.root} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
