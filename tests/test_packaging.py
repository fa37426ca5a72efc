"""This project's top-level package `kernels` shares its import name with
Hugging Face's `kernels` distribution, which transformers probes at import
time. transformers must never take ours for theirs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kernels

REPO = Path(__file__).resolve().parents[1]


def test_transformers_does_not_think_hf_kernels_is_installed():
    # A fresh interpreter started in the repository root, where `import kernels` finds ours.
    code = (
        "import kernels, transformers.utils.import_utils as u; "
        "print(kernels.__file__); print(u.is_kernels_available())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    our_file, available = result.stdout.split()
    assert Path(our_file).resolve() == (REPO / "kernels" / "__init__.py").resolve()
    assert available == "False"


def test_our_kernels_package_is_importable_as_ours():
    assert Path(kernels.__file__).resolve().parent == REPO / "kernels"
