"""Model pairs from transformers ``config.json`` files: read, checked, scaled down.

A user's pair is two checkpoint configs (read offline, no weights) and a
speculative method. ``pair_from_configs`` checks every field the engine would
otherwise ignore, scales the configs down the way the registered pairs are
(hidden size, vocabulary, layer count, window) while keeping what grouping and
the kernels see (query / KV heads, head sizes, the layer-type pattern, KV
sharing), and returns a ``ModelPair`` whose ``scaling`` lists real -> tiny.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import CONFIG_MAPPING, PretrainedConfig

from attngroup.reference_engine.families import family_for
from attngroup.reference_engine.families.family import (
    FULL,
    LINEAR,
    SLIDING,
    DraftAttach,
    ModelFamily,
    UnknownFamilyError,
)
from attngroup.reference_engine.model_pairs import TINY_VOCAB, TINY_WINDOW, ModelPair, SpecMethod

#: ``models.common.ACTIVATIONS``' names, kept here so that reading configs does not
#: import the models (and triton) before a command has set up its environment
ENGINE_ACTIVATIONS = ("gelu_pytorch_tanh", "silu")
TINY_HIDDEN = 256
TINY_ASSISTANT_HIDDEN = 128
TINY_UNIFORM_LAYERS = {"target": 4, "draft": 2}
#: fields that change only how the draft's logits are computed, not attention: the
#: tiny pair uses the plain value and ``scaling`` reports it (the engine lacks the variant)
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")
LOGITS_ONLY_FIELDS = {"use_ordered_embeddings": False}
#: a periodic layer-type pattern keeps whole periods, at least this many layers
TINY_PATTERN_LAYERS = 4


class PairConfigError(ValueError):
    """A config file or pair definition the engine cannot run as written (names file and field)."""


@dataclass(frozen=True)
class ConfigFile:
    """A checkpoint config as read: the path, the raw fields, transformers' config."""

    path: Path
    raw: dict[str, Any]
    config: PretrainedConfig

    @property
    def model_type(self) -> str:
        return self.raw["model_type"]

    def error(self, field: str, problem: str) -> PairConfigError:
        return PairConfigError(f"{self.path}: {field}: {problem}")


def read_config(path: Path) -> ConfigFile:
    """Read ``config.json`` (or a folder holding one) offline with transformers."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise PairConfigError(f"{path}: no such config file")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise PairConfigError(f"{path}: not a JSON config: {error}") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise PairConfigError(
            f"{path}: model_type: missing (transformers needs it to read the file)"
        )
    try:
        config_class = CONFIG_MAPPING[raw["model_type"]]
    except KeyError:
        raise PairConfigError(
            f"{path}: model_type: transformers does not know {raw['model_type']!r}"
        ) from None
    try:
        config = config_class.from_dict(copy.deepcopy(raw))
    except Exception as error:  # transformers' validation errors have no common type
        raise PairConfigError(f"{path}: transformers cannot read it: {error}") from None
    return ConfigFile(path, raw, config)


def _text_fields(file: ConfigFile) -> dict[str, Any]:
    """The language model's fields (a multimodal config such as Gemma 4's nests them)."""
    text = _text_config(file)
    if text is file.config:
        return copy.deepcopy(file.raw)
    return {**copy.deepcopy(file.raw["text_config"]), "model_type": text.model_type}


def _text_config(file: ConfigFile) -> PretrainedConfig:
    return file.config.get_text_config()


# --- checks: every field the engine would otherwise ignore ---------------------------------------


def check_supported(file: ConfigFile, family: ModelFamily) -> None:
    """Refuse fields whose behaviour the engine lacks, naming the field: those no family
    implements here, the family's own (``ModelFamily.unsupported``) after them."""
    config = _text_config(file)
    act = getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)
    if act not in ENGINE_ACTIVATIONS:
        raise file.error("hidden_act", f"{act!r} is not implemented (known: {ENGINE_ACTIVATIONS})")
    if getattr(config, "mlp_bias", False):
        raise file.error("mlp_bias", "True is not implemented")
    if getattr(config, "attn_logit_softcapping", None):
        raise file.error("attn_logit_softcapping", "attention soft-capping is not implemented")
    layer_types = getattr(config, "layer_types", None) or []
    for index, layer_type in enumerate(layer_types):
        if layer_type not in family.layer_types:
            raise file.error(f"layer_types[{index}]", f"{layer_type!r} is not implemented")
    unsupported = next(family.unsupported(config, file.raw), None)
    if unsupported:
        raise file.error(*unsupported)


# --- tiny scaling -------------------------------------------------------------------------------


def _period(types: list[str]) -> int:
    return next(
        p for p in range(1, len(types) + 1) if all(t == types[i % p] for i, t in enumerate(types))
    )


def tiny_layer_types(types: list[str], num_shared: int, role: str) -> tuple[list[str], int]:
    """A short layer-type list with the same pattern, and its KV-shared tail length.

    Periodic patterns keep whole periods (one for KV-shared layers, if any);
    others keep each run of one type at most twice (Qwen's full-then-sliding);
    four layers or fewer stay as they are.
    """
    if len(types) <= 4:
        return list(types), num_shared
    period = _period(types)
    if period == 1:
        count = TINY_UNIFORM_LAYERS[role]
        return types[:count], min(num_shared, count // 2)
    if period < len(types):
        own = period * max(1, TINY_PATTERN_LAYERS // period)
        shared = min(num_shared, period)
        return [types[i % period] for i in range(own + shared)], shared
    if num_shared:
        raise ValueError(
            "num_kv_shared_layers: KV sharing over a non-periodic layer_types pattern "
            "cannot be scaled down faithfully"
        )
    runs: list[str] = []
    for index, layer_type in enumerate(types):
        run_start = index == 0 or types[index - 1] != layer_type
        if run_start or runs[-2:] != [layer_type, layer_type]:
            runs.append(layer_type)
    return runs, 0


def _layer_types_of(config: PretrainedConfig) -> list[str]:
    types = getattr(config, "layer_types", None)
    return list(types) if types is not None else [FULL] * config.num_hidden_layers


@dataclass
class _Scaler:
    """Collects overrides and the (model, field, real, tiny) report of one model."""

    model: str
    fields: dict[str, Any]
    report: list[tuple[str, str, object, object]]

    def set(self, name: str, value: Any) -> None:
        real = self.fields.get(name)
        if real != value:
            self.report.append((self.model, name, real, value))
        self.fields[name] = value

    def cap(self, name: str, limit: int) -> None:
        if self.fields.get(name):
            self.set(name, min(self.fields[name], limit))


def _scale_text(
    scaler: _Scaler, config: PretrainedConfig, role: str, hidden: int, family: ModelFamily
) -> None:
    fields = scaler.fields
    head_dim = family.tiny_head_dim(config, fields)
    if head_dim:
        fields["head_dim"] = head_dim  # explicit: the hidden size changes below
    scaler.set("hidden_size", min(fields["hidden_size"], hidden))
    scaler.set("intermediate_size", min(fields["intermediate_size"], 2 * fields["hidden_size"]))
    scaler.set("vocab_size", min(fields["vocab_size"], TINY_VOCAB))
    for name in TOKEN_ID_FIELDS:  # special tokens past the tiny vocabulary do not exist there
        ids = fields.get(name)
        if any(i >= fields["vocab_size"] for i in (ids if isinstance(ids, list) else [ids or 0])):
            scaler.set(name, None)
    scaler.cap("sliding_window", TINY_WINDOW)
    num_shared = fields.get("num_kv_shared_layers", 0) or 0
    real_types = _layer_types_of(config)
    try:
        types, shared = tiny_layer_types(real_types, num_shared, role)
    except ValueError as error:
        raise PairConfigError(f"{scaler.model} config: {error}") from None
    scaler.set("num_hidden_layers", len(types))
    if getattr(config, "layer_types", None) is not None:
        fields["layer_types"] = types
        if types != real_types:
            scaler.report.append(
                (scaler.model, "layer_types", _pattern(real_types), _pattern(types))
            )
    if num_shared:
        scaler.set("num_kv_shared_layers", shared)
    if "max_window_layers" in fields or getattr(config, "max_window_layers", None) is not None:
        leading_full = next((i for i, t in enumerate(types) if t == SLIDING), len(types))
        scaler.set("max_window_layers", leading_full)
    family.scale_extra(scaler)


def _pattern(types: list[str]) -> str:
    short = {SLIDING: "S", FULL: "F", LINEAR: "L"}
    return "".join(short.get(t, "?") for t in types)


def _build(file: ConfigFile, fields: dict[str, Any]) -> PretrainedConfig:
    try:
        return CONFIG_MAPPING[fields["model_type"]](**fields)
    except Exception as error:
        raise file.error("(scaled)", f"transformers refused the scaled config: {error}") from None


# --- pairs --------------------------------------------------------------------------------------


def _family(target: ConfigFile) -> ModelFamily:
    try:
        return family_for(target.model_type)
    except UnknownFamilyError as error:
        raise target.error("model_type", str(error)) from None


def _check_pairing(
    target: ConfigFile, draft: ConfigFile, family: ModelFamily, method: SpecMethod, attach: str
) -> None:
    if not family.takes_draft(draft.model_type):
        raise draft.error(
            "model_type",
            f"a {target.model_type} target takes a draft of type {sorted(family.draft_types)}, "
            f"not {draft.model_type!r}",
        )
    known = [choice.value for choice in DraftAttach]
    if attach not in known:
        raise PairConfigError(f"draft_kv: {attach!r} is not one of {tuple(known)}")
    if attach != family.draft_attach:
        raise draft.error(
            "model_type",
            f"a {draft.model_type} draft attaches as {family.draft_attach.value!r}, not {attach!r}",
        )
    if not family.drafts_with(method):
        methods = " or ".join(choice.value for choice in family.spec_methods)
        raise PairConfigError(
            f"method: a {family.name} pair drafts with {methods}, not {method.value!r}"
        )


def _scaled_configs(
    target: ConfigFile, draft: ConfigFile, family: ModelFamily, method: SpecMethod
) -> tuple[Callable[[], PretrainedConfig], Callable[[], PretrainedConfig], list]:
    report: list[tuple[str, str, object, object]] = []
    target_fields = _text_fields(target)
    target_scaler = _Scaler("target", target_fields, report)
    _scale_text(target_scaler, _text_config(target), "target", TINY_HIDDEN, family)
    tiny_hidden = target_fields["hidden_size"]
    if family.draft_attach is DraftAttach.SHARED_LAST_OF_TYPE:
        # an assistant: Q-only text layers between projections from and to the target's width
        draft_fields = copy.deepcopy(draft.raw)
        text_scaler = _Scaler("draft", draft_fields["text_config"], report)
        _scale_text(text_scaler, draft.config.text_config, "draft", TINY_ASSISTANT_HIDDEN, family)
        outer = _Scaler("draft", draft_fields, report)
        outer.set("backbone_hidden_size", tiny_hidden)
        for name, plain in LOGITS_ONLY_FIELDS.items():
            if name in draft_fields:
                outer.set(name, plain)
    else:
        draft_fields = _text_fields(draft)
        # EAGLE / MTP layers take the target's hidden state: same width
        draft_hidden = tiny_hidden if method is not SpecMethod.DRAFT_MODEL else TINY_HIDDEN
        _scale_text(
            _Scaler("draft", draft_fields, report), draft.config, "draft", draft_hidden, family
        )
    tiny_target, tiny_draft = _build(target, target_fields), _build(draft, draft_fields)
    return (
        lambda: copy.deepcopy(tiny_target),
        lambda: copy.deepcopy(tiny_draft),
        report,
    )


def pair_from_configs(
    name: str,
    target_path: Path,
    draft_path: Path,
    method: str,
    *,
    draft_kv: str | None = None,
    description: str | None = None,
    backend: str = "triton",
) -> ModelPair:
    """A tiny model pair from two checkpoint configs (see the module docstring)."""
    try:
        spec_method = SpecMethod(method)
    except ValueError:
        raise PairConfigError(
            f"method: {method!r} is not one of {[m.value for m in SpecMethod]}"
        ) from None
    target, draft = read_config(target_path), read_config(draft_path)
    family = _family(target)
    attach = draft_kv or family.draft_attach
    _check_pairing(target, draft, family, spec_method, attach)
    check_supported(target, family)
    check_supported(draft, family)
    make_target, make_draft, report = _scaled_configs(target, draft, family, spec_method)
    pair = ModelPair(
        name=name,
        description=description or f"{target.path} + {draft.path} ({spec_method.value}, {attach})",
        family=family.name,
        spec_method=spec_method,
        target_config=make_target,
        draft_config=make_draft,
        describe_layers=family.describe_layers,
        default_backend=backend,
        scaling=tuple(report),
    )
    _check_describes(pair, target, draft)
    return pair


def _check_describes(pair: ModelPair, target: ConfigFile, draft: ConfigFile) -> None:
    """Describing the layers once turns a config the engine misreads into an error here."""
    try:
        pair.layers(1)
    except (ValueError, KeyError, AttributeError) as error:
        raise PairConfigError(f"{target.path} + {draft.path}: {error}") from None
