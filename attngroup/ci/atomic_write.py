"""How ``ci`` writes a file: refused up front when impossible, then through the project's writer.

The writing itself (all or nothing, the mode ``open()`` gives) is ``attngroup.atomic_write``'s;
this module adds ``ci``'s policy: no folders are created, and an ``OSError`` becomes a
``CIInputError`` (exit 2) with a plain message.
"""

from __future__ import annotations

from pathlib import Path

from attngroup import atomic_write
from attngroup.ci.errors import CIInputError


def check_writable_target(path: Path) -> None:
    """A clear error, before any work, when ``path`` cannot be written as a file."""
    parent = path.parent
    if path.is_dir():
        raise CIInputError(f"{path} is a directory; give a file name")
    if not parent.exists():
        raise CIInputError(f"cannot write {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise CIInputError(f"cannot write {path}: {parent} is not a directory")


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically."""
    check_writable_target(path)
    try:
        atomic_write.write_text(path, text)
    except OSError as error:
        raise CIInputError(f"cannot write {path}: {error.strerror}") from None
