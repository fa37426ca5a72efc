"""Mann-Whitney U and the bootstrap interval against scipy and exact hand counts."""

from __future__ import annotations

import math
import random

import pytest

from attngroup.reports.stats import bootstrap_median_ratio_interval, mann_whitney_u

scipy_stats = pytest.importorskip("scipy.stats", reason="scipy is the oracle for these checks")


def test_exact_p_value_of_fully_separated_samples():
    """All 5 current samples above all 5 baseline ones: 2 of C(10, 5) = 252 orderings."""
    result = mann_whitney_u([6.0, 7.0, 8.0, 9.0, 10.0], [1.0, 2.0, 3.0, 4.0, 5.0])
    assert result.exact
    assert result.u_statistic == 25
    assert result.p_value == pytest.approx(2 / 252)
    assert result.min_p_value == pytest.approx(2 / 252)


@pytest.mark.parametrize(
    ("size_a", "size_b", "shift"), [(4, 6, 0.5), (8, 8, 0.2), (12, 9, 0.0), (20, 25, 1.0)]
)
def test_exact_matches_scipy(size_a, size_b, shift):
    rng = random.Random(size_a * 100 + size_b)
    first = [rng.gauss(shift, 1.0) for _ in range(size_a)]
    second = [rng.gauss(0.0, 1.0) for _ in range(size_b)]
    expected = scipy_stats.mannwhitneyu(first, second, alternative="two-sided", method="exact")
    result = mann_whitney_u(first, second)
    assert result.exact
    assert result.u_statistic == expected.statistic
    assert result.p_value == pytest.approx(expected.pvalue, rel=1e-9)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ties_use_the_tie_corrected_normal_approximation(seed):
    rng = random.Random(seed)
    first = [round(rng.gauss(1.0, 1.0)) for _ in range(30)]
    second = [round(rng.gauss(0.0, 1.0)) for _ in range(40)]
    expected = scipy_stats.mannwhitneyu(first, second, alternative="two-sided", method="asymptotic")
    result = mann_whitney_u(first, second)
    assert not result.exact
    assert result.u_statistic == expected.statistic
    assert result.p_value == pytest.approx(expected.pvalue, rel=1e-9)


def test_small_samples_cannot_reach_one_percent():
    assert mann_whitney_u([2.0, 3.0, 4.0], [0.5, 1.0, 1.5]).min_p_value == pytest.approx(0.1)


def test_bootstrap_interval_excludes_one_for_a_clear_shift():
    baseline = [1.0, 1.01, 0.99, 1.02, 0.98]
    current = [1.2, 1.21, 1.19, 1.22, 1.18]
    low, high = bootstrap_median_ratio_interval(baseline, current)
    assert 1.0 < low <= 1.2 <= high


def test_bootstrap_interval_contains_one_for_the_same_distribution():
    rng = random.Random(7)
    baseline = [rng.gauss(1.0, 0.05) for _ in range(10)]
    current = [rng.gauss(1.0, 0.05) for _ in range(10)]
    low, high = bootstrap_median_ratio_interval(baseline, current)
    assert low < 1.0 < high
    assert bootstrap_median_ratio_interval(baseline, current) == (low, high)  # seeded


def test_bootstrap_of_a_zero_baseline_is_undefined():
    assert bootstrap_median_ratio_interval([0.0, 0.0], [1.0, 2.0]) is None


def test_empty_samples_are_rejected():
    with pytest.raises(ValueError, match="at least one sample"):
        mann_whitney_u([], [1.0])
    assert math.isfinite(mann_whitney_u([1.0], [2.0]).p_value)
