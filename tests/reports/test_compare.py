"""Comparison of a run against a baseline: test status lists, flaky tests, metric verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attngroup.reports.compare import TEST_LISTS, Comparison, ThresholdPolicy, compare_runs
from attngroup.reports.render.summary import format_summary
from attngroup.reports.selection import selection_from_json
from tests.reports.records import make_metric, make_run, make_test, noisy_samples

ROOT = Path(__file__).resolve().parents[2]

GROUPING = "attngroup/suites/grouping/test_groups.py::test_groups[gemma4-e2b-mtp-triton-fp32-tp1]"
SPEC = "attngroup/suites/spec_decode/test_spec.py::test_greedy[gemma4-e2b-mtp-triton-fp32-tp1]"


def lists_containing(comparison: Comparison, nodeid: str) -> set[str]:
    return {name for name in TEST_LISTS if nodeid in {c.nodeid for c in getattr(comparison, name)}}


def test_planted_regression_flags_new_failure_and_slower_metric():
    baseline = make_run(
        make_test(GROUPING),
        make_test(SPEC),
        metrics=(make_metric(noisy_samples(1.0, 0.02, 15, seed=1)),),
        run_id="baseline",
    )
    current = make_run(
        make_test(GROUPING, "failed", message="AssertionError: builder sized for 8 heads got 4"),
        make_test(SPEC),
        metrics=(make_metric(noisy_samples(1.2, 0.02, 15, seed=2)),),
    )
    comparison = compare_runs(current, baseline)
    assert [c.nodeid for c in comparison.new_failures] == [GROUPING]
    assert comparison.new_failures[0].baseline_outcome == "passed"
    [regression] = comparison.metric_regressions
    assert regression.change == pytest.approx(0.2, abs=0.03)
    assert regression.significant is True
    assert regression.method == "Mann-Whitney U"
    assert regression.p_value < 0.01
    assert comparison.has_regression


def test_one_percent_change_inside_noise_is_not_flagged():
    baseline = make_run(metrics=(make_metric(noisy_samples(1.0, 0.02, 15, seed=3)),), run_id="b")
    current = make_run(metrics=(make_metric(noisy_samples(1.01, 0.02, 15, seed=4)),))
    comparison = compare_runs(current, baseline)
    [change] = comparison.metrics
    assert abs(change.change) < 0.05
    assert change.verdict == "unchanged"
    assert not comparison.has_regression


def test_large_change_drowned_in_noise_is_within_noise():
    """20 % slower by the medians, but three wildly scattered samples cannot show it."""
    baseline = make_run(metrics=(make_metric((0.5, 1.0, 1.6)),), run_id="b")
    current = make_run(metrics=(make_metric((0.55, 1.2, 1.9)),))
    [change] = compare_runs(current, baseline).metrics
    assert change.change == pytest.approx(0.2)
    assert change.method == "bootstrap median ratio"
    assert change.significant is False
    assert change.verdict == "within noise"


@pytest.mark.parametrize(
    ("before", "after", "unit", "higher_is_better", "verdict"),
    [
        pytest.param(1.0, 1.2, "ms", False, "regression", id="latency-up-20pct"),
        pytest.param(1.0, 1.03, "ms", False, "unchanged", id="latency-up-3pct"),
        pytest.param(1.0, 0.8, "ms", False, "improvement", id="latency-down-20pct"),
        pytest.param(100.0, 80.0, "tokens/s", True, "regression", id="throughput-down-20pct"),
        pytest.param(100.0, 120.0, "tokens/s", True, "improvement", id="throughput-up-20pct"),
    ],
)
def test_metric_without_samples_judged_by_threshold_only(
    before, after, unit, higher_is_better, verdict
):
    baseline = make_run(
        metrics=(make_metric(value=before, unit=unit, higher_is_better=higher_is_better),),
        run_id="b",
    )
    current = make_run(
        metrics=(make_metric(value=after, unit=unit, higher_is_better=higher_is_better),)
    )
    [change] = compare_runs(current, baseline).metrics
    assert change.verdict == verdict
    assert change.significant is None
    assert change.method.startswith("threshold only")


@pytest.mark.parametrize(
    ("policy", "recorded_threshold", "verdict"),
    [
        pytest.param(ThresholdPolicy(), None, "regression", id="default-5pct"),
        pytest.param(ThresholdPolicy(), 0.25, "unchanged", id="recorded-25pct"),
        pytest.param(
            ThresholdPolicy(overrides=(("^decode", 0.3),)), None, "unchanged", id="cli-30pct"
        ),
        pytest.param(
            ThresholdPolicy(overrides=(("^prefill", 0.3),)),
            0.1,
            "regression",
            id="override-not-matching",
        ),
        pytest.param(
            ThresholdPolicy(overrides=(("^decode", 0.1),)),
            0.5,
            "regression",
            id="cli-10pct-beats-recorded-50pct",
        ),
        pytest.param(
            ThresholdPolicy(overrides=(("^decode", 0.5),)),
            0.1,
            "unchanged",
            id="cli-50pct-beats-recorded-10pct",
        ),
        pytest.param(ThresholdPolicy(default=0.5), 0.1, "regression", id="recorded-beats-default"),
        pytest.param(
            ThresholdPolicy(default=0.5, overrides=(("^decode", 0.1), ("decode", 0.5))),
            None,
            "regression",
            id="first-override-wins",
        ),
    ],
)
def test_per_metric_threshold(policy, recorded_threshold, verdict):
    baseline = make_run(metrics=(make_metric(value=1.0, threshold=recorded_threshold),), run_id="b")
    current = make_run(metrics=(make_metric(value=1.2, threshold=recorded_threshold),))
    [change] = compare_runs(current, baseline, thresholds=policy).metrics
    assert change.verdict == verdict


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        pytest.param("passed", "failed", {"new_failures"}, id="passed-to-failed"),
        pytest.param("skipped", "error", {"new_failures"}, id="skipped-to-error"),
        pytest.param(None, "failed", {"new_failures", "new_tests"}, id="new-failing-test"),
        pytest.param(None, "passed", {"new_tests"}, id="new-passing-test"),
        pytest.param("failed", "passed", {"fixed"}, id="fixed"),
        pytest.param("error", "xfailed", {"fixed"}, id="fixed-by-xfail"),
        pytest.param("failed", "error", {"still_failing"}, id="still-failing"),
        pytest.param("passed", None, {"removed_tests"}, id="removed"),
        pytest.param("passed", "deselected", {"not_selected"}, id="deselected"),
        pytest.param("passed", "skipped", {"skipped"}, id="skipped"),
        pytest.param("passed", "adapter_error", {"harness_errors"}, id="passed-to-harness-error"),
        pytest.param("failed", "adapter_error", {"harness_errors"}, id="failed-to-harness-error"),
        pytest.param(
            None, "adapter_error", {"harness_errors", "new_tests"}, id="new-harness-error"
        ),
        pytest.param("passed", "passed", set(), id="unchanged"),
    ],
)
def test_status_classification(before, after, expected):
    baseline = make_run(*([make_test(GROUPING, before)] if before else []), run_id="b")
    current = make_run(*([make_test(GROUPING, after)] if after else []))
    assert lists_containing(compare_runs(current, baseline), GROUPING) == expected


SELECTION = selection_from_json(
    {
        "base": "aaa",
        "head": "bbb",
        "run_all": False,
        "reason": "changed paths",
        "changed_files": ["attngroup/ci/areas/grouping.yaml"],
        "steps": [
            {
                "key": "grouping",
                "label": "Grouping",
                "selected": True,
                "why": ["attngroup/ci/areas/grouping.yaml"],
            },
            {"key": "spec-decode", "label": "Spec decode", "selected": False, "why": []},
        ],
    }
)


@pytest.mark.parametrize(
    ("selection", "step", "expected"),
    [
        pytest.param(SELECTION, "spec-decode", {"not_selected"}, id="step-not-selected"),
        pytest.param(SELECTION, "grouping", {"removed_tests"}, id="step-selected-but-missing"),
        pytest.param(None, "spec-decode", {"removed_tests"}, id="no-selection-context"),
        pytest.param(SELECTION, None, {"removed_tests"}, id="step-unknown"),
    ],
)
def test_missing_test_is_not_selected_only_when_ci_skipped_its_step(selection, step, expected):
    baseline = make_run(make_test(SPEC, step=step), run_id="b")
    comparison = compare_runs(make_run(), baseline, selection=selection)
    assert lists_containing(comparison, SPEC) == expected


def test_skipped_is_distinct_from_not_selected():
    baseline = make_run(make_test(SPEC, step="spec-decode"), make_test(GROUPING), run_id="b")
    current = make_run(make_test(GROUPING, "skipped", message="needs CUDA"))
    comparison = compare_runs(current, baseline, selection=SELECTION)
    assert [c.nodeid for c in comparison.skipped] == [GROUPING]
    assert comparison.skipped[0].message == "needs CUDA"
    assert [c.nodeid for c in comparison.not_selected] == [SPEC]


def test_flaky_from_reruns_in_this_run():
    current = make_run(make_test(GROUPING, "passed", attempts=("failed",)))
    comparison = compare_runs(current, make_run(make_test(GROUPING), run_id="b"))
    [flaky] = comparison.flaky
    assert flaky.nodeid == GROUPING
    assert "reruns" in flaky.flaky_reason


def history_of(*outcomes: str) -> list:
    return [
        make_run(
            make_test(GROUPING, outcome),
            run_id=f"h{index}",
            created_at=f"2026-11-{index + 10}T00:00:00",
        )
        for index, outcome in enumerate(outcomes)
    ]


@pytest.mark.parametrize(
    ("past", "now", "flaky"),
    [
        pytest.param(("passed", "failed", "passed"), "failed", True, id="flips-three-times"),
        pytest.param(("passed", "failed"), "passed", True, id="flips-twice"),
        pytest.param(("passed", "passed", "passed"), "failed", False, id="one-regression"),
        pytest.param(("failed", "failed"), "passed", False, id="one-fix"),
        pytest.param(("passed", "skipped", "passed"), "passed", False, id="skip-is-no-flip"),
    ],
)
def test_flaky_from_history(past, now, flaky):
    history = history_of(*past)
    comparison = compare_runs(make_run(make_test(GROUPING, now)), history[-1], history=history)
    assert bool(comparison.flaky) is flaky


def test_comparison_json_has_the_documented_keys():
    baseline = make_run(make_test(GROUPING), metrics=(make_metric(value=1.0),), run_id="b")
    current = make_run(make_test(GROUPING, "failed"), metrics=(make_metric(value=1.3),))
    document = compare_runs(current, baseline).to_json()
    schema = json.loads((ROOT / "schemas" / "reports-comparison.schema.json").read_text())
    assert set(document) == set(schema["required"])
    for key in (*TEST_LISTS, "metric_regressions", "metric_improvements", "warnings"):
        assert isinstance(document[key], list), key
    assert document["new_failures"][0]["nodeid"] == GROUPING
    [regression] = document["metric_regressions"]
    assert {"name", "baseline", "current", "change", "significant"} <= regression.keys()
    assert regression["change"] == pytest.approx(0.3)
    assert document["regression"] is True


def test_a_harness_error_is_listed_with_its_message_and_no_regression():
    message = "harness error: GPU out of memory with 10 pytest-xdist workers sharing the GPU"
    baseline = make_run(make_test(GROUPING), make_test(SPEC), run_id="b")
    current = make_run(make_test(GROUPING, "adapter_error", message=message), make_test(SPEC))
    comparison = compare_runs(current, baseline)
    assert not comparison.has_regression
    summary = format_summary(comparison)
    assert (
        f"Harness errors, no verdict on the engine (1):\n  {GROUPING} (passed -> adapter_error)"
        in summary
    )
    assert f"      {message}" in summary.splitlines()
    assert summary.endswith("Verdict: OK")


def test_warns_when_engine_differs_from_baseline():
    baseline = make_run(run_id="b", environment={"engine": "reference"})
    current = make_run(environment={"engine": "vllm"})
    assert compare_runs(current, baseline).warnings == (
        "engine differs from the baseline: 'reference' -> 'vllm'",
    )
