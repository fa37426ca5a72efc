"""The command line of a pytest run in a child process, as the harness's own tests start one."""

from __future__ import annotations

import sys

PYTEST = (sys.executable, "-m", "pytest", "-p", "no:cacheprovider")
"""This interpreter's pytest, without a cache folder left in the tree it runs in."""
