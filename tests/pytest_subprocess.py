"""The command line and import path of a child process, as the harness's own tests start one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

PYTEST = (sys.executable, "-m", "pytest", "-p", "no:cacheprovider")
"""This interpreter's pytest, without a cache folder left in the tree it runs in."""


def python_path(*first: Path | str) -> str:
    """``first``, then the caller's PYTHONPATH: on the GPU machine the wheels and this project's
    pytest plugin are installed into a folder there, and a child without it cannot import them."""
    return os.pathsep.join(filter(None, [*map(str, first), os.environ.get("PYTHONPATH")]))
