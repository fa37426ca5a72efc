"""Static import graph of a repository: which repository files a file makes Python execute.

Edges come from ``import a.b``, ``from a import b`` (``b`` may be a module), relative imports,
and string literals that spell a dotted module path (how backend registries load backends:
``"kernels.backends.triton_attn.TritonAttentionBackend"``). Importing ``a.b.c`` also runs
``a/__init__.py`` and ``a/b/__init__.py``, so packages are edges too. Imports under functions
or ``TYPE_CHECKING`` count: over-approximating costs a declared path, missing one costs a bug.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "build", "dist", "venv", "site-packages"})
_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")


def iter_python_files(repo_root: Path, under: str = ".") -> Iterator[str]:
    """Repository-relative paths of .py files, skipping hidden, cache and build directories."""
    start = (repo_root / under).resolve()
    if start.is_file():
        if start.suffix == ".py":
            yield start.relative_to(repo_root.resolve()).as_posix()
        return
    root = repo_root.resolve()
    for directory, subdirs, files in os.walk(start):
        subdirs[:] = sorted(
            name
            for name in subdirs
            if not name.startswith(".")
            and name not in SKIPPED_DIRS
            and not name.endswith(".egg-info")
        )
        relative = Path(directory).relative_to(root)
        for name in sorted(files):
            if name.endswith(".py"):
                yield (relative / name).as_posix()


def module_name(path: str, import_root: str = ".") -> str:
    """``a/b/c.py`` -> ``a.b.c``; ``a/b/__init__.py`` -> ``a.b`` (relative to ``import_root``)."""
    relative = os.path.relpath(path, import_root) if import_root != "." else path
    parts = relative[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass
class ImportGraph:
    """Module index plus lazily parsed, cached import edges between repository files."""

    repo_root: Path
    import_roots: tuple[str, ...] = (".",)
    modules: dict[str, str] = field(default_factory=dict)  # module name -> path
    path_modules: dict[str, str] = field(default_factory=dict)  # path -> module name
    parse_errors: dict[str, str] = field(default_factory=dict)
    _edges: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def scan(cls, repo_root: Path, import_roots: Iterable[str] = (".",)) -> ImportGraph:
        graph = cls(repo_root, tuple(import_roots))
        for import_root in graph.import_roots:
            for path in iter_python_files(repo_root, import_root):
                name = module_name(path, import_root)
                if name and "-" not in name:
                    graph.modules.setdefault(name, path)
                    graph.path_modules.setdefault(path, name)
        return graph

    @functools.cached_property
    def top_level(self) -> set[str]:
        return {name.split(".")[0] for name in self.modules}

    def _prefix_modules(self, dotted: str) -> list[str]:
        """Paths of every known module among the prefixes of ``dotted`` (packages first)."""
        parts = dotted.split(".")
        names = (".".join(parts[: index + 1]) for index in range(len(parts)))
        return [self.modules[name] for name in names if name in self.modules]

    def _package_of(self, path: str) -> str:
        name = self.path_modules.get(path, module_name(path))
        return name if path.endswith("__init__.py") else name.rpartition(".")[0]

    def _referenced_names(self, path: str, tree: ast.AST) -> Iterator[tuple[str, bool]]:
        """(dotted name, from a string literal) for every import-like reference in ``tree``."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, False
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    package = self._package_of(path).split(".")
                    keep = len(package) - (node.level - 1)
                    base = ".".join([*package[: max(keep, 0)], *filter(None, [node.module])])
                else:
                    base = node.module or ""
                if base:
                    yield base, False
                for alias in node.names:
                    if alias.name != "*":
                        yield f"{base}.{alias.name}" if base else alias.name, False
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _DOTTED.match(node.value)
            ):
                yield node.value, True
            elif isinstance(node, ast.JoinedStr):
                yield from ((name, True) for name in self._template_matches(node))

    def _template_matches(self, template: ast.JoinedStr) -> list[str]:
        """Modules an f-string such as ``f"suites.engines.{name}_adapter"`` can name."""
        pieces = [
            re.escape(part.value) if isinstance(part, ast.Constant) else None
            for part in template.values
        ]
        if not pieces or pieces[0] is None or not isinstance(template.values[0], ast.Constant):
            return []
        literal_head = template.values[0].value.split(".")[0]
        if literal_head not in self.top_level:
            return []
        pattern = re.compile("".join(piece or r"[\w.]+" for piece in pieces))
        return [name for name in self.modules if pattern.fullmatch(name)]

    def edges(self, path: str) -> tuple[str, ...]:
        """Repository files that importing ``path`` executes directly (cached)."""
        if path in self._edges:
            return self._edges[path]
        targets: dict[str, None] = {}
        package = self.path_modules.get(path, "").rpartition(".")[0]
        if package:
            targets.update(dict.fromkeys(self._prefix_modules(package)))
        try:
            source = (self.repo_root / path).read_text(encoding="utf-8", errors="replace")
            tree = ast.parse(source, filename=path)
        except (OSError, SyntaxError, ValueError) as error:
            self.parse_errors[path] = str(error)
            tree = ast.Module(body=[], type_ignores=[])
        top_level = self.top_level
        for dotted, from_string in self._referenced_names(path, tree):
            if from_string:
                if dotted.split(".")[0] not in top_level:
                    continue
                found = self._prefix_modules(dotted)
                # "ci.yaml" names no module; "pkg.mod.Class" does (2+ known components).
                if dotted not in self.modules and len(found) < 2:
                    continue
                targets.update(dict.fromkeys(found))
            else:
                targets.update(dict.fromkeys(self._prefix_modules(dotted)))
        targets.pop(path, None)
        self._edges[path] = tuple(targets)
        return self._edges[path]

    def closure(self, roots: dict[str, int]) -> dict[str, tuple[int, str | None]]:
        """Every file reachable from ``roots`` (path -> start distance) as path -> (distance,
        the file that imported it). Breadth-first, so each distance is the shortest."""
        reached: dict[str, tuple[int, str | None]] = {}
        queue: deque[str] = deque()
        for path, distance in sorted(roots.items(), key=lambda item: item[1]):
            if path not in reached:
                reached[path] = (distance, None)
                queue.append(path)
        while queue:
            path = queue.popleft()
            distance = reached[path][0]
            for target in self.edges(path):
                if target not in reached or reached[target][0] > distance + 1:
                    reached[target] = (distance + 1, path)
                    queue.append(target)
        return reached
