"""The device-resident speculative step (verify, greedy rejection and the assistant's k
draft passes in one graph, lengths computed on the device) equals the eager runner's step.

Twin runners (``harness``) prefill the same batch; the eager one then runs two rounds of
verify, greedy rejection and drafting from the host, the graph one loads the same first
verify into ``device_spec_step`` and launches it twice, carrying the batch on the device.
Checked (fp32): the same emitted tokens and next drafts each round; every dtype: blocks
no request owns, the null block included, bit for bit as poisoned (the padding rows of a
batch of 3 in the bucket of 4 write nothing). FlashInfer's groups plan on the host, so
the runner refuses them the device step and says why.
"""

from __future__ import annotations

import pytest
import torch

from attngroup.kernels.backends.flashinfer_attn import FlashInferBackend
from attngroup.reference_engine.engine.rejection_sampler import greedy_rejection_sample
from attngroup.reference_engine.engine.step import (
    ProposeInput,
    ProposeRequest,
    ScheduledChunk,
    StepBatch,
)
from attngroup.reference_engine.model_pairs import MODEL_PAIRS
from attngroup.reference_engine.models import DraftKind, draft_kind_of
from attngroup.suites.cuda_graphs.harness import (
    DEVICE,
    ON_GPU,
    RTOL,
    K,
    TwinRunners,
    blocks_of,
    check_caches,
    make_batch,
    make_twins,
    poison,
    verify,
)

ASSISTANT_PAIRS = tuple(
    name for name, pair in MODEL_PAIRS.items() if draft_kind_of(pair) is DraftKind.CONSTANT_POSITION
)
CPU_CASE = ("gemma4-e2b-mtp", "triton", "fp32")
ROUNDS = 2


def _cases() -> list:
    cases = []
    for pair in ASSISTANT_PAIRS:
        for backend, dtype in (("triton", "fp32"), ("triton", "bf16")):
            marks = [pytest.mark.case(pair=pair, backend=backend, dtype=dtype, k=K)]
            if (pair, backend, dtype) != CPU_CASE:
                marks.append(pytest.mark.gpu)
                if not ON_GPU:
                    marks.append(pytest.mark.skip(reason="GPU case (CUDA graphs)"))
            cases.append(
                pytest.param(pair, backend, dtype, marks=marks, id=f"{pair}-{backend}-{dtype}")
            )
    return cases


def _prefill(twins: TwinRunners, prompts) -> list[int]:
    """Both runners prefill; the eager one's first sampled tokens."""
    tokens = []
    for name, runner in twins.both:
        output = runner.execute_target(
            StepBatch(
                tuple(
                    ScheduledChunk(f"r{i}", prompt, 0, blocks_of(runner, i), "last")
                    for i, prompt in enumerate(prompts)
                )
            )
        )
        if name == "eager":
            tokens = [int(logits[-1].argmax()) for logits in output.logits]
    return tokens


def _eager_drafts(twins: TwinRunners, history: list[list[int]]) -> list[list[int]]:
    output = twins.eager.propose(
        ProposeInput(
            tuple(
                ProposeRequest(f"r{i}", tuple(tokens), blocks_of(twins.eager, i))
                for i, tokens in enumerate(history)
            )
        ),
        K,
    )
    return output.draft_token_ids.tolist()


@pytest.mark.mtp
@pytest.mark.parametrize("num_reqs", [pytest.param(3, id="padded3of4")])
@pytest.mark.parametrize(("pair", "backend", "dtype"), _cases())
def test_device_step_equals_the_eager_step(pair: str, backend: str, dtype: str, num_reqs: int):
    twins = make_twins(pair, backend, dtype, record_drafts=False)  # the graph captures them
    before = poison(twins, seed=11)
    batch = make_batch(pair, num_reqs, (9, 17, 30, 5), seed=11, tag="d")
    prompts = batch.prompts
    sampled = _prefill(twins, prompts)
    history = [[*prompt, token] for prompt, token in zip(prompts, sampled, strict=True)]
    drafts = _eager_drafts(twins, history)
    step, reason = twins.graph.device_spec_step(num_reqs)
    assert step is not None, reason
    step.load(
        [[h[-1], *d] for h, d in zip(history, drafts, strict=True)],
        [len(h) - 1 for h in history],
        [blocks_of(twins.graph, i) for i in range(num_reqs)],
    )
    assert step.bucket > num_reqs, "the case must pad its bucket"
    for round_index in range(ROUNDS):
        chunks = [[h[-1], *d] for h, d in zip(history, drafts, strict=True)]
        batch_ids = type(batch)(tuple(f"r{i}" for i in range(num_reqs)), prompts)
        logits = verify(twins.eager, batch_ids, chunks, [len(h) - 1 for h in history])
        emitted = greedy_rejection_sample(torch.tensor(drafts), torch.stack(logits)).tolist()
        for tokens, row in zip(history, emitted, strict=True):
            tokens.extend(token for token in row if token >= 0)
        drafts = _eager_drafts(twins, history)

        result = step.launch().wait()[:num_reqs].tolist()

        if dtype == "fp32":
            assert [row[: K + 1] for row in result] == emitted, f"round {round_index} emission"
            assert [row[K + 2 :] for row in result] == drafts, f"round {round_index} drafts"
    check_caches(twins, before, num_reqs, RTOL[dtype] if dtype == "fp32" else float("inf"))


@pytest.mark.gpu
@pytest.mark.mtp
@pytest.mark.case(pair="gemma4-e2b-mtp", backend="flashinfer", dtype="bf16", k=K)
@pytest.mark.skipif(
    not (ON_GPU and FlashInferBackend.is_available(DEVICE)),
    reason="FlashInfer's CUDA-graph wrappers need a GPU and flashinfer-python",
)
def test_flashinfer_groups_get_no_device_step() -> None:
    twins = make_twins("gemma4-e2b-mtp", "flashinfer", "bf16", record_drafts=False)
    step, reason = twins.graph.device_spec_step(3)
    assert step is None
    assert "plan with the step's lengths on the host" in reason, reason
