"""The project's one atomic writer: the mode rule of ``open()``, all or nothing, no temporary left,
and no other write-to-temp-then-rename anywhere in the package."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from attngroup import atomic_write

ROOT = Path(__file__).resolve().parents[1]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o022, 0o077, 0o002], ids=["umask-022", "umask-077", "umask-002"])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


WRITERS = {
    "text": lambda path: atomic_write.write_text(path, "new ünï\n"),
    "bytes": lambda path: atomic_write.write_bytes(path, "new ünï\n".encode()),
    "with": lambda path: atomic_write.write_with(
        path, lambda temporary: temporary.write_bytes("new ünï\n".encode())
    ),
}


@pytest.mark.parametrize("writer", WRITERS.values(), ids=WRITERS.keys())
def test_new_file_gets_the_mode_open_gives(tmp_path, umask, writer):
    target = tmp_path / "out.json"
    writer(target)
    assert target.read_text(encoding="utf-8") == "new ünï\n"
    assert _mode(target) == 0o666 & ~umask
    assert [path.name for path in tmp_path.iterdir()] == ["out.json"]


@pytest.mark.parametrize("writer", WRITERS.values(), ids=WRITERS.keys())
@pytest.mark.parametrize("kept", [0o600, 0o664, 0o640], ids=oct)
def test_replaced_file_keeps_its_own_mode(tmp_path, umask, writer, kept):
    target = tmp_path / "area.yaml"
    target.write_text("old\n")
    target.chmod(kept)
    writer(target)
    assert target.read_text(encoding="utf-8") == "new ünï\n"
    assert _mode(target) == kept


def test_a_writer_that_recreates_the_temporary_still_gets_the_rule(tmp_path, umask):
    """``torch.save`` and safetensors may unlink and recreate the path they are given."""
    target = tmp_path / "weights.bin"

    def recreate(temporary: Path) -> None:
        temporary.unlink()
        temporary.write_bytes(b"\x00\x01")
        temporary.chmod(0o600)

    atomic_write.write_with(target, recreate)
    assert target.read_bytes() == b"\x00\x01" and _mode(target) == 0o666 & ~umask


class WriterFailed(RuntimeError):
    pass


def test_a_raising_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "record.json"
    target.write_text("good\n")

    def half_then_raise(temporary: Path) -> None:
        temporary.write_text("ha")
        raise WriterFailed("disk went away")

    with pytest.raises(WriterFailed):
        atomic_write.write_with(target, half_then_raise)
    assert target.read_text() == "good\n"
    assert [path.name for path in tmp_path.iterdir()] == ["record.json"]


def test_a_raising_writer_leaves_no_file_where_there_was_none(tmp_path):
    def raise_at_once(temporary: Path) -> None:
        raise WriterFailed("nothing written")

    with pytest.raises(WriterFailed):
        atomic_write.write_with(tmp_path / "new.json", raise_at_once)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_rename_removes_the_temporary(tmp_path, monkeypatch):
    target = tmp_path / "report.html"
    target.write_text("good report")

    def fail_replace(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OSError, match="No space left on device"):
        atomic_write.write_text(target, "half")
    assert target.read_text() == "good report"
    assert [path.name for path in tmp_path.iterdir()] == ["report.html"]


def test_unencodable_text_touches_nothing(tmp_path):
    target = tmp_path / "area.yaml"
    target.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        atomic_write.write_text(target, "\udcff unencodable")
    assert target.read_text() == "old\n"
    assert [path.name for path in tmp_path.iterdir()] == ["area.yaml"]


def test_a_missing_folder_is_a_plain_error_and_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic_write.write_text(tmp_path / "absent" / "out.json", "{}")
    assert list(tmp_path.iterdir()) == []


RENAMES = re.compile(r"os\.replace\(|os\.rename\(|\.rename\(|mkstemp\(|NamedTemporaryFile\(")


def test_no_other_module_renames_a_temporary_into_place():
    """One home for write-to-temp-then-rename: every other module calls ``attngroup.atomic_write``."""
    home = ROOT / "attngroup" / "atomic_write.py"
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "attngroup").rglob("*.py"))
        if path != home
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if RENAMES.search(line)
    ]
    assert offenders == []
    assert RENAMES.search(home.read_text(encoding="utf-8")), "the pattern no longer finds the home"
