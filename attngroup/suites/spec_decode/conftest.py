"""Fixtures of the speculative-decoding suite: engines with session-cached
weights, and target-only greedy references computed once per configuration."""

from __future__ import annotations

import pytest

from attngroup.suites.spec_decode.harness import DTYPES, EngineFactory, greedy_generate, prompts_for


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> EngineFactory:
    return EngineFactory(tmp_path_factory.mktemp("pair-weights"))


@pytest.fixture(scope="session")
def target_only_tokens(engines: EngineFactory):
    """Greedy tokens of the target alone (k = 0), per (pair, backend, dtype)."""
    cache: dict[tuple[str, str, str], list[list[int]]] = {}

    def get(pair: str, backend: str, dtype: str) -> list[list[int]]:
        key = (pair, backend, dtype)
        if key not in cache:
            engine = engines.engine(pair, backend=backend, dtype=DTYPES[dtype], num_spec_tokens=0)
            cache[key] = greedy_generate(engine, prompts_for(pair))
        return cache[key]

    return get
