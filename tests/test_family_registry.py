"""One home per decision: the model family is decided by the registry
(``attngroup.reference_engine.families``) and nowhere else.

A scan of the package finds no comparison of a family name or model type outside the
registry (and a planted one is found); each registered family answers the questions the
engine asks of it: its layers, what it refuses, how it drafts, and the engine models its
builder makes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attngroup.reference_engine.families import (
    FAMILIES,
    TARGET_TYPES,
    family_for,
    family_named,
)
from attngroup.reference_engine.families.family import (
    LINEAR,
    DraftAttach,
    SpecMethod,
    UnknownFamilyError,
)
from attngroup.reference_engine.family_layers import layer_describer
from attngroup.reference_engine.layers import Role
from attngroup.reference_engine.model_pairs import MODEL_PAIRS, ModelPair

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attngroup"
REGISTRY = PACKAGE / "reference_engine" / "families"
CONFIGS = PACKAGE / "suites" / "data" / "configs"

#: every name a family or its configs go by: the words a comparison would spell out
FAMILY_WORDS = sorted(
    {
        word
        for family in FAMILIES
        for word in (family.name, *family.target_types, *family.draft_types)
    },
    key=len,
    reverse=True,
)
_WORD = rf"""["'](?:{"|".join(map(re.escape, FAMILY_WORDS))})["']"""
FAMILY_COMPARISON = re.compile(
    rf"(?:==|!=)\s*{_WORD}"  # x == "gemma4"
    rf"|{_WORD}\s*(?:==|!=|(?:not\s+)?in\b)"  # "gemma4" != x, "qwen3" in x
    rf"|\bin\s*[(\[{{][^)\]}}]*{_WORD}"  # x in ("gemma4", ...)
    r"|(?<!for )\b(?:family|model_type)s?\b\s*(?:==|!=|(?:not\s+)?in\b)"  # pair.family == ...
    r"|\bin\s+[A-Z_]+_FAMILIES\b"  # x in DENSE_FAMILIES (a list of names outside the registry)
)


def family_comparisons(root: Path, *, outside: Path = REGISTRY) -> list[str]:
    """``path:line: text`` of each family comparison in ``root``'s modules outside ``outside``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.is_relative_to(outside):
            continue
        text = path.read_text()
        for match in FAMILY_COMPARISON.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(root)}:{line}: {text.splitlines()[line - 1].strip()}")
    return found


def test_no_family_comparison_outside_the_registry() -> None:
    assert family_comparisons(PACKAGE) == []


@pytest.mark.parametrize(
    "line",
    [
        'if pair.family == "gemma4":',
        'head_dim = fields.get("head_dim") if family != "qwen3_next" else None',
        'if family in ("gemma4", "qwen3_next") and method is not SpecMethod.MTP:',
        'if config.model_type == "qwen2":',
        "if draft.model_type not in DRAFT_TYPES[family]:",
        "elif pair.family in DENSE_FAMILIES:",
        'return "gemma4_assistant" == draft_type',
        'if x in (\n        "llama",\n        "qwen3",\n    ):\n        pass',
    ],
    ids=[
        "equals-literal",
        "not-equals-literal",
        "in-tuple-of-literals",
        "model-type-equals",
        "model-type-not-in",
        "in-family-list",
        "literal-first",
        "literal-on-a-later-line",
    ],
)
def test_a_planted_family_comparison_is_found(tmp_path: Path, line: str) -> None:
    module = tmp_path / "attngroup" / "planted.py"
    module.parent.mkdir()
    module.write_text(
        f'"""Planted by the test."""\n\n\ndef decide(pair, family, config, draft, x):\n    {line}\n'
    )
    found = family_comparisons(tmp_path, outside=tmp_path / "registry")
    assert len(found) == 1 and found[0].startswith("attngroup/planted.py:5:"), found


@pytest.mark.parametrize(
    "line",
    [
        'sliding = layer_type == "sliding_attention"',
        "family=GEMMA4.name,",
        '"gemma4": "Gemma4ForConditionalGeneration",',
        "for family in FAMILIES:",
        'ids=["gemma4-e2b", "llama31"]',
    ],
    ids=["layer-type", "registry-name", "dict-key", "iteration", "test-ids"],
)
def test_what_is_not_a_family_comparison_is_not_found(tmp_path: Path, line: str) -> None:
    (tmp_path / "module.py").write_text(f"{line}\n")
    assert family_comparisons(tmp_path, outside=tmp_path / "registry") == []


# --- the registry's answers ---------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_each_family_is_found_by_its_name_and_its_model_types(family) -> None:
    assert family_named(family.name) is family
    assert all(family_for(model_type) is family for model_type in family.target_types)
    assert family.draft_types and all(family.takes_draft(t) for t in family.draft_types)
    assert layer_describer(family.name) is family.describe_layers


def test_an_unknown_name_or_model_type_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(UnknownFamilyError, match=r"'gpt2' has no engine model.*'qwen3_next'"):
        family_for("gpt2")
    with pytest.raises(UnknownFamilyError, match=r"no model family 'gpt2'.*gemma4"):
        family_named("gpt2")
    assert len(set(TARGET_TYPES)) == sum(len(family.target_types) for family in FAMILIES)


@pytest.mark.parametrize("pair", MODEL_PAIRS.values(), ids=lambda pair: pair.name)
def test_registered_pairs_describe_their_layers_with_their_familys_describer(
    pair: ModelPair,
) -> None:
    family = family_named(pair.family)
    assert pair.describe_layers is family.describe_layers
    assert family.drafts_with(pair.spec_method)
    roles = [layer.role for layer in pair.layers(1)]
    assert roles == sorted(roles, key=[Role.TARGET, Role.DRAFT].index) and set(roles) == set(Role)
    kv_shared_drafts = [
        layer for layer in pair.layers(1) if layer.role is Role.DRAFT and layer.kv_sharing_target
    ]
    reads_target_kv = family.draft_attach is DraftAttach.SHARED_LAST_OF_TYPE
    assert bool(kv_shared_drafts) is reads_target_kv


def test_only_the_hybrid_family_takes_state_layers_and_mtp_only_families_refuse_eagle() -> None:
    assert [family.name for family in FAMILIES if LINEAR in family.layer_types] == ["qwen3_next"]
    refusing = {family.name for family in FAMILIES if not family.drafts_with(SpecMethod.EAGLE)}
    assert refusing == {"gemma4", "qwen3_next"}


class _Config:
    """The few attributes a family's support check reads."""

    def __init__(self, **fields) -> None:
        self.__dict__.update(fields)


@pytest.mark.parametrize(
    ("name", "config", "raw", "field"),
    [
        (
            "llama",
            _Config(rope_parameters={"rope_type": "yarn"}),
            {"rope_scaling": {}},
            "rope_scaling.rope_type",
        ),
        (
            "mistral",
            _Config(rope_parameters={}, sliding_window=8),
            {"use_sliding_window": False},
            "use_sliding_window",
        ),
        (
            "qwen3_next",
            _Config(rope_parameters={"rope_type": "dynamic"}),
            {"rope_parameters": {}},
            "rope_parameters.rope_type",
        ),
        ("gemma4", _Config(enable_moe_block=True), {}, "enable_moe_block"),
    ],
    ids=["dense-rope", "dense-window-off", "hybrid-rope", "gemma4-moe"],
)
def test_each_family_refuses_its_own_unimplemented_fields(name, config, raw, field) -> None:
    family = family_named(name)
    assert [found for found, _ in family.unsupported(config, raw)] == [field]
    supported = _Config(rope_parameters={"rope_type": "llama3"}, enable_moe_block=False)
    assert list(family.unsupported(supported, {})) == []


# --- builders ------------------------------------------------------------------------------------


def _pair_of(family_name: str) -> ModelPair:
    """A registered pair of the family, or one from the regression configs."""
    for pair in MODEL_PAIRS.values():
        if pair.family == family_name:
            return pair
    from attngroup.reference_engine.pairs.pair_configs import pair_from_configs

    folder = CONFIGS / f"{family_name}-window"
    return pair_from_configs(
        f"registry-{family_name}",
        Path(f"{folder}-target"),
        Path(f"{folder}-draft"),
        "draft_model",
        backend="torch",
    )


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_each_familys_builder_makes_the_layers_its_describer_names(family) -> None:
    from attngroup.reference_engine.models import family_builder
    from attngroup.reference_engine.models.common import PagedAttention
    from attngroup.reference_engine.models.parallel import SINGLE

    pair = _pair_of(family.name)
    models = family_builder(family)(pair, SINGLE)
    built = [
        module.layer_name
        for model in (models.target, models.draft)
        for module in model.modules()
        if isinstance(module, PagedAttention)
    ]
    described = [layer.name for layer in pair.layers(1) if layer.is_attention]
    assert built == described
    writes = {
        module.layer_name: module.writes_kv
        for model in (models.target, models.draft)
        for module in model.modules()
        if isinstance(module, PagedAttention)
    }
    assert writes == {
        layer.name: not layer.kv_sharing_target for layer in pair.layers(1) if layer.is_attention
    }


@pytest.mark.parametrize(
    ("name", "qk_norm", "q_bias", "o_bias"),
    [
        ("qwen3", True, False, False),
        ("qwen2", False, True, False),
        ("mistral", False, False, False),
    ],
)
def test_dense_quirks_reach_the_engine_model(name, qk_norm, q_bias, o_bias) -> None:
    from attngroup.reference_engine.models import family_builder
    from attngroup.reference_engine.models.parallel import SINGLE

    family = family_named(name)
    assert (family.qk_norm, family.qkv_bias_without_o) == (qk_norm, q_bias and not o_bias)
    attention = family_builder(family)(_pair_of(name), SINGLE).target.model.layers[0].self_attn
    assert hasattr(attention, "q_norm") is qk_norm
    assert (attention.q_proj.bias is not None, attention.o_proj.bias is not None) == (
        q_bias,
        o_bias,
    )
