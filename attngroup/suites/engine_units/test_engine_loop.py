"""The engine loop on a runner that reads tokens back through the block tables.

Every case must reproduce ``expected_continuation`` exactly: the paged runner
hashes what it reads out of the caches, so chunked prefill, sliding-window
freeing, preemption by recompute and the rollback of rejected drafts are all
checked by the generated tokens themselves, plus the allocator's invariants
after every step and the leak check at the end.
"""

from __future__ import annotations

import pytest

from attngroup.reference_engine.engine.llm_engine import EngineConfig, LLMEngine
from attngroup.reference_engine.engine.request import SamplingParams
from attngroup.reference_engine.engine.scheduler import SchedulerCapacityError
from attngroup.suites.engine_units.paged_token_runner import PagedTokenRunner, expected_continuation

PROMPTS = [[5, 9, 2], [7] * 11, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3], [8, 8]]
MAX_TOKENS = 14


def _engine(num_blocks: int, k: int, budget: int = 16, max_num_seqs: int = 8) -> LLMEngine:
    runner = PagedTokenRunner(num_blocks=num_blocks)
    config = EngineConfig(
        pair="qwen3-mtp",  # only names the engine; the paged runner replaces the model
        num_blocks=num_blocks,
        num_spec_tokens=k,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
    )
    return LLMEngine(config, runner=runner)


MAX_STEPS = 400  # far above what any case needs: a bookkeeping bug must fail, not hang


def _check_step(engine: LLMEngine) -> None:
    engine.block_manager.check_invariants()
    assert engine.stats.num_steps < MAX_STEPS, "the engine is not making progress"


def _run(engine: LLMEngine) -> list[list[int]]:
    return engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS), on_step=_check_step)


def _expected() -> list[list[int]]:
    window = PagedTokenRunner(num_blocks=2).window
    return [expected_continuation(prompt, MAX_TOKENS, window) for prompt in PROMPTS]


@pytest.mark.parametrize("k", [0, 1, 3], ids=lambda k: f"k{k}")
@pytest.mark.parametrize(
    ("num_blocks", "preempts"), [(64, False), (14, True)], ids=["ample-blocks", "preempting"]
)
def test_tokens_survive_chunking_windows_and_preemption(
    k: int, num_blocks: int, preempts: bool
) -> None:
    engine = _engine(num_blocks, k)
    assert _run(engine) == _expected()
    assert (engine.scheduler.num_preemptions > 0) == preempts
    engine.check_no_leaks()
    assert set(engine.runner.removed) >= {f"req-{i}" for i in range(len(PROMPTS))}


@pytest.mark.spec_decode
@pytest.mark.parametrize("k", [1, 3], ids=lambda k: f"k{k}")
def test_rejected_drafts_are_rolled_back(k: int) -> None:
    engine = _engine(64, k)
    assert _run(engine) == _expected()
    spec = engine.stats.spec
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens, (
        "the paged drafter must be partly wrong"
    )
    assert 1.0 < spec.mean_accepted_length < k + 1
    assert engine.stats.num_generated_tokens == MAX_TOKENS * len(PROMPTS)


def test_chunked_prefill_respects_the_token_budget() -> None:
    engine = _engine(64, k=3, budget=5, max_num_seqs=2)
    seen = []
    engine.add_request(PROMPTS[2], SamplingParams(max_tokens=4))
    engine.add_request(PROMPTS[1], SamplingParams(max_tokens=4))
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=4))
    while engine.has_unfinished:
        output = engine.scheduler.schedule()
        seen.append(output)
        assert sum(len(chunk.token_ids) for chunk in output.batch.chunks) <= 5
        assert len(output.batch.chunks) <= 2
        target = engine.runner.execute_target(output.batch)
        emissions = engine._emit_all(output.scheduled, target.logits)
        for item, emitted in zip(output.scheduled, emissions, strict=True):
            engine.scheduler.update_after_step(item, emitted)
    first_chunks = [o.batch.chunks[0] for o in seen[:4]]
    assert [c.start_position for c in first_chunks] == [0, 5, 10, 15]
    assert [c.logits for c in first_chunks] == ["none", "none", "none", "last"]
    engine.check_no_leaks()


def test_request_larger_than_the_pool_is_refused() -> None:
    engine = _engine(4, k=0)
    with pytest.raises(SchedulerCapacityError, match="raise num_blocks"):
        engine.add_request(list(range(40)), SamplingParams(max_tokens=4))
