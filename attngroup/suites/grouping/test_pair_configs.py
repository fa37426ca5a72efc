"""Model pairs from checkpoint config files (``attngroup.reference_engine.pairs.pair_configs``,
``attngroup.reference_engine.pairs.pairs_file``): what the layer descriptions keep of the real
configs, what is refused, and how a bad pairs file is reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attngroup.reference_engine.family_layers import layer_describer
from attngroup.reference_engine.pairs.pair_configs import (
    PairConfigError,
    pair_from_configs,
    read_config,
    tiny_layer_types,
)
from attngroup.reference_engine.pairs.pairs_file import PairsFileError, load_pairs_file

pytestmark = pytest.mark.grouping

ROOT = Path(__file__).parents[2]  # attngroup/
SHIPPED = ROOT / "reference_engine" / "configs"
SHIPPED_PAIRS = SHIPPED / "pairs.yaml"
REGRESSION = ROOT / "suites" / "data" / "configs"
S, F = "sliding_attention", "full_attention"


@pytest.fixture(scope="module")
def shipped_pairs():
    return {pair.name: pair for pair in load_pairs_file(SHIPPED_PAIRS)}


@pytest.mark.parametrize(
    ("name", "mixed"),
    [
        ("cfg-gemma4-e2b-mtp", True),
        ("cfg-gemma4-e4b-mtp", True),
        ("cfg-llama31-8b-draft-llama32-1b", False),
        ("cfg-qwen3-8b-draft-1.7b", True),
        ("cfg-mistral-7b-eagle", False),
    ],
)
def test_shipped_pairs_are_mixed_as_the_real_models(shipped_pairs, name, mixed):
    assert shipped_pairs[name].is_mixed is mixed


def _signatures(layers) -> set[tuple]:
    """What grouping and the kernels see of each layer, without counts and window sizes."""
    return {
        (
            layer.role,
            layer.num_heads_q,
            layer.num_kv_heads,
            layer.head_size,
            layer.sliding_window is not None,
            layer.kv_sharing_target is not None,
        )
        for layer in layers
    }


def _real_layers(pair, entry: dict):
    target = read_config(SHIPPED / entry["target"]).config.get_text_config()
    draft = read_config(SHIPPED / entry["draft"]).config
    return layer_describer(pair.family)(target, draft, 1, "triton")


@pytest.mark.parametrize(
    "index", range(5), ids=["gemma4-e2b", "gemma4-e4b", "llama31", "qwen3", "mistral"]
)
def test_scaling_keeps_heads_head_sizes_windows_and_sharing(shipped_pairs, index):
    import yaml

    entry = yaml.safe_load(SHIPPED_PAIRS.read_text())["pairs"][index]
    pair = shipped_pairs[entry["name"]]
    real, tiny = _real_layers(pair, entry), pair.layers()
    assert _signatures(tiny) == _signatures(real)
    assert len(tiny) < len(real)
    real_windows = {layer.sliding_window for layer in real} - {None}
    tiny_windows = {layer.sliding_window for layer in tiny} - {None}
    assert tiny_windows == {min(w, 32) for w in real_windows}
    for config in (pair.target_config(), pair.draft_config()):
        text = config.get_text_config()
        assert text.hidden_size <= 256 and text.vocab_size <= 512


def test_gemma4_e2b_scaling_keeps_the_sharing_structure(shipped_pairs):
    layers = shipped_pairs["cfg-gemma4-e2b-mtp"].layers()
    target = [layer for layer in layers if not layer.is_draft]
    assert [layer.sliding_window is None for layer in target] == [False] * 4 + [True] + [
        False
    ] * 4 + [True]
    assert [layer.kv_sharing_target for layer in target[5:]] == [
        "model.layers.3.self_attn.attn"
    ] * 4 + ["model.layers.4.self_attn.attn"]
    draft = [layer for layer in layers if layer.is_draft]
    assert [layer.num_heads_q for layer in draft] == [4] * 4
    assert [layer.head_size for layer in draft] == [256, 256, 256, 512]


def test_qwen3_window_applies_from_max_window_layers():
    """Regression (issue 17): the window was dropped and layer 1 ran as full attention."""
    pair = pair_from_configs(
        "q",
        REGRESSION / "qwen3-window-target" / "config.json",
        REGRESSION / "qwen3-window-draft" / "config.json",
        "draft_model",
    )
    assert [layer.sliding_window for layer in pair.layers()] == [None, 8, None]


def test_mistral_window_applies_to_every_layer():
    pair = pair_from_configs(
        "m",
        REGRESSION / "mistral-window-target" / "config.json",
        REGRESSION / "mistral-window-draft" / "config.json",
        "draft_model",
    )
    assert [layer.sliding_window for layer in pair.layers()] == [8, 8, 8]


@pytest.mark.parametrize(
    ("types", "shared", "role", "expected"),
    [
        (([S] * 4 + [F]) * 7, 20, "target", (([S] * 4 + [F]) * 2, 5)),
        ([F] * 36, 0, "target", ([F] * 4, 0)),
        ([F] * 28, 0, "draft", ([F] * 2, 0)),
        ([F] * 3 + [S] * 5, 0, "target", ([F, F, S, S], 0)),
        ([S, S, S, F], 4, "draft", ([S, S, S, F], 4)),
    ],
    ids=["gemma4-e2b", "uniform-target", "uniform-draft", "qwen-max-window", "short"],
)
def test_tiny_layer_types(types, shared, role, expected):
    assert tiny_layer_types(types, shared, role) == expected


def test_kv_sharing_over_an_irregular_pattern_is_refused():
    with pytest.raises(ValueError, match="num_kv_shared_layers"):
        tiny_layer_types([S] * 4 + [F] + [S] * 3 + [F, F], 4, "target")


def _write(path: Path, config: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def _qwen3(**fields) -> dict:
    return {
        **json.loads((REGRESSION / "qwen3-window-target" / "config.json").read_text()),
        **fields,
    }


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
            "rope_scaling.rope_type",
        ),
        ({"hidden_act": "relu2"}, "hidden_act"),
        ({"layer_types": [F, "chunked_attention"]}, "layer_types[1]"),
        ({"model_type": "gpt2"}, "model_type"),
        ({"model_type": "no_such_model"}, "model_type"),
    ],
    ids=["rope-yarn", "activation", "attention-variant", "no-engine-model", "unknown-type"],
)
def test_unimplemented_field_is_an_error_naming_it(tmp_path, fields, named):
    target = _write(tmp_path / "t" / "config.json", _qwen3(**fields))
    draft = REGRESSION / "qwen3-window-draft" / "config.json"
    with pytest.raises(PairConfigError) as error:
        pair_from_configs("x", target, draft, "draft_model")
    assert str(target) in str(error.value) and named in str(error.value)


def test_gemma4_target_needs_its_assistant_and_mtp():
    with pytest.raises(PairConfigError, match=r"model_type.*gemma4_assistant"):
        pair_from_configs(
            "x",
            SHIPPED / "gemma-4-E2B-it" / "config.json",
            SHIPPED / "Llama-3.2-1B" / "config.json",
            "mtp",
        )
    with pytest.raises(PairConfigError, match="method: a gemma4 pair drafts with mtp"):
        pair_from_configs(
            "x",
            SHIPPED / "gemma-4-E2B-it" / "config.json",
            SHIPPED / "gemma-4-E2B-it-assistant" / "config.json",
            "eagle",
        )


def _pairs_file(tmp_path: Path, entries: list[dict]) -> Path:
    path = tmp_path / "pairs.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"pairs": entries}))
    return path


def _entry(**fields) -> dict:
    base = {
        "name": "mine",
        "target": str(REGRESSION / "qwen3-window-target" / "config.json"),
        "draft": str(REGRESSION / "qwen3-window-draft" / "config.json"),
        "method": "draft_model",
    }
    return {**base, **fields}


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([_entry(target="missing/config.json")], "pairs[0].target:"),
        ([_entry(method="medusa")], "pairs[0]: method: 'medusa'"),
        ([_entry(), _entry()], "pairs[1].name: 'mine' is already defined"),
        ([_entry(name="gemma4-e2b-mtp")], "pairs[0].name: 'gemma4-e2b-mtp' is already defined"),
        ([_entry(window=3)], "pairs[0].window: unknown field"),
        ([{"name": "x"}], "pairs[0].target: missing"),
        ([_entry(draft_kv="")], "pairs[0].draft_kv: empty"),
        ([_entry(backend="")], "pairs[0].backend: empty"),
        ([_entry(description=None)], "pairs[0].description: empty"),
        ([_entry(method="")], "pairs[0].method: missing"),
    ],
    ids=[
        "missing-path",
        "unknown-method",
        "duplicate",
        "registered-name",
        "unknown-key",
        "no-target",
        "empty-draft-kv",
        "empty-backend",
        "empty-description",
        "empty-method",
    ],
)
def test_bad_pairs_file_names_file_entry_and_field(tmp_path, entries, expected):
    path = _pairs_file(tmp_path, entries)
    with pytest.raises(PairsFileError) as error:
        load_pairs_file(path)
    assert str(error.value).startswith(str(path)) and expected in str(error.value)


def test_config_transformers_cannot_read(tmp_path):
    assistant = json.loads((SHIPPED / "gemma-4-E2B-it-assistant" / "config.json").read_text())
    assistant["text_config"]["hidden_size_per_layer_input"] = 256  # the assistant must have 0
    draft = _write(tmp_path / "a" / "config.json", assistant)
    target = str(SHIPPED / "gemma-4-E2B-it" / "config.json")
    path = _pairs_file(tmp_path, [_entry(target=target, draft=str(draft), method="mtp")])
    with pytest.raises(PairsFileError) as error:
        load_pairs_file(path)
    assert str(draft) in str(error.value) and "transformers cannot read it" in str(error.value)


def test_qwen3_next_from_configs_keeps_state_and_attention_layers(tmp_path):
    """Linear-attention (state) layers come from ``layer_types`` like attention layers."""
    from attngroup.reference_engine.model_pairs import get_model_pair

    registered = get_model_pair("qwen3-next-mtp")
    paths = []
    for role, config in (("t", registered.target_config()), ("d", registered.draft_config())):
        paths.append(_write(tmp_path / role / "config.json", json.loads(config.to_json_string())))
    pair = pair_from_configs("qn", *paths, "mtp")
    assert _signatures(pair.layers()) == _signatures(registered.layers())
    assert [layer.kind for layer in pair.layers()] == [
        layer.kind for layer in registered.layers()[4:]
    ]


def test_config_checks_know_the_engines_activations():
    from attngroup.reference_engine.models.common import ACTIVATIONS
    from attngroup.reference_engine.pairs.pair_configs import ENGINE_ACTIVATIONS

    assert set(ENGINE_ACTIVATIONS) == set(ACTIVATIONS)
