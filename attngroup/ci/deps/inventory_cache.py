"""The tests of every test file, read once per content and cached like the import facts.

Reading test functions means parsing every test file (vLLM: about 2,000), the larger half of
a whole-repository check. A file's tests depend on its bytes and on the conftest.py files
above it (hooks that add markers or ids), so both make the cache key.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attngroup.ci.deps.parse_cache import cached_map, content_key
from attngroup.ci.deps.test_inventory import TestFunction, conftest_chain, tests_in_file


def _tests_of(item: str) -> list[dict[str, Any]]:
    root, _, path = item.partition("\0")
    return [
        {
            "node": test.node,
            "names": sorted(test.names),
            "markers": sorted(test.markers),
            "dynamic_ids": test.dynamic_ids,
            "dynamic_markers": test.dynamic_markers,
        }
        for test in tests_in_file(Path(root), path)
    ]


def _is_tests(entry: Any) -> bool:
    return isinstance(entry, list) and all(isinstance(test, dict) for test in entry)


class TestInventory:
    """``tests_in_file`` for a known set of files, from the cache or parsed in parallel."""

    __test__ = False  # not a pytest test class

    def __init__(self, repo_root: Path, paths: Iterable[str], cache_dir: Path | None) -> None:
        conftest_keys: dict[str, bytes] = {}

        def read(path: str) -> bytes:
            try:
                return (repo_root / path).read_bytes()
            except OSError:
                return b""

        keys = {}
        for path in paths:
            chain = conftest_chain(repo_root, path)
            for conftest in chain:
                if conftest not in conftest_keys:
                    conftest_keys[conftest] = content_key(read(conftest)).encode()
            key = content_key(read(path), *(conftest_keys[conftest] for conftest in chain))
            keys[f"{repo_root}\0{path}"] = key
        cache_file = cache_dir / "tests.json" if cache_dir is not None else None
        found = cached_map(cache_file, keys, _tests_of, _is_tests)
        self.tests = {
            item.partition("\0")[2]: tuple(
                TestFunction(
                    file=item.partition("\0")[2],
                    node=test["node"],
                    names=frozenset(test["names"]),
                    markers=frozenset(test["markers"]),
                    dynamic_ids=test["dynamic_ids"],
                    dynamic_markers=test["dynamic_markers"],
                )
                for test in tests
            )
            for item, tests in found.items()
        }

    def __call__(self, repo_root: Path, path: str) -> tuple[TestFunction, ...]:
        if path in self.tests:
            return self.tests[path]
        return tests_in_file(repo_root, path)
