"""Output files of the reports side: a reader never sees a half-written record or report.

Every writer of the reports side goes through ``write_text_atomic`` (the project's
``attngroup.atomic_write`` underneath), which creates missing folders unless told not to;
commands call ``check_output_path`` first, so a bad output path (for ``reports build``, a
missing folder too) is refused before any work starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from attngroup import atomic_write


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


def write_text_atomic(
    path: str | os.PathLike[str], text: str, *, create_parents: bool = True
) -> Path:
    """Write ``text`` to ``path`` with the project's writer (``attngroup.atomic_write``).

    The previous file, if any, stays intact until the new content is complete on disk, and
    no temporary file is left on any error; the mode is the one ``open()`` gives. This adds
    the reports side's policy: the path checked first, missing folders created unless
    ``create_parents`` is false, and an ``OSError`` as a plain ``OutputPathError``.
    """
    target = check_output_path(path, create_parents=create_parents)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write.write_text(target, text)
    except OSError as error:
        raise OutputPathError(f"cannot write {str(target)!r}: {error.strerror or error}") from None
    return target
