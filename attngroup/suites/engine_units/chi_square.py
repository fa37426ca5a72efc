"""Chi-square goodness of fit of sampled tokens against a distribution."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

MIN_EXPECTED_COUNT = 5.0


def chi_square_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value that ``tokens`` were drawn from ``probs`` [vocab].

    Tokens whose expected count is below 5 are pooled into one bin (the test's
    approximation needs it); a pooled bin with expected count < 5 is dropped.
    """
    probs = probs.double() / probs.double().sum()
    observed = torch.bincount(tokens.long(), minlength=probs.shape[0]).double()
    expected = probs * observed.sum()
    large = expected >= MIN_EXPECTED_COUNT
    observed_bins = [observed[large], observed[~large].sum().reshape(1)]
    expected_bins = [expected[large], expected[~large].sum().reshape(1)]
    if expected_bins[1].item() < MIN_EXPECTED_COUNT:
        observed_bins, expected_bins = observed_bins[:1], expected_bins[:1]
        # Keep the totals equal, as the test requires.
        expected_bins[0] = expected_bins[0] * observed_bins[0].sum() / expected_bins[0].sum()
    observed_all = torch.cat(observed_bins)
    expected_all = torch.cat(expected_bins)
    return float(chisquare(observed_all.numpy(), expected_all.numpy()).pvalue)
