"""Import graph of a repository: which repository files a file makes Python execute.

Two kinds of edge, reported apart. *Static* edges come from import statements, at module
level or inside functions (``import a.b``, ``from a import b`` where ``b`` may be a module,
relative imports); importing ``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``.
Imports under ``if TYPE_CHECKING:`` never run and are no edges. *Registry* edges come from
dotted-path strings (``"attngroup.kernels.backends.triton_attn.TritonAttentionBackend"``) and f-string
templates, and only in the files the configuration names as registries: elsewhere such a
string names one lazily loaded choice among hundreds (one model, one tokenizer), and following
it would make every test depend on every model.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from attngroup.ci.deps.parse_cache import Facts, parse_files
from attngroup.ci.deps.reach import closures

SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "build", "dist", "venv", "site-packages"})
STATIC = "static"
REGISTRY = "registry"
MODULE_LEVEL = "module"  # static edges minus function-local imports: they run on import


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


def import_root_problems(repo_root: Path, import_roots: Iterable[str]) -> list[str]:
    """Why an ``import_roots`` entry would silently index nothing, or index shifted names."""
    problems = []
    for root in import_roots:
        directory = repo_root / root
        if not directory.is_dir():
            problems.append(f"import_roots entry {root!r} is not a directory of the repository")
        elif (directory / "__init__.py").is_file():
            parent = os.path.dirname(root.rstrip("/")) or "."
            problems.append(
                f"import_roots entry {root!r} is a package ({root.rstrip('/')}/__init__.py "
                f"exists): its modules would be indexed without the "
                f"'{os.path.basename(root.rstrip('/'))}.' prefix that imports use; "
                f"name the directory on sys.path instead ({parent!r})"
            )
        elif next(iter_python_files(repo_root, root), None) is None:
            problems.append(f"import_roots entry {root!r} holds no Python file")
    return problems


@dataclass
class ImportGraph:
    """Module index, import facts of every indexed file, and both kinds of edge."""

    repo_root: Path
    import_roots: tuple[str, ...] = (".",)
    registries: frozenset[str] = frozenset()
    cache_dir: Path | None = None
    modules: dict[str, str] = field(default_factory=dict)  # module name -> path
    path_modules: dict[str, str] = field(default_factory=dict)  # path -> module name
    facts: dict[str, Facts] = field(default_factory=dict)
    _edges: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    _local_only: dict[str, frozenset[str]] = field(default_factory=dict)  # function-local targets
    _closures: dict[tuple[tuple[str, ...], frozenset[str]], tuple[dict[str, int], list[int]]] = (
        field(default_factory=dict)
    )
    _importers: dict[tuple[str, ...], dict[str, list[str]]] = field(default_factory=dict)
    _reaching: dict[tuple[str, tuple[str, ...], frozenset[str]], frozenset[str]] = field(
        default_factory=dict
    )

    @classmethod
    def scan(
        cls,
        repo_root: Path,
        import_roots: Iterable[str] = (".",),
        registries: Iterable[str] = (),
        cache_dir: Path | None = None,
    ) -> ImportGraph:
        graph = cls(repo_root, tuple(import_roots), frozenset(registries), cache_dir)
        for import_root in graph.import_roots:
            for path in iter_python_files(repo_root, import_root):
                name = module_name(path, import_root)
                if name and "-" not in name:
                    graph.modules.setdefault(name, path)
                    graph.path_modules.setdefault(path, name)
        graph.facts = parse_files(repo_root, graph.path_modules, cache_dir)
        return graph

    @property
    def parse_errors(self) -> dict[str, str]:
        return {path: facts["error"] for path, facts in self.facts.items() if "error" in facts}

    @functools.cached_property
    def top_level(self) -> set[str]:
        return {name.split(".")[0] for name in self.modules}

    def _facts(self, path: str) -> Facts:
        if path not in self.facts:  # a root outside the import roots: parsed, not cached
            self.facts.update(parse_files(self.repo_root, [path]))
        return self.facts[path]

    def _prefix_modules(self, dotted: str) -> list[str]:
        """Paths of every known module among the prefixes of ``dotted`` (packages first)."""
        parts = dotted.split(".")
        names = (".".join(parts[: index + 1]) for index in range(len(parts)))
        return [self.modules[name] for name in names if name in self.modules]

    def _package_of(self, path: str) -> str:
        name = self.path_modules.get(path, module_name(path))
        return name if path.endswith("__init__.py") else name.rpartition(".")[0]

    def _imported_names(self, path: str) -> Iterator[tuple[str, bool]]:
        """(dotted name, imported inside a function) of each import of ``path``."""
        for level, module, names, local in self._facts(path)["imports"]:
            if level:
                package = self._package_of(path).split(".")
                keep = len(package) - (level - 1)
                base = ".".join([*package[: max(keep, 0)], *filter(None, [module])])
            else:
                base = module
            if base:
                yield base, local
            for name in names or ():
                yield (f"{base}.{name}" if base else name), local

    def _string_targets(self, path: str) -> Iterator[str]:
        facts = self._facts(path)
        for dotted in facts["strings"]:
            if dotted.split(".")[0] not in self.top_level:
                continue
            found = self._prefix_modules(dotted)
            # "ci.yaml" names no module; "pkg.mod.Class" does (2+ known components).
            if dotted in self.modules or len(found) >= 2:
                yield from found
        for pieces in facts["templates"]:
            if pieces[0].split(".")[0] not in self.top_level:
                continue
            pattern = re.compile(
                "".join(r"[\w.]+" if piece is None else re.escape(piece) for piece in pieces)
            )
            for name in self.modules:
                if pattern.fullmatch(name):
                    yield from self._prefix_modules(name)

    def edges(self, path: str, kind: str = STATIC) -> tuple[str, ...]:
        """Repository files that importing ``path`` executes directly, by edge kind (cached);
        static edges include function-local imports (:meth:`edge_symbol` tells them apart)."""
        key = (path, kind)
        if key not in self._edges:
            targets: dict[str, None] = {}
            if kind == STATIC:
                module_level: set[str] = set()
                package = self.path_modules.get(path, "").rpartition(".")[0]
                if package:
                    module_level.update(self._prefix_modules(package))
                    targets.update(dict.fromkeys(self._prefix_modules(package)))
                for dotted, local in self._imported_names(path):
                    found = self._prefix_modules(dotted)
                    targets.update(dict.fromkeys(found))
                    if not local:
                        module_level.update(found)
                self._local_only[path] = frozenset(targets) - module_level - {path}
            elif kind == MODULE_LEVEL:
                static = self.edges(path, STATIC)
                targets.update(dict.fromkeys(t for t in static if t not in self._local_only[path]))
            elif path in self.registries:
                targets.update(dict.fromkeys(self._string_targets(path)))
            targets.pop(path, None)
            self._edges[key] = tuple(targets)
        return self._edges[key]

    def edge_symbol(self, source: str, target: str) -> str:
        """``->`` a module-level import, ``~>`` only a function-local one (runs when that
        function is called), ``=>`` only a registry string."""
        if target not in self.edges(source, STATIC):
            return "=>"
        return "~>" if target in self._local_only[source] else "->"

    def format_chain(self, chain: tuple[str, ...]) -> str:
        """``a -> b ~> c => d``: each edge with its kind."""
        parts = [chain[0]]
        for source, target in itertools.pairwise(chain):
            parts.extend((self.edge_symbol(source, target), target))
        return " ".join(parts)

    def _successors(
        self, path: str, kinds: tuple[str, ...], excluded: frozenset[str] = frozenset()
    ) -> Iterator[str]:
        if path in excluded:
            return
        for kind in kinds:
            yield from (target for target in self.edges(path, kind) if target not in excluded)

    @functools.cached_property
    def nodes(self) -> tuple[str, ...]:
        """Indexed paths in bit order for :meth:`reach`."""
        return tuple(sorted(self.path_modules))

    def _bits(
        self, kinds: tuple[str, ...], excluded: frozenset[str]
    ) -> tuple[dict[str, int], list[int]]:
        if (kinds, excluded) not in self._closures:
            position = {path: index for index, path in enumerate(self.nodes)}
            successors = [
                [
                    position[target]
                    for target in self._successors(path, kinds, excluded)
                    if target in position
                ]
                for path in self.nodes
            ]
            self._closures[(kinds, excluded)] = (position, closures(successors))
        return self._closures[(kinds, excluded)]

    def reach(
        self,
        roots: Iterable[str],
        kinds: tuple[str, ...] = (STATIC,),
        excluded: frozenset[str] = frozenset(),
    ) -> int:
        """Bitset (bit i = ``nodes[i]``) of every indexed file the roots make Python run;
        ``excluded`` files (platform modules of other devices) are neither reached nor followed."""
        position, reachable = self._bits(kinds, excluded)
        bits = 0
        for root in roots:
            if root in excluded:
                continue
            if root in position:
                bits |= reachable[position[root]]
            else:
                for target in self._successors(root, kinds, excluded):
                    if target in position:
                        bits |= reachable[position[target]]
        return bits

    def _importers_of(self, kinds: tuple[str, ...]) -> dict[str, list[str]]:
        """Reverse edges of ``kinds``: indexed file -> the indexed files that import it."""
        if kinds not in self._importers:
            importers: dict[str, list[str]] = defaultdict(list)
            for path in self.nodes:
                for kind in kinds:
                    for target in self.edges(path, kind):
                        importers[target].append(path)
            self._importers[kinds] = importers
        return self._importers[kinds]

    def reaching(
        self, target: str, kinds: tuple[str, ...], excluded: frozenset[str] = frozenset()
    ) -> frozenset[str]:
        """Every indexed file whose import runs ``target`` (itself included) without passing
        through ``excluded``: what a change to one file needs, without the closure of every
        node that :meth:`reach` computes for all steps at once."""
        key = (target, kinds, excluded)
        if key not in self._reaching:
            found: set[str] = set()
            stack = [] if target in excluded else [target]
            importers = self._importers_of(kinds)
            found.update(stack)
            while stack:
                for source in importers.get(stack.pop(), ()):
                    if source not in found and source not in excluded:
                        found.add(source)
                        stack.append(source)
            self._reaching[key] = frozenset(found)
        return self._reaching[key]

    def reaches(
        self,
        roots: Iterable[str],
        reaching: frozenset[str],
        kinds: tuple[str, ...],
        excluded: frozenset[str] = frozenset(),
    ) -> bool:
        """Whether importing ``roots`` runs a file of ``reaching`` (from :meth:`reaching` with
        the same ``kinds`` and ``excluded``); a root outside the index counts by its imports."""
        for root in roots:
            if root in excluded:
                continue
            if root in reaching:
                return True
            if root not in self.path_modules and any(
                target in reaching for target in self._successors(root, kinds, excluded)
            ):
                return True
        return False

    def chain(
        self, roots: Iterable[str], target: str, excluded: frozenset[str] = frozenset()
    ) -> tuple[tuple[str, ...], str]:
        """The shortest import chain root -> ... -> ``target`` avoiding ``excluded``, and its
        kind (``registry`` when no static chain exists). Stops once ``target`` is reached;
        only files that can reach ``target`` are searched (the same chain, found sooner)."""
        for kinds in ((MODULE_LEVEL,), (STATIC,), (STATIC, REGISTRY)):
            useful = self.reaching(target, kinds, excluded)
            parents: dict[str, str | None] = dict.fromkeys(r for r in roots if r not in excluded)
            queue = deque(parents)
            while queue and target not in parents:
                path = queue.popleft()
                for successor in self._successors(path, kinds, excluded):
                    if successor not in parents and (
                        successor in useful or successor not in self.path_modules
                    ):
                        parents[successor] = path
                        queue.append(successor)
            if target in parents:
                chain = [target]
                while (parent := parents[chain[-1]]) is not None:
                    chain.append(parent)
                return tuple(reversed(chain)), REGISTRY if REGISTRY in kinds else STATIC
        raise ValueError(f"{target} is not reachable from the roots")
