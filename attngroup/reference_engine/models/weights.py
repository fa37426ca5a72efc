"""Weights for a model pair: transformers models built from the pair's configs
with a fixed seed, saved as safetensors, and loaded into the engine's modules.

The path is a real one: the engine never copies parameters out of a live
transformers model. ``reference_models`` builds the transformers target and
draft (``AutoModelForCausalLM.from_config`` / ``Gemma4AssistantForCausalLM``)
after ``torch.manual_seed(seed)``; ``save_pair_weights`` writes their state
dicts (plus the EAGLE / MTP input projection, which transformers has no model
for) to ``target.safetensors`` and ``draft.safetensors``; ``load_weights``
maps checkpoint names to the engine's parameter names and refuses missing,
unexpected or mis-shaped tensors with an error that names them.

Parameters that transformers initialises to a constant (norm weights, Gemma 4's
``layer_scalar``, ...) are perturbed with seeded noise, so that a model that
forgets one of them cannot agree with transformers by accident.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM, Gemma4AssistantConfig, Gemma4AssistantForCausalLM

from attngroup import atomic_write
from attngroup.reference_engine.families import family_named
from attngroup.reference_engine.families.family import DraftAttach
from attngroup.reference_engine.model_pairs import ModelPair, SpecMethod

TARGET_FILE = "target.safetensors"
DRAFT_FILE = "draft.safetensors"
CONSTANT_PERTURBATION = 0.1
INIT_STD = 0.02


class WeightLoadError(ValueError):
    """A checkpoint does not fit the engine's modules (the message lists how)."""


@dataclass
class ReferenceModels:
    """The transformers models of a pair, and the draft tensors transformers has no module for."""

    target: nn.Module
    draft: nn.Module
    draft_extra: dict[str, torch.Tensor]


def needs_hidden_input_projection(pair: ModelPair) -> bool:
    """EAGLE and MTP layers that write their own KV take cat(embed, hidden) through ``fc``
    (an assistant that reads the target's KV is a transformers model with its own projections)."""
    own_kv = family_named(pair.family).draft_attach is DraftAttach.OWN
    return own_kv and pair.spec_method is not SpecMethod.DRAFT_MODEL


def draft_has_input_norms(pair: ModelPair) -> bool:
    """MTP layers norm the embedding and the hidden state before ``fc``; EAGLE does not."""
    return pair.spec_method is SpecMethod.MTP


def reference_models(pair: ModelPair, seed: int) -> ReferenceModels:
    """The pair's transformers models, float32, eval mode, deterministic in ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    target = _from_config(pair.target_config())
    torch.manual_seed(seed + 1)
    draft_config = pair.draft_config()
    if isinstance(draft_config, Gemma4AssistantConfig):
        draft = Gemma4AssistantForCausalLM(draft_config).to(torch.float32).eval()
    else:
        draft = _from_config(draft_config)
    extra: dict[str, torch.Tensor] = {}
    zero_centered = family_named(pair.family).zero_centered_norms  # norms scale by (1 + w)
    if needs_hidden_input_projection(pair):
        hidden = draft_config.hidden_size
        extra["fc.weight"] = torch.randn(hidden, 2 * hidden, generator=generator) * INIT_STD
        if draft_has_input_norms(pair):
            for name in ("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight"):
                extra[name] = torch.randn(hidden, generator=generator) * CONSTANT_PERTURBATION
                if not zero_centered:
                    extra[name] += 1.0
    for model in (target, draft):
        _perturb_constant_tensors(model, generator)
        _temper_scale_free_attention(model)
    return ReferenceModels(target=target, draft=draft, draft_extra=extra)


def _from_config(config) -> nn.Module:
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@torch.no_grad()
def _perturb_constant_tensors(model: nn.Module, generator: torch.Generator) -> None:
    seen: set[int] = set()
    # Saved tensors only: non-persistent buffers (embedding scales, RoPE tables) are not weights.
    for tensor in model.state_dict(keep_vars=True).values():
        if id(tensor) in seen or not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        seen.add(id(tensor))
        flat = tensor.reshape(-1)
        if bool((flat == flat[0]).all()):
            tensor.add_(torch.randn(tensor.shape, generator=generator) * CONSTANT_PERTURBATION)


@torch.no_grad()
def _temper_scale_free_attention(model: nn.Module) -> None:
    """Gemma 4 attends with scale 1.0 on RMS-normed q and k: with random norm
    weights near 1, q.k over a 256-wide head has a spread of ~16, a softmax so
    peaked that float32 rounding alone moves the logits by ~5e-4 (transformers'
    own float32 forward against float64). Trained models keep these logits O(1);
    scaling the q/k norm weights by head_dim**-0.25 does the same here."""
    for name, module in model.named_modules():
        if name.endswith("self_attn") and getattr(module, "scaling", None) == 1.0:
            for norm_name in ("q_norm", "k_norm"):
                norm = getattr(module, norm_name, None)
                if norm is not None and getattr(norm, "weight", None) is not None:
                    norm.weight.mul_(module.head_dim**-0.25)


def _state_dict_for_saving(model: nn.Module) -> dict[str, torch.Tensor]:
    # Tied weights share storage, which safetensors refuses: save each name's own copy.
    return {
        name: tensor.detach().contiguous().clone() for name, tensor in model.state_dict().items()
    }


def _save_atomically(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]
) -> None:
    atomic_write.write_with(
        path, lambda temporary: save_file(tensors, str(temporary), metadata=metadata)
    )


@dataclass(frozen=True)
class WeightFiles:
    target: Path
    draft: Path


def save_pair_weights(
    pair: ModelPair, seed: int, directory: Path, models: ReferenceModels | None = None
) -> WeightFiles:
    """Write the weights of the pair's transformers models (built here unless
    ``models``, built by ``reference_models(pair, seed)``, are given) to ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    models = models or reference_models(pair, seed)
    metadata = {"pair": pair.name, "seed": str(seed)}
    files = WeightFiles(directory / TARGET_FILE, directory / DRAFT_FILE)
    _save_atomically(_state_dict_for_saving(models.target), files.target, metadata)
    draft_tensors = _state_dict_for_saving(models.draft)
    draft_tensors.update(models.draft_extra)
    _save_atomically(draft_tensors, files.draft, metadata)
    return files


def pair_weight_files(pair: ModelPair, seed: int, directory: Path) -> WeightFiles:
    """The pair's weight files in ``directory``, written there first unless
    files for the same pair and seed are already present."""
    files = WeightFiles(Path(directory) / TARGET_FILE, Path(directory) / DRAFT_FILE)
    if all(_metadata_matches(path, pair.name, seed) for path in (files.target, files.draft)):
        return files
    return save_pair_weights(pair, seed, directory)


def _metadata_matches(path: Path, pair_name: str, seed: int) -> bool:
    if not path.exists():
        return False
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    return metadata.get("pair") == pair_name and metadata.get("seed") == str(seed)


Rename = Callable[[str], str | None]


def identity(name: str) -> str:
    return name


def skipping(*prefixes: str) -> Rename:
    """A rename that drops checkpoint tensors under ``prefixes`` and keeps the rest."""
    return lambda name: None if name.startswith(prefixes) else name


@torch.no_grad()
def load_weights(
    module: nn.Module,
    path: Path,
    rename: Rename = identity,
    *,
    shard: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """Load ``path`` into ``module``'s parameters and persistent buffers.

    ``rename`` maps a checkpoint name to the module's name (None: not used by
    the engine); ``shard`` cuts a full tensor to this rank's slice. Every
    parameter must be loaded exactly once with the expected shape.
    """
    checkpoint = load_file(str(path))
    targets: dict[str, torch.Tensor] = dict(module.named_parameters())
    targets.update(
        (name, buffer)
        for name, buffer in module.named_buffers()
        if name.rsplit(".", 1)[-1] not in _non_persistent_buffer_names(module, name)
    )
    unexpected, mismatched, loaded = [], [], set()
    for checkpoint_name, tensor in checkpoint.items():
        name = rename(checkpoint_name)
        if name is None:
            continue
        if name not in targets:
            unexpected.append(checkpoint_name)
            continue
        if shard is not None:
            tensor = shard(name, tensor)
        if tuple(tensor.shape) != tuple(targets[name].shape):
            mismatched.append(
                f"{checkpoint_name}: checkpoint {tuple(tensor.shape)} vs engine {tuple(targets[name].shape)}"
            )
            continue
        targets[name].copy_(tensor.to(targets[name].dtype))
        loaded.add(name)
    missing = sorted(set(targets) - loaded)
    if unexpected or mismatched or missing:
        raise WeightLoadError(
            f"{path.name} does not fit {type(module).__name__}: "
            f"missing {missing}, unexpected {sorted(unexpected)}, shape mismatches {mismatched}; "
            "the checkpoint and the engine's model must come from the same config"
        )


def _non_persistent_buffer_names(module: nn.Module, qualified: str) -> set[str]:
    owner = module.get_submodule(qualified.rsplit(".", 1)[0]) if "." in qualified else module
    return set(owner._non_persistent_buffers_set)
