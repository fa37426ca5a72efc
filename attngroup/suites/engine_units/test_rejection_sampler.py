"""The rejection sampler: greedy prefix/bonus rules, placeholders, and the random rule's
guarantee that emitted tokens follow the target distribution (not the draft's)."""

from __future__ import annotations

import pytest
import torch

from attngroup.reference_engine.engine.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    greedy_rejection_sample,
    num_emitted,
    random_rejection_sample,
)
from attngroup.suites.engine_units.chi_square import chi_square_pvalue

pytestmark = pytest.mark.spec_decode

VOCAB = 6
NUM_SAMPLES = 20000


def _logits_with_argmax(argmax: list[int]) -> torch.Tensor:
    logits = torch.randn(1, len(argmax), VOCAB, generator=torch.Generator().manual_seed(3))
    logits[0, torch.arange(len(argmax)), torch.tensor(argmax)] = 10.0
    return logits


@pytest.mark.parametrize(
    ("drafts", "argmax", "expected"),
    [
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]),
        ([1, 2, 3], [5, 2, 3, 4], [5, -1, -1, -1]),
        ([1, 2, 3], [1, 5, 3, 4], [1, 5, -1, -1]),
        ([1, 2, 3], [1, 2, 5, 4], [1, 2, 5, -1]),
        ([4], [4, 0], [4, 0]),
        ([4], [0, 4], [0, -1]),
    ],
    ids=[
        "all-accepted-bonus",
        "reject-first",
        "reject-second",
        "reject-last",
        "k1-accept",
        "k1-reject",
    ],
)
def test_greedy(drafts: list[int], argmax: list[int], expected: list[int]) -> None:
    out = greedy_rejection_sample(torch.tensor([drafts]), _logits_with_argmax(argmax))
    assert out.tolist() == [expected]
    assert int(num_emitted(out)[0]) == sum(token != PLACEHOLDER_TOKEN_ID for token in expected)


def test_greedy_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"target must be \[1, 3, vocab\]"):
        greedy_rejection_sample(torch.tensor([[1, 2]]), torch.zeros(1, 2, VOCAB))


def _distributions(seed: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A target p [k + 1, V] and a clearly different draft q [k, V]."""
    generator = torch.Generator().manual_seed(seed)
    target = torch.softmax(2 * torch.randn(k + 1, VOCAB, generator=generator), -1)
    draft = torch.softmax(2 * torch.randn(k, VOCAB, generator=generator), -1)
    return target, draft


def _run_random(target: torch.Tensor, draft: torch.Tensor, seed: int) -> torch.Tensor:
    k = draft.shape[0]
    generator = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(draft, NUM_SAMPLES, replacement=True, generator=generator).T
    return random_rejection_sample(
        drafts,
        draft.expand(NUM_SAMPLES, k, VOCAB),
        target.expand(NUM_SAMPLES, k + 1, VOCAB),
        generator,
    )


@pytest.mark.parametrize("position", [0, 1, 2], ids=lambda p: f"position{p}")
def test_random_emits_the_target_distribution(position: int) -> None:
    target, draft = _distributions(seed=11, k=2)
    out = _run_random(target, draft, seed=5)
    reached = out[:, position] != PLACEHOLDER_TOKEN_ID
    assert reached.sum() >= 2000, "too few samples reach this position for a chi-square test"
    tokens = out[reached, position]
    assert chi_square_pvalue(tokens, target[position]) > 0.01
    if position < 2:  # the draft's distribution must be rejected where a draft exists
        assert chi_square_pvalue(tokens, draft[position]) < 1e-6


def test_random_acceptance_rate_matches_theory() -> None:
    """P(accept position 0) = sum_x min(p(x), q(x))."""
    target, draft = _distributions(seed=11, k=2)
    out = _run_random(target, draft, seed=6)
    drafts_accepted = num_emitted(out) > 1
    expected = float(torch.minimum(target[0], draft[0]).sum())
    assert abs(float(drafts_accepted.double().mean()) - expected) < 0.02


def test_random_with_equal_distributions_accepts_everything() -> None:
    target, _ = _distributions(seed=2, k=3)
    out = _run_random(target, target[:3].clone(), seed=7)
    assert bool((num_emitted(out) == 4).all())


def test_random_placeholders_follow_the_first_rejection() -> None:
    target, draft = _distributions(seed=4, k=3)
    out = _run_random(target, draft, seed=8)
    emitted = num_emitted(out)
    positions = torch.arange(4)
    assert bool(((out != PLACEHOLDER_TOKEN_ID) == (positions[None, :] < emitted[:, None])).all())
    assert bool((emitted >= 1).all())


@pytest.mark.parametrize("seed", [21, 22], ids=lambda s: f"seed{s}")
def test_random_on_owned_inputs_reads_the_target_it_was_given(seed: int) -> None:
    """Contiguous, writable inputs (what the engine passes, not broadcast views): the sampler
    must not build max(p - q, 0) in place in the caller's p before the acceptance test reads
    it (vllm-ascend #2881: the recovered step zeroed target_probs, so p(x) read back as 0)."""
    target, draft = _distributions(seed=seed, k=2)
    generator = torch.Generator().manual_seed(seed + 100)
    drafts = torch.multinomial(draft, NUM_SAMPLES, replacement=True, generator=generator).T
    target_rows = target.repeat(NUM_SAMPLES, 1, 1).contiguous()
    draft_rows = draft.repeat(NUM_SAMPLES, 1, 1).contiguous()
    target_before, draft_before = target_rows.clone(), draft_rows.clone()
    out = random_rejection_sample(drafts, draft_rows, target_rows, generator)
    assert torch.equal(target_rows, target_before), "the sampler wrote into target_probs"
    assert torch.equal(draft_rows, draft_before), "the sampler wrote into draft_probs"
    # P(accept position 0) = sum_x min(p(x), q(x)), from a float64 oracle.
    expected = float(torch.minimum(target[0].double(), draft[0].double()).sum())
    measured = float((num_emitted(out) > 1).double().mean())
    assert abs(measured - expected) / expected < 0.05, (measured, expected)
    assert chi_square_pvalue(out[:, 0], target[0]) > 0.01
