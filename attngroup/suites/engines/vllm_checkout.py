"""A vLLM source tree to judge (a git checkout of main or a pull-request branch), and its venv.

Releases answer "which vLLM broke it"; a checkout answers "does my change break it" before
the change ships. The tree is installed *editable* (``pip install -e`` with
``VLLM_TARGET_DEVICE=empty``: no kernels, no torch build) into one cached venv per tree, so
an edit to vLLM's Python is judged at once, without a rebuild. The venv is rebuilt only when
the tree's dependency files change (``pyproject.toml``, ``setup.py``,
``requirements/*.txt``: the fingerprint in its ``built.json``) or the CPU torch does.

``--source DIR@REF`` judges one commit of the repository instead (``~/vllm@origin/main``
beside ``~/vllm`` compares your change with main): REF is checked out in a git worktree kept in
the cache, with its own venv.

``python -m attngroup.suites.engines.vllm_checkout DIR[@REF]`` builds (or finds) the venv.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from attngroup.suites.engines.vllm_releases import (
    BUILT_FILE,
    VenvBuild,
    build_requirements,
    cache_root,
    cpu_torch_pin,
    project_requirements,
)

#: The files that decide what an editable install of the tree needs (``setup.py`` reads
#: ``requirements/common.txt`` for the ``empty`` target, which may include the others).
DEPENDENCY_FILES = ("pyproject.toml", "setup.py", "requirements/*.txt")


class CheckoutSpecError(ValueError):
    """A ``--source`` path that is not a vLLM source tree."""


@dataclass(frozen=True)
class CheckoutIdentity:
    """Which state of which tree a verdict is about (git's view; ``None`` outside git)."""

    path: str
    commit: str | None
    branch: str | None
    dirty: bool

    @property
    def label(self) -> str:
        """The timeline's column name: ``checkout <branch>@<commit>[+dirty]``."""
        if self.commit is None:
            return f"checkout {Path(self.path).name}"
        where = f"{self.branch}@{self.commit}" if self.branch else self.commit
        return f"checkout {where}" + ("+dirty" if self.dirty else "")

    def as_json(self) -> dict:
        return {**asdict(self), "label": self.label}


@dataclass(frozen=True)
class SourceSpec:
    """A ``--source`` value: a tree as it is now (``DIR``, uncommitted edits included), or one
    commit of its repository (``DIR@REF``: a branch, tag or commit, e.g. ``~/vllm@origin/main``)."""

    directory: Path
    ref: str | None = None

    @classmethod
    def parse(cls, text: str, base: Path | None = None) -> SourceSpec:
        """``DIR`` or ``DIR@REF``, ``DIR`` taken from ``base`` (default: the working folder)
        when relative; an ``@`` that is part of an existing path stays in the path."""
        base = base or Path.cwd()
        directory, at, ref = text.rpartition("@")
        if not at or not directory or not ref or (base / Path(text).expanduser()).exists():
            directory, ref = text, ""
        return cls(base / Path(directory).expanduser(), ref or None)

    @property
    def text(self) -> str:
        return f"{self.directory}@{self.ref}" if self.ref else str(self.directory)


def source_tree(path: str | Path) -> Path:
    """``path`` resolved, once it is known to hold vLLM's package and build files."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise CheckoutSpecError(f"--source {path}: not a directory")
    missing = [name for name in ("vllm/__init__.py", "setup.py", "pyproject.toml")
               if not (root / name).is_file()]  # fmt: skip
    if missing:
        raise CheckoutSpecError(
            f"--source {path}: not a vLLM source tree (no {', '.join(missing)})"
        )
    return root


def _git(root: Path, *args: str) -> str | None:
    result = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else None


def tree_path(spec: SourceSpec, cache: Path | None = None) -> Path:
    """Where ``spec``'s tree lies, without making it: ``DIR`` itself, or for ``DIR@REF`` its
    worktree in the cache (one per repository and ref, so its venv stays)."""
    repository = spec.directory.resolve()
    if spec.ref is None:
        return repository
    name = hashlib.sha256(f"{repository}@{spec.ref}".encode()).hexdigest()[:12]
    return (cache or cache_root()) / "trees" / name


def materialize(spec: SourceSpec, cache: Path | None = None) -> Path:
    """The tree ``spec`` names: ``DIR`` itself; for ``DIR@REF`` a git worktree of ``DIR``'s
    repository at REF's current commit, kept in the cache (moved there again on every call, so
    its venv and editable install stay; ``git worktree list`` in ``DIR`` shows it)."""
    if spec.ref is None:
        return source_tree(spec.directory)
    repository = spec.directory.resolve()
    commit = _git(repository, "rev-parse", "--verify", "--quiet", f"{spec.ref}^{{commit}}")
    if commit is None:
        raise CheckoutSpecError(
            f"--source {spec.text}: {repository} is not a git repository that knows {spec.ref!r}"
        )
    tree = tree_path(spec, cache)
    moved = (tree / ".git").is_file() and _git(
        tree, "checkout", "--quiet", "--detach", "--force", commit
    ) is not None
    if not moved:  # no worktree there yet, or one git no longer knows
        if tree.exists():
            shutil.rmtree(tree)
        _git(repository, "worktree", "prune")
        tree.parent.mkdir(parents=True, exist_ok=True)
        worktree = ("worktree", "add", "--quiet", "--detach", "--force", str(tree), commit)
        if _git(repository, *worktree) is None:
            raise RuntimeError(f"git -C {repository} {' '.join(worktree)} failed")
    return source_tree(tree)


def identify(root: Path, ref: str | None = None) -> CheckoutIdentity:
    """The tree's commit, its branch (or the ``ref`` it was checked out at) and whether
    tracked files differ from the commit."""
    commit = _git(root, "rev-parse", "--short=10", "HEAD")
    if commit is None:
        return CheckoutIdentity(str(root), None, None, False)
    branch = ref or _git(root, "symbolic-ref", "--quiet", "--short", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return CheckoutIdentity(str(root), commit, branch or None, bool(status))


def _build_requirements(source: Path) -> list[str]:
    try:
        return build_requirements(tomllib.loads((source / "pyproject.toml").read_text()))
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as error:
        raise CheckoutSpecError(
            f"--source {source}: pyproject.toml names no readable build requirements ({error!r})"
        ) from None


def dependency_fingerprint(root: Path) -> str:
    """A hash of the tree's dependency files: equal fingerprints, same installed packages."""
    digest = hashlib.sha256()
    for pattern in DEPENDENCY_FILES:
        for file in sorted(root.glob(pattern)):
            digest.update(file.relative_to(root).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class CheckoutVenv:
    """One source tree's cached venv (named by the tree's resolved path)."""

    source: Path
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def built_for(self) -> dict | None:
        """What the venv was built for, or None when it is not (fully) built."""
        try:
            built = json.loads((self.root / BUILT_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return built if self.python.exists() and isinstance(built, dict) else None

    def is_current(self, fingerprint: str, torch_pin: str) -> bool:
        built = self.built_for()
        return built is not None and (built.get("fingerprint"), built.get("torch")) == (
            fingerprint,
            torch_pin,
        )


def checkout_venv(source: Path, cache: Path | None = None) -> CheckoutVenv:
    name = hashlib.sha256(str(source).encode()).hexdigest()[:12]
    return CheckoutVenv(source, (cache or cache_root()) / f"checkout-{name}")


def build_checkout_venv(path: str | Path, cache: Path | None = None) -> CheckoutVenv:
    """The tree's venv with vLLM installed editable, built unless the cache has a current one."""
    source = source_tree(path)
    requirements = _build_requirements(source)  # the tree's own faults first, then this machine's
    target = checkout_venv(source, cache)
    fingerprint = dependency_fingerprint(source)
    torch_pin = cpu_torch_pin()
    if target.is_current(fingerprint, torch_pin):
        return target
    build = VenvBuild.start(target.root, torch_pin)
    build.install(*requirements)
    # Editable, without build isolation (which would bring the CUDA torch the tree pins);
    # the installer resolves the tree's Requires-Dist, the constraint keeps the CPU torch.
    build.install("--no-build-isolation", "-e", source, *project_requirements())
    build.finish(source=str(source), fingerprint=fingerprint)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attngroup.suites.engines.vllm_checkout",
        description="Build (or find) the venv of a vLLM source tree, vLLM installed editable.",
        epilog="exit status: 0 built or found; 2 bad input (not a vLLM source tree); "
        "a failed build raises, naming its log",
    )
    parser.add_argument("source", help="a vLLM source tree (git checkout), or DIR@REF")
    args = parser.parse_args(argv)
    started = time.monotonic()
    spec = SourceSpec.parse(args.source)
    try:
        built = build_checkout_venv(materialize(spec))
    except CheckoutSpecError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    label = identify(built.source, spec.ref).label
    print(f"{label}: {built.root} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
