"""KV-cache memory in real runs: preemption by recompute under a small block pool
keeps every token right and returns every block; sliding-window groups give
blocks back as they leave the window."""

from __future__ import annotations

import pytest

from attngroup.reference_engine.engine.request import SamplingParams
from attngroup.suites.spec_decode.harness import case_marks, greedy_generate, prompts_for

# Five usable 16-token blocks per KV-cache group (one is the null block): the three
# prompts (8, 13 and 20 tokens, plus lookahead) are admitted together (1 + 2 + 2
# blocks) but cannot all grow, so the scheduler must preempt.
SMALL_POOL = 6
PREEMPTION_PAIRS = ["gemma4-e2b-mtp", "qwen3-next-mtp", "qwen3-8b-draft-1.7b"]


def _cases(pairs) -> list:
    return [
        pytest.param(pair, marks=case_marks(pair, "torch", "fp32"), id=f"{pair}-torch-fp32-k3")
        for pair in pairs
    ]


@pytest.mark.parametrize("pair", _cases(PREEMPTION_PAIRS))
def test_preemption_by_recompute_keeps_tokens(engines, target_only_tokens, pair: str) -> None:
    prompts = prompts_for(pair)
    reference = target_only_tokens(pair, "torch", "fp32")
    oracle = {tuple(prompt): output for prompt, output in zip(prompts, reference, strict=True)}
    engine = engines.engine(pair, num_spec_tokens=3, num_blocks=SMALL_POOL, oracle=oracle)
    assert greedy_generate(engine, prompts) == reference
    assert engine.scheduler.num_preemptions > 0, (
        "the pool was meant to be too small to avoid preemption"
    )
    assert engine.block_manager.num_used_blocks() == 0


@pytest.mark.parametrize("pair", _cases(["gemma4-e2b-mtp"]))
def test_sliding_window_blocks_are_returned_during_the_run(engines, pair: str) -> None:
    engine = engines.engine(pair, num_spec_tokens=3)
    sliding = [i for i, layout in enumerate(engine.block_manager.layouts) if layout.sliding_window]
    assert sliding, f"{pair} has no sliding-window KV-cache group"
    group = sliding[0]
    layout = engine.block_manager.layouts[group]
    prompt_len = layout.sliding_window + 2 * layout.block_size  # long enough to slide out a block
    request = engine.add_request(list(range(1, prompt_len + 1)), SamplingParams(max_tokens=3))
    while not request.is_finished and request.num_computed_tokens < prompt_len:
        engine.step()
    engine.step()  # the next schedule frees what left the window
    table = engine.block_manager.block_ids(request.request_id)[group]
    assert table[0] == 0, f"block 0 of the sliding group should have been returned: {table}"
    while engine.has_unfinished:
        engine.step()
    engine.check_no_leaks()
