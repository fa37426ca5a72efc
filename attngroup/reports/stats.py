"""Noise-aware statistics for metric comparison: Mann-Whitney U and a bootstrap interval.

Implemented here (no scipy dependency) because the reports package must run anywhere the
records can be copied to. Mann-Whitney U is exact for small samples without ties (the
usual case for timings) and uses the tie-corrected normal approximation otherwise.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

EXACT_LIMIT = 50  # total sample count up to which the exact U distribution is enumerated


@dataclass(frozen=True)
class MannWhitneyResult:
    u_statistic: float  # U of the first sample: pairs (x, y) with x > y, ties count one half
    p_value: float  # two-sided
    min_p_value: float  # smallest p-value these sample sizes can give (power check)
    exact: bool


def mann_whitney_u(first: Sequence[float], second: Sequence[float]) -> MannWhitneyResult:
    """Two-sided Mann-Whitney U test of ``first`` against ``second``."""
    n_first, n_second = len(first), len(second)
    if n_first == 0 or n_second == 0:
        raise ValueError("Mann-Whitney U needs at least one sample on each side")
    u_statistic = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in first for y in second)
    has_ties = len(set(first) | set(second)) < n_first + n_second
    if not has_ties and n_first + n_second <= EXACT_LIMIT:
        return _exact(u_statistic, n_first, n_second)
    return _normal_approximation(u_statistic, first, second)


def _exact(u_statistic: float, n_first: int, n_second: int) -> MannWhitneyResult:
    counts = _u_distribution(n_first, n_second)
    total = math.comb(n_first + n_second, n_first)
    u_index = int(u_statistic)
    lower_tail = sum(counts[: u_index + 1]) / total
    upper_tail = sum(counts[u_index:]) / total
    p_value = min(1.0, 2.0 * min(lower_tail, upper_tail))
    return MannWhitneyResult(u_statistic, p_value, min(1.0, 2.0 / total), exact=True)


@cache
def _u_distribution(n_first: int, n_second: int) -> tuple[int, ...]:
    """Number of orderings giving each U in 0..n_first*n_second (largest element decides)."""
    if n_first == 0 or n_second == 0:
        return (1,)
    largest_is_first = _u_distribution(n_first - 1, n_second)  # shifted by n_second
    largest_is_second = _u_distribution(n_first, n_second - 1)
    counts = [0] * (n_first * n_second + 1)
    for u_value, count in enumerate(largest_is_first):
        counts[u_value + n_second] += count
    for u_value, count in enumerate(largest_is_second):
        counts[u_value] += count
    return tuple(counts)


def _normal_approximation(
    u_statistic: float, first: Sequence[float], second: Sequence[float]
) -> MannWhitneyResult:
    n_first, n_second = len(first), len(second)
    total = n_first + n_second
    tie_sizes = _tie_sizes([*first, *second])
    tie_term = sum(size**3 - size for size in tie_sizes) / (total * (total - 1)) if total > 1 else 0
    variance = n_first * n_second / 12.0 * ((total + 1) - tie_term)
    mean = n_first * n_second / 2.0

    def two_sided(u_value: float, var: float) -> float:
        if var <= 0:
            return 1.0
        z_score = max(0.0, abs(u_value - mean) - 0.5) / math.sqrt(var)
        return math.erfc(z_score / math.sqrt(2.0))

    no_tie_variance = n_first * n_second * (total + 1) / 12.0
    return MannWhitneyResult(
        u_statistic, two_sided(u_statistic, variance), two_sided(0.0, no_tie_variance), exact=False
    )


def _tie_sizes(values: Sequence[float]) -> list[int]:
    sizes: dict[float, int] = {}
    for value in values:
        sizes[value] = sizes.get(value, 0) + 1
    return [size for size in sizes.values() if size > 1]


def bootstrap_median_ratio_interval(
    baseline: Sequence[float],
    current: Sequence[float],
    confidence: float = 0.99,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of median(current) / median(baseline).

    Seeded, so a report is reproducible. None when a resampled baseline median is zero
    (the ratio is undefined).
    """
    if not baseline or not current:
        raise ValueError("the bootstrap needs at least one sample on each side")
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        baseline_median = statistics.median(rng.choices(baseline, k=len(baseline)))
        if baseline_median == 0:
            return None
        ratios.append(statistics.median(rng.choices(current, k=len(current))) / baseline_median)
    ratios.sort()
    tail = (1.0 - confidence) / 2.0
    low_index = math.floor(tail * (resamples - 1))
    high_index = math.ceil((1.0 - tail) * (resamples - 1))
    return ratios[low_index], ratios[high_index]
