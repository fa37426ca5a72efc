"""Random (temperature > 0) speculative decoding keeps the target's distribution.

At the rejection-sampler level, with the real target and draft distributions
of each pair's models at one position: tokens emitted by the random rejection
sampler pass a chi-square test against the target's distribution (p > 0.01)
and fail it against the draft's. At engine level: a smoke run with sampled
drafts that must finish, stay in the vocabulary, leak nothing and reproduce
from its seed.
"""

from __future__ import annotations

import pytest
import torch

from attngroup.reference_engine.engine.llm_engine import LLMEngine
from attngroup.reference_engine.engine.rejection_sampler import num_emitted, random_rejection_sample
from attngroup.reference_engine.engine.request import SamplingParams
from attngroup.reference_engine.engine.step import (
    ProposeInput,
    ProposeRequest,
    ScheduledChunk,
    StepBatch,
)
from attngroup.suites.engine_units.chi_square import chi_square_pvalue
from attngroup.suites.spec_decode.harness import (
    MAX_TOKENS,
    PAIRS,
    EngineFactory,
    case_marks,
    prompts_for,
)

NUM_SAMPLES = 20000
# Random tiny models are nearly uniform over the vocabulary at T = 1; at 0.2 both the
# target and the draft concentrate on a few dozen tokens and differ clearly.
TEMPERATURE = 0.2
MIN_TOTAL_VARIATION = 0.3


def _cases(pairs) -> list:
    return [
        pytest.param(pair, marks=case_marks(pair, "torch", "fp32"), id=f"{pair}-torch-fp32")
        for pair in pairs
    ]


def _target_and_draft_probs(engine, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """p and q over the token after ``prompt`` (which ends with a sampled token), at TEMPERATURE."""
    blocks = engine.block_manager
    assert blocks.allocate("probe", len(prompt) + 1 + engine.config.num_spec_tokens)
    chunk = ScheduledChunk("probe", tuple(prompt), 0, blocks.block_ids("probe"), "last")
    target_logits = engine.runner.execute_target(StepBatch((chunk,))).logits[0][-1]
    request = ProposeRequest("probe", tuple(prompt), blocks.block_ids("probe"), TEMPERATURE)
    draft = engine.runner.propose(ProposeInput((request,), torch.Generator().manual_seed(0)), 1)
    blocks.free("probe")
    return torch.softmax(target_logits.float().cpu() / TEMPERATURE, -1), draft.draft_probs[
        0, 0
    ].cpu()


@pytest.mark.parametrize("pair", _cases(PAIRS))
def test_rejection_sampler_follows_the_target_with_real_models(engines, pair: str) -> None:
    engine = engines.engine(pair, num_spec_tokens=1)
    target, draft = _target_and_draft_probs(engine, prompts_for(pair)[0])
    total_variation = 0.5 * float((target - draft).abs().sum())
    assert total_variation > MIN_TOTAL_VARIATION, (
        f"target and draft distributions are too close (TV {total_variation:.3f}) for the "
        "test to tell them apart: lower TEMPERATURE"
    )
    generator = torch.Generator().manual_seed(1234)
    drafts = torch.multinomial(draft, NUM_SAMPLES, replacement=True, generator=generator)[:, None]
    vocab = target.shape[0]
    out = random_rejection_sample(
        drafts, draft.expand(NUM_SAMPLES, 1, vocab), target.expand(NUM_SAMPLES, 2, vocab), generator
    )
    emitted = out[:, 0]
    assert chi_square_pvalue(emitted, target) > 0.01
    assert chi_square_pvalue(emitted, draft) < 1e-6
    acceptance = float((num_emitted(out) == 2).double().mean())
    assert abs(acceptance - float(torch.minimum(target, draft).sum())) < 0.02


def _random_run(engines: EngineFactory, pair: str, seed: int) -> tuple[list[list[int]], LLMEngine]:
    engine = engines.engine(pair, num_spec_tokens=3, seed=seed)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE)
    outputs = engine.generate(
        prompts_for(pair), params, on_step=lambda e: e.block_manager.check_invariants()
    )
    engine.check_no_leaks()
    return outputs, engine


@pytest.mark.parametrize("pair", _cases(["gemma4-e2b-mtp", "qwen3-8b-draft-1.7b"]))
def test_random_spec_decode_engine_smoke(engines, pair: str) -> None:
    outputs, engine = _random_run(engines, pair, seed=3)
    vocab = engine.pair.target_config().vocab_size
    assert [len(tokens) for tokens in outputs] == [MAX_TOKENS] * len(outputs)
    assert all(0 <= token < vocab for tokens in outputs for token in tokens)
    spec = engine.stats.spec
    assert spec.num_verifications > 0
    assert 0.0 <= spec.acceptance_rate <= 1.0
    repeated, _ = _random_run(engines, pair, seed=3)
    assert repeated == outputs, "a random run must reproduce from its seed"
