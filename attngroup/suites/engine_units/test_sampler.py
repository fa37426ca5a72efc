"""Token sampling: greedy argmax and draws that follow softmax(logits / T)."""

from __future__ import annotations

import pytest
import torch

from attngroup.reference_engine.engine.sampler import probs_from_logits, sample
from attngroup.suites.engine_units.chi_square import chi_square_pvalue


def test_greedy_is_argmax() -> None:
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample(logits, 0.0, torch.Generator()), logits.argmax(-1))
    assert torch.equal(probs_from_logits(logits, 0.0).argmax(-1), logits.argmax(-1))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0], ids=lambda t: f"T{t}")
def test_random_follows_softmax(temperature: float) -> None:
    logits = torch.randn(7, generator=torch.Generator().manual_seed(1))
    tokens = sample(logits.expand(20000, 7), temperature, torch.Generator().manual_seed(2))
    probs = torch.softmax(logits / temperature, -1)
    assert chi_square_pvalue(tokens, probs) > 0.01
    assert torch.allclose(probs_from_logits(logits, temperature), probs)
