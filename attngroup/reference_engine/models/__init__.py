"""The engine's models: one module per family, built from a pair's configs and
loaded from safetensors files (``attngroup.reference_engine.models.weights``).

Each family's builder is named by its ``ModelFamily`` (``attngroup.reference_engine.families``)
and imported here when a pair of the family is first built.

``build_pair_models`` returns the target and the draft of a pair with the
attention-layer names of ``ModelPair.layers()``: the target's under "model",
a draft model's / EAGLE layer's / Gemma 4 assistant's under "draft_model",
Qwen3-Next's MTP layer under "mtp".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch

from attngroup.reference_engine.families import family_named
from attngroup.reference_engine.families.family import DraftAttach, ModelFamily
from attngroup.reference_engine.model_pairs import ModelPair, SpecMethod
from attngroup.reference_engine.models.common import FamilyModels, LanguageModel
from attngroup.reference_engine.models.parallel import SINGLE, TensorParallel, shard_for
from attngroup.reference_engine.models.weights import load_weights, skipping


class DraftKind(StrEnum):
    DRAFT_MODEL = "draft_model"  # a separate LM with its own KV, fed tokens only
    HIDDEN_CONDITIONED = "hidden_conditioned"  # EAGLE / MTP: own KV, fed (target hidden, token)
    CONSTANT_POSITION = "constant_position"  # Gemma 4 assistant: Q-only, reads the target's KV


@dataclass
class PairModels:
    target: LanguageModel
    draft: LanguageModel
    draft_kind: DraftKind


def draft_kind_of(pair: ModelPair) -> DraftKind:
    if family_named(pair.family).draft_attach is DraftAttach.SHARED_LAST_OF_TYPE:
        return DraftKind.CONSTANT_POSITION
    if pair.spec_method is SpecMethod.DRAFT_MODEL:
        return DraftKind.DRAFT_MODEL
    return DraftKind.HIDDEN_CONDITIONED


def family_builder(family: ModelFamily) -> Callable[[ModelPair, TensorParallel], FamilyModels]:
    """The function ``family.builder`` names (``"module:function"``), imported now."""
    module_name, _, function_name = family.builder.partition(":")
    return getattr(importlib.import_module(module_name), function_name)


def build_pair_models(
    pair: ModelPair,
    target_file: Path,
    draft_file: Path,
    device: torch.device,
    dtype: torch.dtype,
    tp: TensorParallel = SINGLE,
) -> PairModels:
    """The pair's engine models on one tensor-parallel rank, with weights
    loaded (and cut to the rank's shard) from ``target_file`` / ``draft_file``."""
    models = family_builder(family_named(pair.family))(pair, tp)
    load_weights(models.target, target_file, shard=shard_for(models.target, tp))
    load_weights(
        models.draft,
        draft_file,
        skipping(*models.draft_skips),
        shard=shard_for(models.draft, tp),
    )
    return PairModels(
        target=models.target.to(device=device, dtype=dtype).eval(),
        draft=models.draft.to(device=device, dtype=dtype).eval(),
        draft_kind=draft_kind_of(pair),
    )
