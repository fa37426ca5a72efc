"""The vLLM adapter against stand-in releases (``fake_vllm``), without vLLM installed.

One regression test per adapter defect once found on a real release: no runner rule read
where the release keeps it in an environment switch (0.21), a config judged on V2 that the
switched release refuses at start-up (0.20, 0.21), a state spec's backend named by a string
(0.20), grouping before the
engine core resolved the KV-cache layout (0.29), judging V1 where vLLM's rule picks V2
(0.26-0.33), passing ``draft_layer_names`` where ``init_attn_backend`` does not take it
(before 0.33), stand-in layers that are not the concrete ``Attention`` a release looks
KV-sharing layers up by (0.26-0.33), and adapter failures reported as vLLM verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attngroup.reference_engine.model_pairs import get_model_pair
from attngroup.suites.engines.base import AdapterError
from tests.engines.fake_vllm import RELEASE_SHAPES, ReleaseShape, forget_vllm, write_fake_vllm

SHAPES = {shape.name: shape for shape in RELEASE_SHAPES}
GEMMA = "gemma4-e2b-mtp"  # KV-sharing layers, a draft with fewer query heads
QWEN_DRAFT = "qwen3-8b-draft-1.7b"  # a separate draft model


@pytest.fixture
def release(request, tmp_path, monkeypatch):
    """The stand-in vLLM of one release shape, importable as ``vllm``; yields its call log."""
    shape: ReleaseShape = SHAPES[request.param]
    write_fake_vllm(tmp_path, shape)
    forget_vllm()
    monkeypatch.syspath_prepend(str(tmp_path))
    from attngroup.suites.engines import vllm_standins

    vllm_standins.stand_in_layer_classes.cache_clear()
    vllm_standins._named_subclass.cache_clear()
    import vllm

    yield shape, vllm.CALLS
    forget_vllm()
    vllm_standins.stand_in_layer_classes.cache_clear()
    vllm_standins._named_subclass.cache_clear()


def _adapter(runner: str = "auto"):
    from attngroup.suites.engines.vllm_adapter import VllmEngineAdapter

    return VllmEngineAdapter(runner=runner)


def _setup(pair_name: str, runner: str = "auto"):
    pair = get_model_pair(pair_name)
    return _adapter(runner).setup(pair.layers(1), "native", pair=pair)


@pytest.mark.parametrize("release", ["0.29", "0.33", "0.34"], indirect=True)
def test_the_layout_is_resolved_before_grouping_where_the_core_does(release):
    shape, calls = release
    outcome = _setup(GEMMA)
    assert outcome.error is None
    grouping = "get_global_kv_cache_groups" if shape.global_groups else "get_kv_cache_groups"
    assert calls[:3] == ["get_supported_kv_cache_layouts", "resolve_kv_cache_layout", grouping]


@pytest.mark.parametrize("release", ["0.22"], indirect=True)
def test_a_core_without_layout_resolution_groups_directly(release):
    _, calls = release
    assert _setup(GEMMA).error is None
    assert calls[0] == "get_kv_cache_groups"


@pytest.mark.parametrize(
    ("release", "pair_name", "runner"),
    [
        ("0.21", GEMMA, "v1"),  # 0.21's rule: V2 only with VLLM_USE_V2_MODEL_RUNNER=1
        ("0.22", GEMMA, "v1"),  # 0.22's rule: V2 only for Qwen3 architectures
        ("0.22", QWEN_DRAFT, "v2"),
        ("0.29", GEMMA, "v2"),  # V2 by default
        ("0.33", GEMMA, "v2"),
        ("0.34", GEMMA, "v2"),  # the only runner left
    ],
    indirect=["release"],
)
def test_auto_judges_the_runner_vllms_rule_picks(release, pair_name, runner):
    assert _setup(pair_name).runner == runner


@pytest.mark.parametrize("release", ["0.21"], indirect=True)
def test_auto_follows_the_v2_switch_where_the_release_reads_one(release, monkeypatch):
    """0.21's worker picks its runner by the ``VLLM_USE_V2_MODEL_RUNNER`` switch (no
    ``VllmConfig.use_v2_model_runner`` yet): auto judges the runner it names."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert _setup(GEMMA).runner == "v2"


@pytest.mark.parametrize("release", ["0.21"], indirect=True)
def test_a_config_the_switched_release_refuses_is_unavailable(release, monkeypatch):
    """With the switch on, 0.20 and 0.21 check what V2 does not yet support when the config
    is made (a separate draft model among it) and refuse to start: no runner judges the
    pair, so it is unavailable, with vLLM's reason, not a verdict of either runner."""
    from attngroup.suites.engines.vllm_startup import RunnerUnavailableError

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(RunnerUnavailableError, match="speculative method 'draft_model'"):
        _setup(QWEN_DRAFT)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    assert _setup(QWEN_DRAFT).runner == "v1"


@pytest.mark.parametrize("release", ["0.21"], indirect=True)
def test_a_state_spec_gets_its_backend_by_name_or_by_enum(release):
    """A state spec names its backend by a string that vLLM's selector resolves (0.20), or
    carries an enum member that names its class (0.21+)."""
    from types import SimpleNamespace

    from vllm.v1.attention.selector import Mamba2AttentionBackend

    from attngroup.suites.engines.vllm_standins import state_backend

    assert state_backend(SimpleNamespace(mamba_type="mamba2")) is Mamba2AttentionBackend
    member = SimpleNamespace(get_class=lambda: Mamba2AttentionBackend)
    assert state_backend(SimpleNamespace(mamba_type=member)) is Mamba2AttentionBackend


@pytest.mark.parametrize("release", ["0.21", "0.22", "0.29", "0.33"], indirect=True)
@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_either_runner_can_be_forced_and_finds_the_shared_layers(release, runner):
    _, calls = release
    outcome = _setup(GEMMA, runner)
    assert outcome.runner == runner and outcome.error is None
    grouped = {name for row in outcome.attention_groups for g in row for name in g.layer_names}
    shared = {layer.name for layer in get_model_pair(GEMMA).layers(1) if layer.kv_sharing_target}
    assert shared and shared <= grouped  # looked up by the concrete Attention class in V2
    assert (
        f"{runner} " + ("initialize_attn_backend" if runner == "v1" else "init_attn_backend")
        in calls
    )


@pytest.mark.parametrize("release", ["0.34"], indirect=True)
def test_a_removed_runner_is_unavailable_not_an_error(release):
    from attngroup.suites.engines.vllm_startup import RunnerUnavailableError

    with pytest.raises(RunnerUnavailableError, match="no V1 GPUModelRunner"):
        _setup(GEMMA, "v1")


@pytest.mark.parametrize(
    ("release", "expected"),
    [("0.29", None), ("0.33", "draft_layer_names=['draft_model.")],
    indirect=["release"],
)
def test_draft_layer_names_go_only_where_init_attn_backend_takes_them(release, expected):
    _, calls = release
    assert _setup(QWEN_DRAFT, "v2").error is None
    passed = [call for call in calls if call.startswith("draft_layer_names=")]
    if expected is None:
        assert passed == []
    else:
        assert len(passed) == 1 and passed[0].startswith(expected)


@pytest.mark.parametrize("release", ["0.33"], indirect=True)
def test_only_a_separate_draft_model_passes_its_layer_names(release):
    _, calls = release
    _setup(GEMMA, "v2")  # MTP: the V2 runner passes none
    assert "draft_layer_names=[]" in calls


@pytest.mark.parametrize("release", ["0.22"], indirect=True)
def test_vllms_own_error_is_a_verdict_citing_the_vllm_line(release):
    import vllm.v1.worker.utils as utils

    utils.KEY_ON_HEADS = False  # the draft's 4-head layers join the 8-head ones
    outcome = _setup(GEMMA, "v1")
    assert outcome.error.startswith("AssertionError: All layers in one attention group must share")
    line = next(
        i
        for i, text in enumerate(Path(utils.__file__).read_text().splitlines(), 1)
        if "assert len(heads) == 1" in text
    )
    assert outcome.error.endswith(f"(vllm/v1/worker/utils.py:{line})")


@pytest.mark.parametrize("release", ["0.33"], indirect=True)
def test_a_planted_adapter_error_is_an_adapter_error_not_a_verdict(release, monkeypatch):
    from attngroup.suites.engines import vllm_startup

    def broken(self, vllm_config, kv_cache_config, device):
        raise KeyError("the adapter lost a layer")

    monkeypatch.setattr(vllm_startup.StartUp, "_start_v1", broken)
    with pytest.raises(
        AdapterError, match="adapter error in attention grouping: KeyError"
    ) as caught:
        _setup(GEMMA, "v1")
    assert any("vllm_startup.py" in frame for frame in caught.value.frames)


@pytest.mark.parametrize("release", ["0.33"], indirect=True)
def test_vllm_reading_what_a_stand_in_lacks_is_an_adapter_error(release, monkeypatch):
    import vllm.v1.worker.utils as utils

    def reads_more(vllm_config, kv_cache_config):
        layer = next(iter(vllm_config.compilation_config.static_forward_context.values()))
        return layer.rotary_emb  # the stand-in has no such attribute

    monkeypatch.setattr("vllm.v1.worker.gpu.attn_utils.attention_groups", reads_more)
    assert utils  # the module the release reads from
    with pytest.raises(AdapterError, match="StandInAttention"):
        _setup(GEMMA, "v2")


@pytest.mark.parametrize("release", ["0.33"], indirect=True)
def test_the_verdict_file_says_adapter_error_and_exits_3(release, monkeypatch, tmp_path):
    from attngroup.suites.engines import vllm_startup
    from attngroup.suites.grouping import vllm_verdicts

    def broken(self, *args):
        raise TypeError("init_attn_backend() got an unexpected keyword argument 'x'")

    monkeypatch.setattr(vllm_startup.StartUp, "start_runner", broken)
    out = tmp_path / "verdicts.json"
    assert vllm_verdicts.main(["run", str(out)]) == vllm_verdicts.ADAPTER_ERROR_EXIT
    pairs = json.loads(out.read_text())["pairs"]
    assert {v["verdict"] for v in pairs.values()} == {"adapter error"}
    assert pairs[GEMMA]["frames"] and "TypeError" in pairs[GEMMA]["message"]


@pytest.mark.parametrize("switch", ["1", "0"], ids=["v2-switched-on", "switched-off"])
def test_the_suite_skips_a_config_the_release_refuses(tmp_path, switch):
    """The grouping suite against stand-in 0.21: switched to V2, the separate-draft pair is
    skipped with vLLM's reason (no runner judges it); switched off, V1 judges it."""
    import os
    import subprocess

    from tests.pytest_subprocess import PYTEST, python_path

    write_fake_vllm(tmp_path, SHAPES["0.21"])
    repo = Path(__file__).resolve().parents[2]
    environment = dict(os.environ) | {
        "PYTHONPATH": python_path(tmp_path, repo),  # the stand-in first
        "VLLM_USE_V2_MODEL_RUNNER": switch,
    }
    done = subprocess.run(
        [*PYTEST, "attngroup/suites/grouping/test_grouping_conformance.py", "--engine", "vllm",
         "-k", f"{QWEN_DRAFT} and tp1", "-rs"],
        cwd=repo, env=environment, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    refused = "does not run this configuration: VLLM_USE_V2_MODEL_RUNNER=1 and vLLM refuses"
    if switch == "1":
        assert done.returncode == 0, done.stdout + done.stderr
        assert refused in done.stdout and "speculative method 'draft_model'" in done.stdout
        assert " passed" not in done.stdout and " failed" not in done.stdout
    else:
        assert refused not in done.stdout
        assert " passed" in done.stdout or " failed" in done.stdout, done.stdout
