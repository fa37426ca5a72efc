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
    linter_home = Path(importlib.util.find_spec("importlinter").origin).parents[1]
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
            "import attngroup.reference_engine.model_runner",
            "No import cycles",
            id="cycle-inside-engine",
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
