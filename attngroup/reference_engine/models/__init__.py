"""The engine's models: one module per family, built from a pair's configs and
loaded from safetensors files (``attngroup.reference_engine.models.weights``).

``build_pair_models`` returns the target and the draft of a pair with the
attention-layer names of ``ModelPair.layers()``: the target's under "model",
a draft model's / EAGLE layer's / Gemma 4 assistant's under "draft_model",
Qwen3-Next's MTP layer under "mtp".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch
from torch import nn

from attngroup.reference_engine.family_layers import DENSE_FAMILIES
from attngroup.reference_engine.model_pairs import ModelPair, SpecMethod
from attngroup.reference_engine.models.gemma4 import Gemma4ForCausalLM
from attngroup.reference_engine.models.gemma4_assistant import Gemma4Assistant
from attngroup.reference_engine.models.llama import build_dense_draft_head, build_dense_model
from attngroup.reference_engine.models.parallel import SINGLE, TensorParallel, shard_for
from attngroup.reference_engine.models.qwen3_next import Qwen3NextForCausalLM, build_qwen3_next_mtp
from attngroup.reference_engine.models.weights import identity, load_weights, skipping


class DraftKind(StrEnum):
    DRAFT_MODEL = "draft_model"  # a separate LM with its own KV, fed tokens only
    HIDDEN_CONDITIONED = "hidden_conditioned"  # EAGLE / MTP: own KV, fed (target hidden, token)
    CONSTANT_POSITION = "constant_position"  # Gemma 4 assistant: Q-only, reads the target's KV


@dataclass
class PairModels:
    target: nn.Module
    draft: nn.Module
    draft_kind: DraftKind


def draft_kind_of(pair: ModelPair) -> DraftKind:
    if pair.family == "gemma4":
        return DraftKind.CONSTANT_POSITION
    if pair.spec_method is SpecMethod.DRAFT_MODEL:
        return DraftKind.DRAFT_MODEL
    return DraftKind.HIDDEN_CONDITIONED


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
    target_config, draft_config = pair.target_config(), pair.draft_config()
    kind = draft_kind_of(pair)
    draft_rename = identity
    if pair.family == "gemma4":
        target = Gemma4ForCausalLM(target_config, "model", tp)
        draft = Gemma4Assistant(draft_config, target.model, "draft_model", tp)
        # The assistant's own embedding is a placeholder: it embeds with the target's.
        draft_rename = skipping("model.embed_tokens.")
    elif pair.family == "qwen3_next":
        target = Qwen3NextForCausalLM(target_config, "model", tp)
        draft = build_qwen3_next_mtp(draft_config, "mtp", tp)
    elif pair.family in DENSE_FAMILIES:
        target = build_dense_model(target_config, "model", tp)
        if kind is DraftKind.DRAFT_MODEL:
            draft = build_dense_model(draft_config, "draft_model", tp)
        else:
            draft = build_dense_draft_head(
                draft_config, "draft_model", tp, input_norms=pair.spec_method is SpecMethod.MTP
            )
    else:
        raise ValueError(f"model pair {pair.name}: no engine model for family {pair.family!r}")
    load_weights(target, target_file, shard=shard_for(target, tp))
    load_weights(draft, draft_file, draft_rename, shard=shard_for(draft, tp))
    return PairModels(
        target=target.to(device=device, dtype=dtype).eval(),
        draft=draft.to(device=device, dtype=dtype).eval(),
        draft_kind=kind,
    )
