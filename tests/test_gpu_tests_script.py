"""scripts/gpu_tests.sh sourced for its install only (``GPU_TESTS_INSTALL_ONLY=1``), as a GPU
call does before a benchmark: the caller gets PYTHONPATH and keeps its own shell options.

The script's installs run through a stand-in ``python3`` on PATH (this machine has no GPU
image to install into); what is checked is the shell state the script leaves behind."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_tests.sh"
RECORDING_PIP = '#!/bin/sh\necho "python3 $*" >>"$CALLS"\n'
FAILING_PIP = "#!/bin/sh\nexit 3\n"
WHEELS = ("dep-1.0-py3-none-any.whl", "tools/tool-1.0-py3-none-any.whl")


def _wheel_contents_archive(path: Path) -> None:
    """A .tar.xz of one wheel's contents, as ``fetch_gpu_wheels.sh`` packs it: here a package
    named after the file."""
    package = path.name.split("-")[0]
    source = f"NAME = {package!r}\n".encode()
    member = tarfile.TarInfo(f"./{package}/__init__.py")
    member.size = len(source)
    with tarfile.open(path, "w:xz") as archive:
        archive.addfile(member, io.BytesIO(source))


def _source_for_install(
    tmp_path: Path, caller: str, python3: str, fetched: tuple[str, ...] = WHEELS
) -> subprocess.CompletedProcess:
    """Source the script in bash, then run ``caller``, with ``python3`` standing in for pip;
    ``fetched`` names the wheels (``.whl``) and wheel archives (``.tar.xz``) under WHEELS."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(python3)
    (bin_dir / "python3").chmod(0o755)
    wheels = tmp_path / "wheels"
    for name in fetched:
        path = wheels / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".tar.xz"):
            _wheel_contents_archive(path)
        else:
            path.write_bytes(b"")
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
    done = _source_for_install(tmp_path, "echo installed", RECORDING_PIP, fetched=WHEELS[:1])
    assert done.returncode == 0, done.stderr
    assert "installed" in done.stdout
    calls = (tmp_path / "calls.txt").read_text()
    assert "dep-1.0-py3-none-any.whl" in calls
    assert str(tmp_path / "wheels" / "tools") not in calls


def test_wheel_archives_are_unpacked_into_the_site_folder(tmp_path: Path) -> None:
    """Wheels fetched as archives of their contents, beside the tools' too, land in the site
    folder where pip would put them; with no plain wheel, pip installs the project only."""
    fetched = ("dep-1.0-py3-none-any.tar.xz", "tools/tool-1.0-py3-none-any.tar.xz")
    done = _source_for_install(tmp_path, "echo installed", RECORDING_PIP, fetched=fetched)
    assert done.returncode == 0, done.stderr
    for package in ("dep", "tool"):
        assert (tmp_path / "site" / package / "__init__.py").read_text() == f"NAME = {package!r}\n"
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 1 and calls[0].endswith(f"--target {tmp_path / 'site'} ."), calls
