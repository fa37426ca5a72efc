"""The files a change touches, from git, with a reason instead of a guess when git cannot say.

Renames count with both paths (the old path's dependents lost a file), deletions count, and
untracked files count only when asked (vLLM's ``git add .`` made stray logs "changed").
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from attngroup.ci.errors import CIInputError

# Characters that never occur in a ref or revision expression we accept (option injection,
# whitespace, control characters, git's forbidden ref characters apart from the rev-syntax ones).
_BAD_REF = re.compile(r"^-|[\s\x00-\x1f\x7f\\]|\.\.|@\{-|\[|\*|\?")


@dataclass(frozen=True)
class ChangeSet:
    """Changed paths between ``merge_base`` and ``head``; ``files`` is None when unknown."""

    base: str
    head: str
    merge_base: str | None
    files: tuple[str, ...] | None
    unavailable_reason: str | None = None

    @property
    def known(self) -> bool:
        return self.files is not None


def check_ref(ref: str, what: str) -> None:
    """Reject refs that cannot be revisions, before they reach git's command line."""
    if not ref or _BAD_REF.search(ref):
        raise CIInputError(f"{what} {ref!r} is not a valid git revision")


def _git(repo_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-c", "core.quotepath=off", *args],
        cwd=repo_root,
        capture_output=True,
        text=True,
        check=False,
    )


def _parse_name_status(output: str) -> list[str]:
    """Paths from ``git diff --name-status -z``; renames and copies give both paths."""
    fields = output.split("\0")
    paths: list[str] = []
    index = 0
    while index < len(fields) and fields[index]:
        status = fields[index]
        width = 2 if status[0] in "RC" else 1
        paths.extend(fields[index + 1 : index + 1 + width])
        index += 1 + width
    return paths


def _unavailable(base: str, head: str, reason: str) -> ChangeSet:
    return ChangeSet(base=base, head=head, merge_base=None, files=None, unavailable_reason=reason)


def compute_changes(
    repo_root: Path,
    base: str,
    head: str | None = None,
    include_untracked: bool = False,
    merge_base_override: str | None = None,
) -> ChangeSet:
    """Files changed since the merge base of ``base`` and ``head``.

    Without ``head`` the working tree is compared (committed, staged and unstaged changes).
    """
    check_ref(base, "base")
    if head is not None:
        check_ref(head, "head")
    head_name = head or "WORKTREE"
    if shutil.which("git") is None:
        return _unavailable(base, head_name, "git is not installed")
    if _git(repo_root, "rev-parse", "--is-inside-work-tree").returncode != 0:
        return _unavailable(base, head_name, f"{repo_root} is not a git work tree")
    if merge_base_override:
        check_ref(merge_base_override, "MERGE_BASE_COMMIT")
        merge_base = merge_base_override
    else:
        found = _git(repo_root, "merge-base", base, head or "HEAD")
        if found.returncode != 0:
            shallow = _git(repo_root, "rev-parse", "--is-shallow-repository").stdout.strip()
            known = _git(repo_root, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
            if shallow == "true":
                reason = (
                    f"shallow clone: no merge base of {base!r} and {head or 'HEAD'!r} in "
                    "the fetched history (fetch with --unshallow or a deeper --depth)"
                )
            elif known.returncode != 0:
                reason = f"unknown base ref {base!r}"
            else:
                reason = f"no merge base of {base!r} and {head or 'HEAD'!r}: {found.stderr.strip()}"
            return _unavailable(base, head_name, reason)
        merge_base = found.stdout.strip()
    revisions = [merge_base, head] if head else [merge_base]
    diff = _git(repo_root, "diff", "--name-status", "-z", "-M", "--no-ext-diff", *revisions, "--")
    if diff.returncode != 0:
        return _unavailable(base, head_name, f"git diff failed: {diff.stderr.strip()}")
    files = _parse_name_status(diff.stdout)
    if include_untracked and head is None:
        untracked = _git(repo_root, "ls-files", "--others", "--exclude-standard", "-z")
        files.extend(path for path in untracked.stdout.split("\0") if path)
    return ChangeSet(
        base=base, head=head_name, merge_base=merge_base, files=tuple(dict.fromkeys(files))
    )


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", re.MULTILINE)


def _old_lines(patch: str) -> frozenset[int]:
    """Base-side line numbers a unified ``-U0`` patch touches: the lines it rewrites or deletes,
    and for a pure insertion the lines on both sides of it (code that ran there runs beside it)."""
    lines: set[int] = set()
    for match in _HUNK.finditer(patch):
        start, count = int(match.group(1)), int(match.group(2) or "1")
        lines.update(range(start, start + count) if count else (start, start + 1))
    return frozenset(line for line in lines if line > 0)


def changed_lines(repo_root: Path, changes: ChangeSet) -> dict[str, frozenset[int]]:
    """Per changed path, the lines of its base version the change touches (empty for a new
    file). Runtime coverage was recorded on the base, so these are the lines to look up."""
    if not changes.known or changes.merge_base is None:
        return {}
    revisions = [changes.merge_base] + ([changes.head] if changes.head != "WORKTREE" else [])
    lines = {}
    for path in changes.files or ():
        diff = _git(
            repo_root, "diff", "-U0", "--no-ext-diff", "--no-renames", *revisions, "--", path
        )
        if diff.returncode != 0:
            raise CIInputError(f"git diff of {path} failed: {diff.stderr.strip()}")
        lines[path] = _old_lines(diff.stdout)
    return lines
