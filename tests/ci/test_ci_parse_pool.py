"""The parse pool's workers do not inherit the calling process (its CUDA state above all)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from attngroup.ci.deps.parse_cache import PARALLEL_THRESHOLD
from tests.pytest_subprocess import python_path

REPO_ROOT = Path(__file__).resolve().parents[2]

# A caller whose forked children die at once, as a child that inherits a CUDA context dies
# when it frees an inherited tensor (seen in a GPU test worker that ran check-deps).
CALLER = textwrap.dedent(
    f"""
    import os
    from attngroup.ci.deps import parse_cache

    def main():
        os.register_at_fork(after_in_child=lambda: os._exit(70))
        os.cpu_count = lambda: 2  # the pool path even on a one-core machine
        items = [str(index) for index in range({PARALLEL_THRESHOLD})]
        lengths = parse_cache.cached_map(None, {{item: item for item in items}}, len, bool)
        assert lengths == {{item: len(item) for item in items}}, lengths
        print("parsed", len(lengths))

    if __name__ == "__main__":
        main()
    """
)


def test_pool_workers_are_not_forks_of_the_caller(tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": python_path(REPO_ROOT)},
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"parsed {PARALLEL_THRESHOLD}"
