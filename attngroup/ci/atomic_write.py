"""The one way ``ci`` writes a file: all of it or nothing, with the mode a normal write gives.

A temporary file in the target's directory is written, flushed to disk and renamed over the
target, so a reader never sees half a file and a failure leaves the old file (or none). The
temporary file is created with mode 0o666 less the umask, as ``open(path, "w")`` would create
it; a file being replaced keeps its own mode. ``attngroup/reports/`` has its own helper (the packages
stand apart and share no imports).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

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
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None
    temporary = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as error:
        raise CIInputError(f"cannot write {path}: {error.strerror}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
            if mode is not None:
                os.fchmod(stream.fileno(), mode)
        os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise CIInputError(f"cannot write {path}: {error.strerror}") from None
        raise
