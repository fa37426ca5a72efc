"""The project's one way to replace a file: all of it or nothing, with the mode ``open()`` gives.

A temporary file ``.<name>.<random>.tmp`` in the target's folder is written, flushed to disk
and renamed over the target, so a reader never sees half a file and a failure leaves the old
file (or none) and no temporary behind.

Mode rule, the one ``open(path, "w")`` follows: a new file gets 0o666 less the umask; a file
being replaced keeps its own mode.

A leaf: it imports nothing from ``attngroup``, so ``ci``, ``reports`` and the engine side may
all use it without crossing the walls between them. Errors are plain ``OSError``s (and whatever
the writer raises); callers that promise a tidy message wrap them. Missing folders are the
caller's to create.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["replacing", "write_bytes", "write_text", "write_with"]


def _existing_mode(path: Path) -> int | None:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return None


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``path``; on a clean exit it replaces ``path``.

    The temporary file exists (empty, with the new-file mode) when yielded; whatever writes it
    may reopen or recreate it, the mode rule is applied again before the rename. On any error,
    inside the block or while replacing, the temporary file is removed and ``path`` is untouched.
    """
    target = Path(path)
    kept_mode = _existing_mode(target)
    temporary = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        new_file_mode = stat.S_IMODE(temporary.stat().st_mode)  # 0o666 less the umask
        yield temporary
        descriptor = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.chmod(temporary, new_file_mode if kept_mode is None else kept_mode)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_with(path: str | os.PathLike[str], writer: Callable[[Path], object]) -> None:
    """Replace ``path`` with what ``writer(temporary_path)`` writes (``torch.save``, safetensors)."""
    with replacing(path) as temporary:
        writer(temporary)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data``."""
    with replacing(path) as temporary, open(temporary, "wb") as stream:
        stream.write(data)


def write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``text`` (UTF-8 unless told otherwise)."""
    write_bytes(path, text.encode(encoding))
