"""How layers of one KV-cache group are keyed into attention groups.

Its own module, free of torch, so that the command lines can offer the policies
without loading the engine (``attngroup.reference_engine.attention_groups`` re-exports it).
"""

from __future__ import annotations

from enum import StrEnum


class GroupingPolicy(StrEnum):
    SPLIT_BY_Q_HEADS = "split"
    LEGACY = "legacy"
