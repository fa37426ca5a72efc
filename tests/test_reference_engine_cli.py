"""The reference engine's command line: `python -m attngroup.reference_engine inspect`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attngroup.reference_engine.__main__ import main
from attngroup.reference_engine.model_pairs import MODEL_PAIRS

pytestmark = pytest.mark.grouping

MIXED_MESSAGE = (
    "AssertionError: All layers in one attention group must share num_heads; got {8, 4} for ["
)


def test_inspect_legacy_shows_the_collision_and_vllms_error(capsys):
    assert main(["inspect", "gemma4-e2b-mtp", "--policy", "legacy"]) == 1
    out = capsys.readouterr().out
    assert "8+4 q heads  <-- COLLISION" in out
    assert f"error: {MIXED_MESSAGE}'model.layers.3.self_attn.attn'" in out
    assert "'draft_model.layers.0.self_attn.attn'" in out


def test_inspect_split_puts_draft_layers_in_groups_of_their_own(capsys):
    assert main(["inspect", "gemma4-e2b-mtp", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (
        report["error"] is None
        and report["pair"] == "gemma4-e2b-mtp"
        and report["policy"] == "split"
    )
    shared = [
        g
        for g in report["kv_cache_groups"]
        if any(n.startswith("draft_model") for n in g["layers"])
    ]
    assert len(shared) == 2, "the assistant reads the last sliding and the last full target layer"
    for kv_group in shared:
        assert any(n.startswith("model.") for n in kv_group["layers"]), (
            "draft pages are the target's pages"
        )
        heads = {}
        for attn in kv_group["attention_groups"]:
            kinds = {n.split(".")[0] for n in attn["layers"]}
            assert len(kinds) == 1, f"draft and target layers share a group: {attn['layers']}"
            heads[kinds.pop()] = attn["num_heads_q"]
        assert heads == {"model": 8, "draft_model": 4}


def test_inspect_json_schema_under_legacy(capsys):
    assert main(["inspect", "gemma4-e4b-mtp", "--policy", "legacy", "--tp", "2", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"pair", "tp", "policy", "kv_cache_groups", "error"}
    assert report["tp"] == 2
    assert report["error"].startswith(
        "AssertionError: All layers in one attention group must share num_heads; got {"
    )
    for kv_group in report["kv_cache_groups"]:
        assert {"spec", "layers", "attention_groups"} <= set(kv_group)
        for attn in kv_group["attention_groups"]:
            assert {"backend", "num_heads_q", "layers"} <= set(attn)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["inspect", "gemma5"], "unknown model pair 'gemma5'", id="unknown-pair"),
        pytest.param(
            ["inspect", "gemma4-e2b-mtp", "--tp", "3"], "do not divide over tp=3", id="bad-tp"
        ),
    ],
)
def test_inspect_bad_input_exits_2_with_a_clear_error(argv, message):
    result = subprocess.run(
        [sys.executable, "-m", "attngroup.reference_engine", *argv], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


def test_pairs_lists_every_pair(capsys):
    assert main(["pairs"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == list(MODEL_PAIRS)


def test_pairs_details_show_the_head_mix_and_tp_sizes(capsys):
    assert main(["pairs", "--details"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "mixed q heads  tp 1,2,4 " in lines["gemma4-e2b-mtp"]
    assert "uniform" in lines["llama3-eagle"]
