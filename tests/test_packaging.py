"""No import name of this project can be owned by another distribution.

transformers 5.25 depends on Hugging Face's ``kernels`` distribution; a top-level ``kernels/``
of ours, found first from the repository root (sys.path[0] under ``python -m``, pytest and
nox), made every transformers config import fail there. These guards fail on such a name."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import setuptools

from tests.pytest_subprocess import python_path

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
GEMMA4_CONFIG = REPO / "attngroup" / "reference_engine" / "configs" / "gemma-4-E2B-it"


def _normalized(distribution: str) -> str:
    return distribution.lower().replace("_", "-").replace(".", "-")


def installed_top_level_names() -> set[str]:
    """The top-level import names the project's build installs (its package-find rule)."""
    find = PROJECT["tool"]["setuptools"]["packages"]["find"]
    packages = setuptools.find_packages(where=str(REPO), include=find["include"])
    return {package.split(".")[0] for package in packages}


def importable_names_at_the_root() -> set[str]:
    """What ``import NAME`` finds in the repository root when it is sys.path[0]: packages
    (folders with ``__init__.py``) and modules, whether or not the build installs them."""
    packages = {path.parent.name for path in REPO.glob("*/__init__.py")}
    modules = {path.stem for path in REPO.glob("*.py")}
    return packages | modules


def other_owners(name: str) -> list[str]:
    """Distributions other than this project that install ``name`` in this environment."""
    ours = _normalized(PROJECT["project"]["name"])
    owners = importlib.metadata.packages_distributions().get(name, [])
    return sorted({owner for owner in owners if _normalized(owner) != ours})


def test_the_project_installs_one_package_of_its_own():
    assert installed_top_level_names() == {"attngroup"}


@pytest.mark.parametrize(
    "name", sorted(installed_top_level_names() | importable_names_at_the_root())
)
def test_no_other_distribution_owns_our_import_name(name: str):
    owners = other_owners(name)
    assert not owners, (
        f"`import {name}` from the repository root finds ours, but {owners} install it too: "
        "rename ours or move it under attngroup/"
    )


def test_the_owner_check_reads_this_environment():
    """The check above reads the environment truly: transformers' own name has its owner."""
    assert other_owners("transformers") == ["transformers"]


def test_transformers_and_a_gemma4_config_import_from_the_repository_root():
    """With Hugging Face's ``kernels`` installed (transformers 5.25 depends on it), a fresh
    interpreter in the repository root imports transformers, reads a shipped Gemma 4 config
    and builds its model class: transformers' hub-kernels integration gets HF's package."""
    try:
        hf_kernels = importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's `kernels` is not installed here (older transformers images)")
    code = (
        "import kernels, transformers; "
        "from transformers import AutoConfig, Gemma4ForCausalLM; "
        f"config = AutoConfig.from_pretrained({str(GEMMA4_CONFIG)!r}); "
        "print(kernels.__file__); print(type(config).__name__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"HF kernels {hf_kernels}:\n{result.stderr[-3000:]}"
    kernels_file, config_class = result.stdout.split()
    assert Path(kernels_file).resolve().parent.parent != REPO, f"ours: {kernels_file}"
    assert config_class.startswith("Gemma4")


# A vLLM checkout's root holds packages with generic names (benchmarks/, tests/, docs/);
# users run our commands there, where sys.path[0] finds those first.
FOREIGN_ROOT_PACKAGES = ("benchmarks", "tests", "kernels", "ci", "reports", "suites", "bugzoo")
ENTRY_POINTS = (
    ("attngroup.ci", "--help"),
    ("attngroup.reports", "--help"),
    ("attngroup.bugzoo", "--help"),
    ("attngroup.benchmarks.bench_attention", "--help"),
    ("attngroup.reference_engine", "pairs"),
)


@pytest.mark.parametrize("argv", ENTRY_POINTS, ids=lambda argv: argv[0])
def test_commands_run_from_a_root_whose_generic_names_are_another_projects(tmp_path, argv):
    for name in FOREIGN_ROOT_PACKAGES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('the foreign root')\n")
    result = subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": python_path(REPO),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "the foreign root" not in result.stderr
