"""The engine's device loop (greedy speculative steps kept on the device) ends where the
eager engine ends.

The paged runner's device-step stand-in (``paged_device_step``) reads and writes through
its own copy of the block tables, so a block the loop failed to send before a launch, a
row holding the wrong request or a wrong cached length changes the tokens or fails a
null-block read. Checked: the tokens equal ``expected_continuation`` (so nothing past a
stop at ``max_tokens`` is emitted, though the step in flight when a request stops
computed more), each request's final state and the acceptance statistics equal the
eager engine's, the allocator's invariants after every step, no leaks, and that the
device loop did run, and fell back where the batch stopped qualifying.
"""

from __future__ import annotations

import pytest

from attngroup.reference_engine.engine.llm_engine import EngineConfig, LLMEngine
from attngroup.reference_engine.engine.request import SamplingParams
from attngroup.suites.engine_units.paged_device_step import PagedDeviceRunner
from attngroup.suites.engine_units.paged_token_runner import PagedTokenRunner, expected_continuation

PROMPTS = [[5, 9, 2], [7] * 11, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3], [8, 8]]
MAX_TOKENS = 14
MAX_STEPS = 400


def _engine(k: int, num_blocks: int, *, device_loop: bool, capacity: int = 64) -> LLMEngine:
    runner = (
        PagedDeviceRunner(num_blocks=num_blocks, num_spec_tokens=k, capacity=capacity)
        if device_loop
        else PagedTokenRunner(num_blocks=num_blocks)
    )
    config = EngineConfig(
        pair="qwen3-mtp",  # only names the engine; the paged runner replaces the model
        num_blocks=num_blocks,
        num_spec_tokens=k,
        max_num_batched_tokens=16,
        max_num_seqs=8,
        cuda_graph=device_loop,
    )
    return LLMEngine(config, runner=runner)


RequestState = tuple[tuple[int, ...], int, str, tuple[int, ...]]


def _run(engine: LLMEngine, max_tokens: list[int]) -> list[RequestState]:
    """Each request's tokens, cached length, status and drafts once every one finished."""
    requests = [
        engine.add_request(prompt, SamplingParams(max_tokens=n))
        for prompt, n in zip(PROMPTS, max_tokens, strict=True)
    ]
    while engine.has_unfinished:
        engine.step()
        engine.block_manager.check_invariants()
        assert engine.stats.num_steps < MAX_STEPS, "the engine is not making progress"
    engine.check_no_leaks()
    return [
        (tuple(r.output_token_ids), r.num_computed_tokens, r.status.value, r.spec_token_ids)
        for r in requests
    ]


# Different stops: requests leave the batch one by one, mid-way through a step's tokens.
STOPS = [MAX_TOKENS, MAX_TOKENS - 3, MAX_TOKENS + 5, MAX_TOKENS - 6]


@pytest.mark.spec_decode
@pytest.mark.parametrize("k", [1, 3], ids=lambda k: f"k{k}")
@pytest.mark.parametrize(
    ("num_blocks", "capacity"),
    [(64, 64), (14, 64), (64, 32)],
    ids=["ample-blocks", "preempting", "capacity-32"],
)
def test_device_loop_ends_where_the_eager_engine_ends(k: int, num_blocks: int, capacity: int):
    device = _engine(k, num_blocks, device_loop=True, capacity=capacity)
    eager = _engine(k, num_blocks, device_loop=False)

    states = _run(device, STOPS)

    window = PagedTokenRunner(num_blocks=2).window
    expected = [expected_continuation(p, n, window) for p, n in zip(PROMPTS, STOPS, strict=True)]
    assert [state[0] for state in states] == [tuple(tokens) for tokens in expected]
    assert states == _run(eager, STOPS)
    assert device.stats.spec == eager.stats.spec
    assert device.stats.num_generated_tokens == eager.stats.num_generated_tokens == sum(STOPS)
    assert device.device_loop is not None
    counts = device.device_loop.counts
    launches = sum(step.launches for step in device.runner.steps.values())
    assert counts["device"] + counts["dropped: every request had finished"] == launches, dict(
        counts
    )
    assert counts["device"] > 0, dict(counts)
    assert counts["stopped: a request finished"] > 0, dict(counts)
    assert any(reason.startswith("eager: ") for reason in counts), dict(counts)
    if capacity < 64:
        assert counts["eager: a context reaches the captured capacity"] > 0, dict(counts)
    assert set(device.runner.removed) == {f"req-{i}" for i in range(len(PROMPTS))}


@pytest.mark.spec_decode
def test_sampled_requests_stay_on_the_schedulers_path() -> None:
    """The device step is greedy only: sampled requests keep the scheduler's path, saying so."""
    engine = _engine(3, 64, device_loop=True)
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=6, temperature=0.7))
    engine.add_request(PROMPTS[1], SamplingParams(max_tokens=6, temperature=0.5))
    while engine.has_unfinished:
        engine.step()
    assert engine.device_loop is not None
    counts = engine.device_loop.counts
    assert counts["device"] == 0, dict(counts)
    assert counts["eager: not every request decodes greedily with 3 drafts"] > 0, dict(counts)
