"""The engine-adapter seam: what the grouping suites ask an implementation.

The suites judge an engine's grouping without importing its internals. An
adapter answers three questions in the engine's own code and converts the
answers into the neutral types below (the reference engine's public spec
types serve as the common language for specs):

1. KV-cache groups for a set of per-layer specs, with KV sharing;
2. attention groups inside those KV-cache groups for a set of layers;
3. the query-head count each group's metadata builders would use, or the
   error the engine's strict check raises.
"""

from __future__ import annotations

import traceback
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attngroup.reference_engine.kv_cache_spec import KVCacheGroupSpec, KVCacheSpec
from attngroup.reference_engine.layers import LayerDescription

if TYPE_CHECKING:
    from attngroup.reference_engine.model_pairs import ModelPair

#: Traceback frames an adapter error keeps (the innermost ones).
ERROR_FRAMES = 4


@dataclass(frozen=True)
class AttentionGroupView:
    """One attention group as the engine built it."""

    backend: str  # fully qualified backend class name
    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec
    kv_cache_group_id: int
    num_heads_q: int  # the key's head count (0 for non-attention layers)
    builder_num_heads: int | None  # what its builders read; None when they raised
    builder_error: str | None = None  # the builders' error (e.g. the strict check's)


@dataclass(frozen=True)
class GroupingOutcome:
    """Everything an engine's start-up decided about grouping.

    ``error`` is the first error start-up raised (type name and message, as a
    traceback's last line reads), or None when start-up succeeded.
    """

    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    attention_groups: tuple[tuple[AttentionGroupView, ...], ...]
    error: str | None
    runner: str | None = None  # the engine's code path that grouped (vLLM: v1 or v2)


@dataclass(frozen=True)
class StartupRequest:
    """One grouping start-up the suites ask of an engine (``EngineAdapter.setup``'s arguments)."""

    layers: tuple[LayerDescription, ...]
    policy: str
    block_size: int = 16
    dtype: torch.dtype = torch.float32
    pair: ModelPair | None = None  # the model the layers come from; None for made-up layers


class EngineAdapter(ABC):
    """An implementation under test."""

    #: the ``--engine`` name
    name: str

    @property
    def version(self) -> str:
        """The implementation's version, for run records and verdict tables."""
        return "unversioned"

    @property
    def policies(self) -> tuple[str, ...]:
        """The grouping policies this engine can run. ``"native"`` is the
        engine's own behaviour; the reference engine also offers ``"legacy"``
        (backend + spec only) so the suites can prove they catch it."""
        return ("native",)

    def expects_conformance(self, policy: str, pair_is_mixed: bool) -> bool:
        """Whether the suites must demand conformance of this configuration.

        Every engine's native behaviour must conform. Only deliberately
        broken configurations (the reference engine's LEGACY policy on a
        mixed-Q-head pair) are expected to fail, loudly."""
        return True

    @abstractmethod
    def kv_cache_groups(
        self, specs: Mapping[str, KVCacheSpec], kv_sharing: Mapping[str, str]
    ) -> list[KVCacheGroupSpec]:
        """The engine's KV-cache groups for ``specs``; KV-sharing layers
        (keys of ``kv_sharing``, which have no spec) join their target's group."""

    def setup(
        self,
        layers: Sequence[LayerDescription],
        policy: str,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        pair: ModelPair | None = None,
    ) -> GroupingOutcome:
        """Run the engine's grouping start-up for ``layers`` under ``policy``:
        specs, KV-cache groups, attention groups, and the builders' head
        counts. ``pair`` is the model pair the layers come from (None for a
        made-up layer set): an engine may choose its runner by the model.
        The engine's start-up errors are captured in the outcome, never
        raised; the adapter's own failures raise ``AdapterError``."""
        return self.start_up(StartupRequest(tuple(layers), policy, block_size, dtype, pair))

    @abstractmethod
    def start_up(self, request: StartupRequest) -> GroupingOutcome:
        """``setup``'s work in the engine's own code, for one request."""


def format_error(error: BaseException) -> str:
    """An exception as the last line of its traceback reads."""
    return f"{type(error).__name__}: {error}"


class EngineUnavailableError(Exception):
    """The engine does not run this configuration at all (a runner it lacks, a config it
    refuses when the engine is made): neither a verdict on its grouping nor the harness's
    error. The suites skip such a test, naming why; the verdict files call it unavailable."""


class AdapterError(RuntimeError):
    """The adapter (or its stand-ins, or an import it needs) failed: a harness error,
    never a verdict on the engine. ``frames`` are the traceback's innermost lines.

    ``harness_error`` is what the run record's pytest plugin looks for (it cannot
    import the suites): a test failing with such an exception is an *adapter error*."""

    harness_error = True

    def __init__(self, message: str, frames: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.frames = frames

    @classmethod
    def wrapping(cls, error: BaseException, step: str) -> AdapterError:
        frames = traceback.format_tb(error.__traceback__)[-ERROR_FRAMES:]
        return cls(
            f"adapter error in {step}: {format_error(error)}",
            tuple(frame.rstrip() for frame in frames),
        )

    def __str__(self) -> str:
        text = super().__str__()
        return "\n".join((text, *self.frames)) if self.frames else text
