"""Greedy speculative decoding emits exactly the target's own greedy tokens (fp32).

Every pair x backend x k in {1, 3}, a batch of mixed prompt lengths. Drafts
come from ``OracleDrafts`` (the real drafter runs; its tokens are replaced by
the target's continuation with planted errors), so each run accepts drafts,
rejects drafts (rolling their KV back) and emits bonus tokens.

bf16 (GPU): token identity with the target's own bf16 greedy run cannot be
demanded. Verification runs 1 + k query tokens where plain decoding runs 1, so
the two round differently and a near-tied argmax may flip, after which the
sequences legitimately diverge. The bf16 case checks instead, for every verify
chunk, that its logits match the target alone's (same backend and dtype,
teacher-forced over the same tokens) and that greedy verification emitted the
argmax of its own logits up to and including the first rejected draft.
(Against the fp32 target, qwen3-next-mtp's verify chunks were off by 0.14 to
0.18 on the H200 with every backend, torch included: the model's rounding, its
MoE routing most likely, not the attention.)
"""

from __future__ import annotations

import pytest
import torch

from attngroup.reference_engine.engine.cuda_graphs.device_spec_step import DeviceSpecStep
from attngroup.reference_engine.engine.request import SamplingParams
from attngroup.reference_engine.models import DraftKind
from attngroup.suites.spec_decode.harness import (
    DTYPES,
    ON_GPU,
    ORACLE_ERROR_EVERY,
    PAIRS,
    VerifyRecord,
    engine_cases,
    greedy_generate,
    prompts_for,
    teacher_forced_logits,
)

# Per logits row, ||verify - target alone|| / ||target alone|| in bf16: the same weights,
# backend and dtype, differing only in how the tokens were batched. Measured (CPU, torch and
# Triton): median 0.017, worst 0.08 (qwen3-next-mtp, whose MoE router can flip an expert
# on a near-tie). A wrong row or head reads other data: about 1.4 for random logits.
BF16_MEDIAN_ROW_RTOL = 5e-2
BF16_MAX_ROW_RTOL = 0.5
# Long enough that requests run several device steps after accepting drafts.
DEVICE_LOOP_MAX_TOKENS = 16


@pytest.mark.parametrize(("pair", "backend", "dtype", "k"), engine_cases(PAIRS, (1, 3)))
def test_spec_decode_greedy(
    engines, target_only_tokens, pair: str, backend: str, dtype: str, k: int
) -> None:
    prompts = prompts_for(pair)
    reference = target_only_tokens(pair, backend, dtype)
    oracle = {tuple(prompt): output for prompt, output in zip(prompts, reference, strict=True)}
    engine = engines.engine(
        pair, backend=backend, dtype=DTYPES[dtype], num_spec_tokens=k, oracle=oracle
    )

    outputs = greedy_generate(engine, prompts)

    spec = engine.stats.spec
    if dtype != "fp32":
        _check_bf16_verification(engines, pair, backend, engine, prompts, outputs)
        return
    assert outputs == reference, "speculative decoding changed the target's greedy tokens"
    assert engine.runner.num_oracle_drafts > 0
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens, (
        "expected accepted and rejected drafts"
    )
    assert spec.accepted_per_position[k - 1] > 0, (
        "no verification accepted all k drafts (bonus token)"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("pair", PAIRS)
def test_spec_decode_greedy_from_cuda_graphs(engines, target_only_tokens, pair: str) -> None:
    """With the uniform steps (verify, draft decode, target decode) replayed from CUDA
    graphs, greedy speculative decoding with the real drafter (k = 3) still emits the eager
    target's own greedy tokens (Triton, fp32: the dtype where identity is demanded)."""
    prompts = prompts_for(pair)
    reference = target_only_tokens(pair, "triton", "fp32")
    engine = engines.engine(
        pair, backend="triton", dtype=DTYPES["fp32"], num_spec_tokens=3, cuda_graph=True
    )

    outputs = greedy_generate(engine, prompts)

    assert outputs == reference, "speculative decoding from CUDA graphs changed the tokens"
    assert engine.stats.spec.num_draft_tokens > 0
    replays = engine.runner.cuda_graphs.counts
    assert sum(n for (_, path), n in replays.items() if path == "graph") > 0, dict(replays)
    loop = engine.device_loop.counts
    if engine.runner.draft_kind is DraftKind.CONSTANT_POSITION:
        assert loop["device"] > 0, f"no step ran on the device loop: {dict(loop)}"
    else:
        assert loop["device"] == 0 and any("drafter keeps" in reason for reason in loop), dict(loop)


@pytest.mark.spec_decode
@pytest.mark.mtp
@pytest.mark.case(pair="gemma4-e2b-mtp", backend="triton", dtype="fp32", k=3)
@pytest.mark.skipif(ON_GPU, reason="the oracle drafts in Python at each replay: HostReplay only")
def test_device_loop_greedy_with_oracle_drafts(engines, monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy speculative steps kept on the device (``cuda_graphs.device_spec_step``, run
    by the CPU's ``HostReplay``) emit the target's own greedy tokens while drafts are
    accepted, rejected and followed by bonus tokens: the draft's logits are replaced by
    the target's continuation, corrupted at every fifth position, as ``OracleDrafts``
    does on the scheduler's path (the real draft passes still run)."""
    pair, k = "gemma4-e2b-mtp", 3
    prompts = prompts_for(pair)
    params = SamplingParams(max_tokens=DEVICE_LOOP_MAX_TOKENS)
    target = engines.engine(pair, backend="triton", dtype=DTYPES["fp32"], num_spec_tokens=0)
    reference = target.generate(prompts, params)
    sequences = {tuple(p): [*p, *out] for p, out in zip(prompts, reference, strict=True)}
    engine = engines.engine(
        pair, backend="triton", dtype=DTYPES["fp32"], num_spec_tokens=k, cuda_graph=True
    )
    rows: list[list[int]] = []  # per row of the device batch: its request's reference
    loaded: list[DeviceSpecStep] = []
    load = DeviceSpecStep.load

    def recording_load(step: DeviceSpecStep, *args) -> None:
        rows[:] = [sequences[r.prompt_token_ids] for r in engine.scheduler.running]
        loaded[:] = [step]
        load(step, *args)

    compute_logits = engine.runner.draft.compute_logits
    calls = iter(range(10**6))

    def oracle_logits(normed: torch.Tensor) -> torch.Tensor:
        logits, step = compute_logits(normed), next(calls) % k
        for row, sequence in enumerate(rows):
            position = int(loaded[0].draft.positions[row]) + 1 + step  # L + step
            if position < len(sequence):
                token = sequence[position] + (position % ORACLE_ERROR_EVERY == 0)
                logits[row] = 0.0
                logits[row, token % logits.shape[-1]] = 1.0
        return logits

    monkeypatch.setattr(DeviceSpecStep, "load", recording_load)
    monkeypatch.setattr(engine.runner.draft, "compute_logits", oracle_logits)

    outputs = engine.generate(prompts, params, on_step=lambda e: e.block_manager.check_invariants())

    engine.check_no_leaks()
    assert outputs == reference, "the device loop changed the target's greedy tokens"
    assert engine.device_loop.counts["device"] > 0, dict(engine.device_loop.counts)
    spec = engine.stats.spec
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens, "expected accepted and rejected"
    assert spec.accepted_per_position[k - 1] > 0, "no verification accepted all k (bonus)"


def _check_bf16_verification(engines, pair, backend, engine, prompts, outputs) -> None:
    target = engines.engine(pair, backend=backend, dtype=DTYPES["bf16"], num_spec_tokens=0)
    sequences = {
        f"req-{i}": prompt + output
        for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True))
    }
    records = engine.runner.verify_records
    assert records, "no verify chunk ran"
    row_errors = []
    for record in records:
        sequence = sequences[record.request_id]
        context = sequence[: record.start_position]
        expected = teacher_forced_logits(target, context + list(record.token_ids))[
            -len(record.token_ids) :
        ]
        errors = (record.logits.float() - expected).norm(dim=-1) / expected.norm(dim=-1)
        assert float(errors.max()) < BF16_MAX_ROW_RTOL, (
            f"{record.request_id}@{record.start_position}: bf16 verify logits differ from the "
            f"target alone's by {errors.tolist()} per row"
        )
        row_errors.append(errors)
        _check_greedy_emission(record, sequence)
    median = float(torch.cat(row_errors).median())
    assert median < BF16_MEDIAN_ROW_RTOL, f"median bf16 row error {median:.3g}"
    assert engine.stats.spec.num_accepted_tokens > 0, "no draft was ever accepted"


def _check_greedy_emission(record: VerifyRecord, sequence: list[int]) -> None:
    """Position ``start + 1 + j`` holds argmax(logits[j]) for every j up to the first
    draft that differs from it (the recovered token) or the bonus token after all k."""
    drafts = record.token_ids[1:]
    for j, best in enumerate(record.logits.argmax(-1).tolist()):
        position = record.start_position + 1 + j
        if position >= len(sequence):
            return
        assert sequence[position] == best, (
            f"{record.request_id}@{position}: emitted {sequence[position]}, but the verify "
            f"logits' argmax is {best}"
        )
        if j == len(drafts) or drafts[j] != best:
            return


def _record_with_argmax(argmax: list[int], drafts: list[int]) -> VerifyRecord:
    logits = torch.nn.functional.one_hot(torch.tensor(argmax), 8).float() + 0.1
    return VerifyRecord("req-0", 2, (5, *drafts), logits)


@pytest.mark.spec_decode
@pytest.mark.parametrize(
    ("drafts", "emitted", "holds"),
    [
        ([1, 2], [1, 2, 3], True),  # all accepted, bonus 3
        ([1, 7], [1, 2], True),  # second draft rejected, recovered 2
        ([1, 7], [1, 2, 6], True),  # after the recovered token a new verify takes over
        ([1, 7], [1, 7], False),  # a rejected draft was emitted
        ([1, 2], [1, 2, 4], False),  # wrong bonus token
    ],
    ids=["bonus", "recovered", "next-verify-free", "rejected-draft-emitted", "wrong-bonus"],
)
def test_greedy_emission_check(drafts, emitted, holds) -> None:
    """The bf16 check's own judge: it fails exactly when an emission breaks greedy verification."""
    record = _record_with_argmax([1, 2, 3], drafts)
    sequence = [9, 9, 5, *emitted]
    if holds:
        _check_greedy_emission(record, sequence)
    else:
        with pytest.raises(AssertionError, match="argmax"):
            _check_greedy_emission(record, sequence)
