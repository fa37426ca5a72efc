"""The reference engine: the grouping key at the top of this package, the engine loop in
``engine/``, tiny models in ``models/``, pairs from configs in ``pairs/``, the CLI in ``cli/``.

The engine's entry points load lazily, so that importing the grouping API (or answering
``--help``) does not load torch."""

from __future__ import annotations

import importlib
from typing import Any

#: the engine's entry points, importable from here: name -> the module that defines it
ENGINE_ENTRY_POINTS = {
    "EngineConfig": "attngroup.reference_engine.engine.llm_engine",
    "LLMEngine": "attngroup.reference_engine.engine.llm_engine",
    "SamplingParams": "attngroup.reference_engine.engine.request",
}

__all__ = sorted(ENGINE_ENTRY_POINTS)


def __getattr__(name: str) -> Any:
    if name not in ENGINE_ENTRY_POINTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(ENGINE_ENTRY_POINTS[name]), name)
