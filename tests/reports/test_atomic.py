"""The one atomic writer of the reports side: all or nothing, plain errors, umask mode."""

from __future__ import annotations

import os

import pytest

from attngroup.reports.atomic import OutputPathError, check_output_path, write_text_atomic


def test_failed_write_keeps_the_previous_file_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "report.html"
    target.write_text("good report")

    def fail_replace(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OutputPathError) as error:
        write_text_atomic(target, "half")
    assert str(error.value) == f"cannot write {str(target)!r}: No space left on device"
    assert target.read_text() == "good report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_folders_are_created_only_when_asked(tmp_path):
    target = tmp_path / "out" / "nested" / "run.json"
    with pytest.raises(OutputPathError, match=r"the folder .*nested' does not exist"):
        write_text_atomic(target, "{}", create_parents=False)
    assert not (tmp_path / "out").exists()
    assert write_text_atomic(target, "{}").read_text() == "{}"


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_mode_follows_the_umask_like_open(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        target = write_text_atomic(tmp_path / "report.html", "<html></html>")
    finally:
        os.umask(previous)
    assert target.stat().st_mode & 0o777 == mode


@pytest.mark.parametrize(
    ("relative", "message"),
    [
        pytest.param("folder", "'{tmp}/folder' is a directory; name a file inside it", id="dir"),
        pytest.param("file.txt/a.json", "'{tmp}/file.txt' is a file, not a directory", id="file"),
        pytest.param(
            "file.txt/deeper/a.json", "'{tmp}/file.txt' is a file, not a directory", id="deeper"
        ),
    ],
)
@pytest.mark.parametrize("create_parents", [False, True])
def test_unwritable_targets_are_refused_plainly(tmp_path, relative, message, create_parents):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(OutputPathError) as error:
        check_output_path(tmp_path / relative, create_parents=create_parents)
    assert message.format(tmp=tmp_path) in str(error.value)
    assert "Errno" not in str(error.value)
