"""Grouping conformance over every model pair x grouping policy x TP size.

The engine under test comes through the adapter seam (``--engine``). Its
native grouping must conform: every layer in one KV-cache group and one
attention group, groups homogeneous in backend, spec and query heads,
minimal, KV-sharing layers with their targets, builders sized for their
layers. The reference engine's LEGACY policy (vLLM before PR #43543) must
instead fail loudly on mixed-Q-head pairs with vLLM's exact message, and pass
on uniform pairs: that proves the suite catches the bug.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attngroup.reference_engine.model_pairs import MODEL_PAIRS, get_model_pair
from attngroup.suites.engines.base import GroupingOutcome
from attngroup.suites.engines.dump import all_outcomes_as_json
from attngroup.suites.grouping.checks import (
    check_builder_heads,
    check_homogeneity,
    check_kv_sharing,
    check_minimality,
    check_partition,
    check_started,
    expected_mixed_heads_error,
)

pytestmark = pytest.mark.grouping

PAIR_TP = [
    pytest.param(name, tp, id=f"{name}-tp{tp}", marks=[pytest.mark.mtp] if pair.is_mtp else [])
    for name, pair in MODEL_PAIRS.items()
    for tp in pair.supported_tp_sizes
]
PAIRS = [
    pytest.param(name, id=name, marks=[pytest.mark.mtp] if pair.is_mtp else [])
    for name, pair in MODEL_PAIRS.items()
]
MIXED_PAIRS = [
    param for param, pair in zip(PAIRS, MODEL_PAIRS.values(), strict=True) if pair.is_mixed
]

_OUTCOMES: dict[tuple, GroupingOutcome] = {}


@pytest.fixture
def outcome(engine, pair_name: str, tp: int, policy: str) -> GroupingOutcome:
    key = (engine.name, pair_name, tp, policy)
    if key not in _OUTCOMES:
        pair = get_model_pair(pair_name)
        _OUTCOMES[key] = engine.setup(pair.layers(tp), policy, pair=pair)
    return _OUTCOMES[key]


@pytest.mark.parametrize(("pair_name", "tp"), PAIR_TP)
def test_every_layer_in_exactly_one_group(outcome, pair_name, tp, policy):
    assert check_partition(outcome, get_model_pair(pair_name).layers(tp)) == []


@pytest.mark.parametrize(("pair_name", "tp"), PAIR_TP)
def test_attention_groups_are_minimal(outcome, pair_name, tp, policy):
    assert check_minimality(outcome) == []


@pytest.mark.parametrize(("pair_name", "tp"), PAIR_TP)
def test_kv_sharing_layers_join_their_target_group(outcome, pair_name, tp, policy):
    assert check_kv_sharing(outcome, get_model_pair(pair_name).layers(tp)) == []


@pytest.mark.parametrize(("pair_name", "tp"), PAIR_TP)
def test_query_heads_uniform_in_every_group(engine, outcome, pair_name, tp, policy):
    """The check users care about: no builder serves layers of two head counts."""
    pair = get_model_pair(pair_name)
    layers = pair.layers(tp)
    violations = (
        check_started(outcome)
        + check_homogeneity(outcome, layers)
        + check_builder_heads(outcome, layers)
    )
    if engine.expects_conformance(policy, pair.is_mixed):
        assert violations == []
    else:
        # A deliberately broken policy must fail loudly, exactly as vLLM did.
        assert check_homogeneity(outcome, layers), "the suite must see the mixed group itself"
        assert outcome.error == expected_mixed_heads_error(outcome, layers)


@pytest.mark.parametrize("pair_name", MIXED_PAIRS)
def test_draft_layers_get_attention_groups_of_their_own(engine, pair_name):
    """Draft layers with fewer query heads share the target's KV-cache groups
    (same pages) yet never the target's attention groups."""
    pair = get_model_pair(pair_name)
    layers = pair.layers()
    outcome = engine.setup(layers, engine.policies[0])
    roles = pair.layer_roles()
    draft, target = set(roles["draft"]), set(roles["target"])
    for per_kv in outcome.attention_groups:
        for group in per_kv:
            names = set(group.layer_names)
            assert not (names & draft and names & target), (
                f"draft and target share {group.layer_names}"
            )
    if roles["kv_shared"]:
        shared_groups = [g for g in outcome.kv_cache_groups if set(g.layer_names) & draft]
        assert shared_groups and all(set(g.layer_names) & target for g in shared_groups)


@pytest.mark.parametrize("pair_name", PAIRS)
def test_legacy_grouping_crashes_like_vllm(engine, pair_name):
    """LEGACY (backend + spec only) reproduces vLLM's start-up crash on
    mixed pairs and is harmless on uniform ones."""
    if "legacy" not in engine.policies:
        pytest.skip(
            f"engine {engine.name} has no LEGACY policy; its native grouping is judged above"
        )
    pair = get_model_pair(pair_name)
    outcome = engine.setup(pair.layers(), "legacy")
    if pair.is_mixed:
        assert outcome.error is not None
        assert outcome.error.startswith(
            "AssertionError: All layers in one attention group must share num_heads; got "
        )
        assert outcome.error == expected_mixed_heads_error(outcome, pair.layers())
    else:
        assert outcome.error is None
        assert check_homogeneity(outcome, pair.layers()) == []


def grouping_outcomes_in_fresh_process(
    engine_name: str, seed: str, output: Path, env: dict[str, str] | None = None
) -> tuple[str, str]:
    """(the outcomes ``attngroup.suites.engines.dump`` wrote to ``output``, the process's stdout),
    from a fresh interpreter with ``PYTHONHASHSEED=seed``."""
    result = subprocess.run(
        [sys.executable, "-m", "attngroup.suites.engines.dump", engine_name, str(output)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {}), "PYTHONHASHSEED": seed},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return output.read_text(encoding="utf-8").rstrip("\n"), result.stdout


def test_grouping_is_deterministic_across_hash_seeds(engine, tmp_path):
    """Same groups in the same order, for every pair, TP size and policy, in
    fresh processes with other hash seeds as in this one. The grouping output is
    compared, never the process's stdout, where an engine may log."""
    outputs = {all_outcomes_as_json(engine)}
    for seed in ("0", "12345"):
        outcomes, _ = grouping_outcomes_in_fresh_process(
            engine.name, seed, tmp_path / f"seed-{seed}.jsonl"
        )
        outputs.add(outcomes)
    assert len(outputs) == 1


NOISY_SITECUSTOMIZE = """
import atexit, logging, sys, time

def _log(message):
    stamp = time.strftime("%m-%d %H:%M:%S") + f".{time.time_ns() % 10**9:09d}"
    print(f"WARNING {stamp} [noisy.py:1] {message}", flush=True)

_log("engine starting")
atexit.register(_log, "engine shutting down")
"""


def test_determinism_check_ignores_the_engines_own_log_lines(engine, tmp_path):
    """An engine that prints timestamped warnings to stdout (vLLM 0.22.1 and 0.24.0
    do) still compares equal across runs: stdout differs, the grouping output does not."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NOISY_SITECUSTOMIZE, encoding="utf-8")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    runs = [
        grouping_outcomes_in_fresh_process(engine.name, seed, tmp_path / f"{seed}.jsonl", env)
        for seed in ("0", "12345")
    ]
    (first_outcomes, first_stdout), (second_outcomes, second_stdout) = runs
    assert "WARNING" in first_stdout and first_stdout != second_stdout, "the engine did not log"
    assert first_outcomes == second_outcomes == all_outcomes_as_json(engine)
