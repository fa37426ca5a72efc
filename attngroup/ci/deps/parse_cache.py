"""Import facts of Python files, parsed in parallel and cached by file content.

Parsing is most of check-deps' cost (vLLM: about 6,000 files, 85 MB). The facts of a file
(its import statements, dotted-path strings, f-string templates) depend only on its bytes,
so they are cached under the BLAKE2 hash of the content, in one JSON file per repository in
the user's cache directory (never inside the repository, so read-only trees work and nothing
needs ignoring). The test inventory of test files is cached the same way (``attngroup.ci.deps.checker``). A cache that cannot be read or parsed is discarded and rebuilt; it is
replaced atomically, so a crash never leaves half a cache.
"""

from __future__ import annotations

import ast
import hashlib
import json
import multiprocessing
import os
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from attngroup import atomic_write

FACTS_VERSION = 2  # 2: imports carry whether they run inside a function
PARALLEL_THRESHOLD = 128  # fewer misses than this parse faster in-process
# Workers start as fresh interpreters, not forks: a forked child inherits the caller's CUDA
# state, and freeing an inherited CUDA tensor there aborts it ("CUDA error: initialization
# error", seen when a GPU test worker ran check-deps in-process). Starting so costs little
# beside the parse.
_WORKER_START = multiprocessing.get_context("spawn")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")

# {"imports": [[level, module, [names] | None, local]], "strings": [...], "templates": [[piece|None]]}
Facts = dict[str, Any]


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def facts_of_source(source: bytes) -> Facts:
    """Imports (module level and inside functions, not under ``if TYPE_CHECKING``), dotted
    strings and f-string templates whose first piece is literal."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as error:
        return {"error": str(error), "imports": [], "strings": [], "templates": []}
    imports: list[list] = []
    strings: list[str] = []
    templates: list[list] = []
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]  # (node, inside a function)
    while stack:
        node, local = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, local) for child in node.orelse)  # annotations only
            continue
        if isinstance(node, ast.Import):
            imports.extend([0, alias.name, None, local] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names if alias.name != "*"]
            imports.append([node.level, node.module or "", names, local])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _DOTTED.match(node.value):
                strings.append(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values:
            pieces = [
                part.value if isinstance(part, ast.Constant) else None for part in node.values
            ]
            if pieces[0] is not None:
                templates.append(pieces)
        inner = local or isinstance(node, _FUNCTIONS)
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))
    return {"imports": imports, "strings": strings, "templates": templates}


def _facts_of_file(path: str) -> Facts:
    return facts_of_source(Path(path).read_bytes())


def default_cache_dir(repo_root: Path) -> Path:
    """``$CI_DEPS_CACHE_DIR`` or ``$XDG_CACHE_HOME/attention-grouping-ci`` (``~/.cache``),
    one subdirectory per repository path."""
    directory = os.environ.get("CI_DEPS_CACHE_DIR") or (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention-grouping-ci"
    )
    key = hashlib.blake2b(str(repo_root.resolve()).encode(), digest_size=8).hexdigest()
    return Path(directory) / key


def content_key(*contents: bytes) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for content in contents:
        digest.update(len(content).to_bytes(8, "little"))
        digest.update(content)
    return digest.hexdigest()


def _read_cache(cache_file: Path) -> dict[str, Any]:
    try:
        document = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # absent, unreadable or corrupt: rebuilt from the sources
    if not isinstance(document, dict) or document.get("version") != FACTS_VERSION:
        return {}
    entries = document.get("entries")
    return entries if isinstance(entries, dict) else {}


def _write_cache(cache_file: Path, entries: dict[str, Any]) -> None:
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write.write_text(
            cache_file, json.dumps({"version": FACTS_VERSION, "entries": entries})
        )
    except OSError:
        pass  # a cache that cannot be written only costs the next run its speed


def cached_map(
    cache_file: Path | None,
    keys: dict[str, str],
    compute: Callable[[str], Any],
    valid: Callable[[Any], bool],
) -> dict[str, Any]:
    """``compute(item)`` for each item of ``keys`` (item -> content key), from the cache when
    its key is there and the entry is ``valid``; misses run in parallel processes when many.
    The cache is rewritten with exactly this run's entries, so it never grows stale."""
    cached = _read_cache(cache_file) if cache_file is not None else {}
    results = {
        item: cached[key] for item, key in keys.items() if key in cached and valid(cached[key])
    }
    missing = [item for item in keys if item not in results]
    if len(missing) >= PARALLEL_THRESHOLD and (os.cpu_count() or 1) > 1:
        with ProcessPoolExecutor(mp_context=_WORKER_START) as pool:
            results.update(zip(missing, pool.map(compute, missing, chunksize=32), strict=True))
    else:
        results.update((item, compute(item)) for item in missing)
    if cache_file is not None and (missing or len(cached) != len(set(keys.values()))):
        _write_cache(cache_file, {keys[item]: results[item] for item in keys})
    return results


def _is_facts(entry: Any) -> bool:
    return isinstance(entry, dict) and {"imports", "strings", "templates"} <= entry.keys()


def parse_files(
    repo_root: Path, paths: Iterable[str], cache_dir: Path | None = None
) -> dict[str, Facts]:
    """Facts of each repository-relative path (unreadable files have an ``error``)."""
    keys, facts = {}, {}
    for path in paths:
        try:
            keys[str(repo_root / path)] = content_key((repo_root / path).read_bytes())
        except OSError as error:
            facts[path] = {"error": str(error), "imports": [], "strings": [], "templates": []}
    cache_file = cache_dir / "imports.json" if cache_dir is not None else None
    parsed = cached_map(cache_file, keys, _facts_of_file, _is_facts)
    root = str(repo_root)
    facts.update((os.path.relpath(item, root), value) for item, value in parsed.items())
    return facts
