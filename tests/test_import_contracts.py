"""The import direction of ARCHITECTURE.md, checked by import-linter's contracts in
pyproject.toml: the repository keeps them, and a planted upward import or cycle breaks them."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "attngroup"
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the contracts of ``root/pyproject.toml`` over the packages in ``root``.

    The packages are found in ``root`` first; import-linter where this interpreter finds it
    (a GPU image installs it in a folder of its own, beside a copy of the project)."""
    spec = importlib.util.find_spec("importlinter")
    if spec is None or spec.origin is None:  # a missing tool, not a broken contract
        pytest.fail(
            f"import-linter is not installed for {sys.executable}: the contracts cannot be "
            "checked (requirements/lock.txt pins it; scripts/gpu_tests.sh installs it from WHEELS/tools)"
        )
    linter_home = Path(spec.origin).parents[1]
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": os.pathsep.join((str(root), str(linter_home))), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_repository_keeps_its_import_contracts() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """The package and the contracts, copied so that a test can plant an import."""
    shutil.copytree(
        ROOT / PACKAGE,
        tmp_path / PACKAGE,
        ignore=shutil.ignore_patterns("__pycache__", "results", "*.json"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("importer", "planted", "broken_contract"),
    [
        pytest.param(
            "attngroup/kernels/metadata.py",
            "import attngroup.reference_engine.layers",
            "Engine layers",
            id="kernels-imports-engine",
        ),
        pytest.param(
            "attngroup/reference_engine/layers.py",
            "import attngroup.suites.engines.base",
            "Engine layers",
            id="engine-imports-suites",
        ),
        pytest.param(
            "attngroup/ci/selection/select_steps.py",
            "import attngroup.reports.record",
            "stand apart",
            id="ci-imports-reports",
        ),
        pytest.param(
            "attngroup/reports/record.py",
            "import attngroup.kernels.metadata",
            "never imports",
            id="reports-imports-kernels",
        ),
        pytest.param(
            "attngroup/atomic_write.py",
            "import attngroup.ci.errors",
            "atomic writer is a leaf",
            id="atomic-writer-imports-ci",
        ),
        pytest.param(
            "attngroup/ci/selection/select_steps.py",
            "import attngroup.ci.deps.checker",
            "CI layers",
            id="ci-selection-imports-deps",
        ),
        pytest.param(
            "attngroup/ci/areas/config.py",
            "import attngroup.ci.selection.changes",
            "CI layers",
            id="ci-areas-imports-selection",
        ),
        pytest.param(
            "attngroup/reference_engine/kv_cache_spec.py",
            "import attngroup.reference_engine.engine.model_runner",
            "No import cycles",
            id="cycle-inside-engine",
        ),
        pytest.param(
            "attngroup/reference_engine/kv_cache_groups.py",
            "import attngroup.reference_engine.pairs.pair_configs",
            "Reference engine:",
            id="grouping-api-imports-pairs",
        ),
        pytest.param(
            "attngroup/reference_engine/families/family.py",
            "import attngroup.reference_engine.model_pairs",
            "Reference engine:",
            id="family-registry-imports-the-pairs",
        ),
        pytest.param(
            "attngroup/reference_engine/engine/step.py",
            "import attngroup.reference_engine.engine.scheduler",
            "Engine loop:",
            id="step-types-import-scheduler",
        ),
        pytest.param(
            "attngroup/kernels/ops/triton_occupancy.py",
            "import attngroup.kernels.backends.common",
            "Kernels:",
            id="triton-ops-import-backends",
        ),
        pytest.param(
            "attngroup/reports/record.py",
            "import attngroup.reports.render.summary",
            "Reports:",
            id="run-records-import-rendering",
        ),
    ],
)
def test_planted_import_breaks_a_contract(
    tree_copy: Path, importer: str, planted: str, broken_contract: str
) -> None:
    module = tree_copy / importer
    module.write_text(module.read_text() + f"\n{planted}  # planted by the test\n")
    result = _lint_imports(tree_copy)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(broken_contract in line for line in broken), result.stdout


MAX_MODULES_PER_FOLDER = 15


def _package_folders() -> list[pytest.param]:
    folders = sorted(
        path.parent.relative_to(ROOT).as_posix()
        for path in (ROOT / PACKAGE).rglob("__init__.py")
        if "results" not in path.parts
    )
    return [pytest.param(folder, id=folder) for folder in folders]


@pytest.mark.parametrize("folder", _package_folders())
def test_no_package_folder_holds_more_than_15_modules(folder: str) -> None:
    """Folders show the architecture: a folder past 15 modules wants a subfolder (test files
    and conftest.py are the suites' cases, not modules of the architecture)."""
    modules = sorted(
        path.name
        for path in (ROOT / folder).glob("*.py")
        if not path.name.startswith("test_") and path.name != "conftest.py"
    )
    assert len(modules) <= MAX_MODULES_PER_FOLDER, modules


def test_engine_entry_points_load_from_the_package_without_torch_up_front() -> None:
    code = (
        "import sys, attngroup.reference_engine as engine\n"
        "assert 'torch' not in sys.modules, 'the package import loaded torch'\n"
        "from attngroup.reference_engine import EngineConfig, LLMEngine, SamplingParams\n"
        "assert LLMEngine.__module__ == 'attngroup.reference_engine.engine.llm_engine'\n"
        "try:\n"
        "    engine.NoSuchName\n"
        "except AttributeError as error:\n"
        "    assert 'NoSuchName' in str(error)\n"
        "else:\n"
        "    raise AssertionError('an unknown name resolved')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
