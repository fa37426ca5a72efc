"""Atomic file writes: a reader never sees a half-written record or report.

Every writer of the reports side goes through ``write_text_atomic``, which creates missing
folders unless told not to; commands call ``check_output_path`` first, so a bad output
path (for ``reports build``, a missing folder too) is refused before any work starts.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutputPathError(OSError):
    """An output path that cannot be written; the message is plain, without errno or temp names."""


def check_output_path(path: str | os.PathLike[str], *, create_parents: bool = False) -> Path:
    """``path`` as a Path when a file can be written there, else an ``OutputPathError``.

    Refused: a directory as the target, a parent that is a file, and a missing parent
    folder (unless ``create_parents``: then only its nearest existing ancestor must be one).
    """
    target = Path(path)
    if target.is_dir():
        raise OutputPathError(f"output {str(target)!r} is a directory; name a file inside it")
    existing = next(ancestor for ancestor in target.parents if ancestor.exists())
    if not existing.is_dir():
        raise OutputPathError(
            f"output {str(target)!r}: {str(existing)!r} is a file, not a directory"
        )
    if existing != target.parent and not create_parents:
        raise OutputPathError(
            f"output {str(target)!r}: the folder {str(target.parent)!r} does not exist"
        )
    return target


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_text_atomic(
    path: str | os.PathLike[str], text: str, *, create_parents: bool = True
) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``.

    The previous file, if any, stays intact until the new content is complete on disk
    (fsync), so an interrupted or failed write never replaces a good file with a broken
    one; the temporary file is removed on any error. The file gets the mode a plain
    ``open()`` would give it (0666 less the umask).
    """
    target = check_output_path(path, create_parents=create_parents)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temp_name = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
        )
    except OSError as error:
        raise OutputPathError(f"cannot write {str(target)!r}: {error.strerror or error}") from None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, 0o666 & ~_umask())  # mkstemp creates 0600
        os.replace(temp_name, target)
    except BaseException as error:
        Path(temp_name).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise OutputPathError(
                f"cannot write {str(target)!r}: {error.strerror or error}"
            ) from None
        raise
    return target
