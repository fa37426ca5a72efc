"""The vLLM adapter's own tests.

The pure parts (state-page padding, input refusal, verdict table) run
everywhere; the parts that drive vLLM's code skip with a reason where vLLM is
not installed (``nox -s vllm_conformance`` installs it).
"""

from __future__ import annotations

import json

import pytest
import torch

from attngroup.reference_engine.kv_cache_spec import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from attngroup.reference_engine.model_pairs import get_model_pair
from attngroup.suites.engines.vllm_adapter import (
    _refuse_shared_layers_with_specs,
    has_module,
    pad_state_pages,
)
from attngroup.suites.grouping.vllm_timeline import main, markdown_table

needs_vllm = pytest.mark.skipif(
    not has_module("vllm"), reason="vLLM is not installed (nox -s vllm_conformance installs it)"
)

FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
STATE = MambaSpec(block_size=16, shapes=((4, 64),), dtypes=(torch.float32,))


def test_state_pages_are_padded_to_the_attention_page():
    padded = pad_state_pages({"attn": FULL, "state": STATE})
    assert padded["state"].page_size_bytes == FULL.page_size_bytes
    assert padded["attn"] == FULL


def test_a_state_larger_than_the_attention_page_is_refused():
    big = MambaSpec(block_size=16, shapes=((64, 1024),), dtypes=(torch.float32,))
    with pytest.raises(ValueError, match=r"layer state: its state \(262144 bytes\) exceeds"):
        pad_state_pages({"attn": FULL, "state": big})


def test_a_shared_layer_with_its_own_spec_is_refused():
    with pytest.raises(ValueError, match=r"\['layer_2'\] both share"):
        _refuse_shared_layers_with_specs({"layer_1": FULL, "layer_2": FULL}, {"layer_2": "layer_1"})


def _verdicts(version: str, gemma: dict) -> dict:
    return {
        "vllm": version,
        "runner": "auto",
        "pairs": {"gemma4-e2b-mtp": gemma, "u": {"verdict": "pass", "runner": "v2"}},
    }


def test_table_orders_versions_numerically_and_names_the_first_failure():
    failing = {
        "verdict": "fail", "runner": "v1", "tp": 1, "check": "start-up",
        "message": "got {8, 4} | x", "source": "vllm/v1/worker/utils.py:12",
    }  # fmt: skip
    table = markdown_table(
        [_verdicts("0.34.0", {"verdict": "pass", "runner": "v2"}), _verdicts("0.4.0", failing)]
    ).splitlines()
    assert table[0] == "| pair | vLLM 0.4.0 | vLLM 0.34.0 |"
    assert table[2] == (
        "| gemma4-e2b-mtp | **fail** (v1, tp1, start-up): `got {8, 4} \\| x` "
        "[vllm/v1/worker/utils.py:12] | ▶ pass (v2) (#43543) |"
    )
    assert table[3] == "| u | pass (v2) | pass (v2) |"


def test_table_cli_refuses_a_foreign_file_with_exit_code_2(tmp_path, capsys):
    foreign = tmp_path / "x.json"
    foreign.write_text(json.dumps({"tests": []}))
    assert main(["render", str(foreign), "--out", str(tmp_path / "out")]) == 2
    assert "expected keys vllm, runner, pairs" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def adapter():
    from attngroup.suites.engines.vllm_adapter import VllmEngineAdapter

    return VllmEngineAdapter()


@needs_vllm
@pytest.mark.parametrize(
    "spec",
    [FULL, SlidingWindowSpec(16, 1, 256, torch.bfloat16, sliding_window=32), STATE],
    ids=["full", "sliding", "mamba"],
)
def test_specs_convert_both_ways_exactly(spec):
    from attngroup.suites.engines.vllm_specs import from_vllm_spec, to_vllm_spec

    assert from_vllm_spec(to_vllm_spec(spec)) == spec


@needs_vllm
def test_a_padded_attention_page_is_refused_not_dropped():
    import dataclasses

    from attngroup.suites.engines.vllm_specs import (
        UnrepresentableSpecError,
        from_vllm_spec,
        to_vllm_spec,
    )

    padded = dataclasses.replace(to_vllm_spec(FULL), page_size_padded=10**6)
    with pytest.raises(UnrepresentableSpecError, match="page_size_padded=1000000"):
        from_vllm_spec(padded)


@needs_vllm
def test_gemma4_mtp_verdict_matches_the_installed_vllm(adapter):
    """The three known behaviours, told apart by what the version contains:
    no Q-head key (0.22.x: strict check crashes), key without the helper
    (0.24: model-wide builder count), key and helper (0.34)."""
    import vllm.v1.attention.backends.utils as backend_utils

    outcome = adapter.setup(get_model_pair("gemma4-e2b-mtp").layers(1), "native")
    draft_groups = [
        g for row in outcome.attention_groups for g in row if g.layer_names[0].startswith("draft")
    ]
    if outcome.error is not None:
        assert outcome.error.startswith(
            "AssertionError: All layers in one attention group must share num_heads; got {8, 4}"
        )
    elif hasattr(backend_utils, "get_num_attention_heads_from_layers"):
        assert {(g.num_heads_q, g.builder_num_heads) for g in draft_groups} == {(4, 4)}
    else:
        assert {(g.num_heads_q, g.builder_num_heads) for g in draft_groups} == {(4, 8)}


def test_timeline_page_shows_adapter_errors_in_their_own_state_and_links_the_pr(tmp_path):
    from attngroup.suites.grouping.vllm_timeline import has_adapter_errors, html_page

    broken = {
        "verdict": "adapter error", "runner": "v2", "tp": 1,
        "message": "adapter error in attention grouping: TypeError: <x>", "frames": ["File a.py"],
    }  # fmt: skip
    builder = {
        "verdict": "fail", "runner": "v1", "tp": 1, "check": "builder heads",
        "message": "4 vs 8", "source": "vllm/v1/attention/backends/triton_attn.py:90",
    }  # fmt: skip
    sets = [
        _verdicts("0.23.0", {"verdict": "pass", "runner": "v1"}),
        _verdicts("0.24.0", builder),
        _verdicts("0.25.1", broken),
    ]
    page = html_page(sets)
    assert '<td class="fail changed">' in page and "pull/43241" in page
    assert '<td class="adapter-error changed">' in page and "TypeError: &lt;x&gt;" in page
    assert "triton_attn.py:90" in page
    assert has_adapter_errors(sets) and not has_adapter_errors(sets[:2])


def test_an_unavailable_cell_says_why_the_release_has_no_runner_for_the_pair():
    """A release that refuses a config on the runner its switch names, or lacks the runner
    asked for: the cell says so with vLLM's reason, in the table and on the page."""
    from attngroup.suites.grouping.vllm_timeline import html_page

    refused = {
        "verdict": "unavailable", "runner": "auto",
        "message": "VLLM_USE_V2_MODEL_RUNNER does not yet support: hybrid/mamba models",
    }  # fmt: skip
    sets = [_verdicts("0.21.0", refused)]
    assert "unavailable (auto): `VLLM_USE_V2_MODEL_RUNNER does not yet support: hybrid" in (
        markdown_table(sets)
    )
    assert "<div class=detail>VLLM_USE_V2_MODEL_RUNNER does not yet support" in html_page(sets)
