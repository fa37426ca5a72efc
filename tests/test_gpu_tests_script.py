"""scripts/gpu_tests.sh sourced for its install only (``GPU_TESTS_INSTALL_ONLY=1``), as a GPU
call does before a benchmark: the caller gets PYTHONPATH and keeps its own shell options.

The script's installs run through a stand-in ``python3`` on PATH (this machine has no GPU
image to install into); what is checked is the shell state the script leaves behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_tests.sh"
RECORDING_PIP = '#!/bin/sh\necho "python3 $*" >>"$CALLS"\n'
FAILING_PIP = "#!/bin/sh\nexit 3\n"


def _source_for_install(
    tmp_path: Path, caller: str, python3: str, with_tools: bool = True
) -> subprocess.CompletedProcess:
    """Source the script in bash, then run ``caller``, with ``python3`` standing in for pip."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(python3)
    (bin_dir / "python3").chmod(0o755)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "dep-1.0-py3-none-any.whl").write_bytes(b"")
    if with_tools:
        (wheels / "tools").mkdir()
        (wheels / "tools" / "tool-1.0-py3-none-any.whl").write_bytes(b"")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CALLS": str(tmp_path / "calls.txt"),
        "WHEELS": str(wheels),
        "SITE": str(tmp_path / "site"),
        "GPU_TESTS_INSTALL_ONLY": "1",
    }
    return subprocess.run(
        ["bash", "-c", f". {SCRIPT}\n{caller}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_sourcing_it_leaves_the_callers_shell_options_and_sets_pythonpath(tmp_path: Path) -> None:
    """A failing command after the install does not end the caller (no ``set -e`` leaks),
    an unset variable is no error (no ``set -u``), and the site folder is on PYTHONPATH."""
    caller = 'false; echo "after a failure ${NOT_SET:-unset}"; echo "PYTHONPATH=$PYTHONPATH"'
    done = _source_for_install(tmp_path, caller, RECORDING_PIP)
    assert done.returncode == 0, done.stderr
    assert "after a failure unset" in done.stdout
    assert f"PYTHONPATH={tmp_path}:{tmp_path / 'site'}" in done.stdout
    calls = (tmp_path / "calls.txt").read_text()
    assert "dep-1.0-py3-none-any.whl" in calls and "tool-1.0-py3-none-any.whl" in calls


def test_a_failing_install_still_stops_the_caller(tmp_path: Path) -> None:
    """The script's own steps keep ``set -e``: a failed pip install ends the sourcing shell
    before the caller's next command."""
    done = _source_for_install(tmp_path, "echo next command", FAILING_PIP)
    assert done.returncode == 3
    assert "next command" not in done.stdout


def test_a_benchmark_call_may_leave_the_tools_out(tmp_path: Path) -> None:
    """Without WHEELS/tools the install takes the wheels that are there and nothing else."""
    done = _source_for_install(tmp_path, "echo installed", RECORDING_PIP, with_tools=False)
    assert done.returncode == 0, done.stderr
    assert "installed" in done.stdout
    calls = (tmp_path / "calls.txt").read_text()
    assert "dep-1.0-py3-none-any.whl" in calls
    assert str(tmp_path / "wheels" / "tools") not in calls
