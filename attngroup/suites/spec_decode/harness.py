"""Shared pieces of the speculative-decoding suite: cases by device, prompts,
engines with cached weights, and the oracle drafter.

The pairs' tiny models have random weights, so their drafters almost never
agree with their targets: greedy verification would only ever reject, and the
accept/bonus paths would go untested. ``OracleDrafts`` therefore runs the real
drafter (its KV, hidden-state feed and state rollback all happen) and then
replaces its tokens with the target's own greedy continuation, corrupted at
every fifth position, so verification accepts, rejects and emits bonus tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from attngroup.kernels.registry import get_backend
from attngroup.reference_engine.engine.llm_engine import EngineConfig, LLMEngine, make_runner
from attngroup.reference_engine.engine.request import SamplingParams
from attngroup.reference_engine.engine.step import (
    DraftOutput,
    ProposeInput,
    ScheduledChunk,
    StepBatch,
)
from attngroup.reference_engine.model_pairs import MODEL_PAIRS, get_model_pair

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PAIRS = tuple(MODEL_PAIRS)
MTP_PAIRS = tuple(name for name, pair in MODEL_PAIRS.items() if pair.is_mtp)
MIXED_PAIRS = tuple(name for name, pair in MODEL_PAIRS.items() if pair.is_mixed)
UNIFORM_PAIRS = tuple(name for name, pair in MODEL_PAIRS.items() if not pair.is_mixed)
PROMPT_LENGTHS = (8, 13, 20)  # a batch of mixed lengths, crossing 16-token blocks
MAX_TOKENS = 6
ORACLE_ERROR_EVERY = 5  # k = 3 windows both fully accept (bonus) and reject
#: Triton runs under its interpreter on the CPU (slow): only this case runs there by default.
CPU_TRITON_CASE = ("gemma4-e2b-mtp", 1)


def prompts_for(pair_name: str, seed: int = 0) -> list[list[int]]:
    vocab = get_model_pair(pair_name).target_config().vocab_size
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def case_marks(
    pair_name: str, backend: str, dtype: str, k: int | None = None, tp: int | None = None
) -> list:
    """Markers of one (pair, backend, dtype) case on this machine, ``case`` naming it for
    the run record (a test may run on a backend and dtype it does not take as arguments)."""
    marks = [
        pytest.mark.spec_decode,
        pytest.mark.case(pair=pair_name, backend=backend, dtype=dtype, k=k, tp=tp),
    ]
    if get_model_pair(pair_name).is_mtp:
        marks.append(pytest.mark.mtp)
    if backend == "flashinfer" or dtype != "fp32":
        marks.append(pytest.mark.gpu)
    if not ON_GPU and backend == "flashinfer":
        marks.append(pytest.mark.skip(reason="flashinfer needs a CUDA device"))
    elif not ON_GPU and dtype != "fp32":
        marks.append(pytest.mark.skip(reason="bf16 engine runs are GPU-only in this suite"))
    elif not ON_GPU and backend == "triton" and (pair_name, k) != CPU_TRITON_CASE:
        marks.append(pytest.mark.slow)  # the Triton interpreter: minutes per case on the CPU
    return marks


def engine_cases(pairs: Sequence[str], ks: Sequence[int]) -> list:
    """pytest params pair x backend x dtype x k with ids like gemma4-e2b-mtp-triton-fp32-k1,
    for the dtypes each backend supports (FlashInfer has no fp32 kernels)."""
    return [
        pytest.param(
            pair,
            backend,
            dtype,
            k,
            marks=case_marks(pair, backend, dtype, k),
            id=f"{pair}-{backend}-{dtype}-k{k}",
        )
        for pair in pairs
        for backend in ("torch", "triton", "flashinfer")
        for dtype in DTYPES
        if DTYPES[dtype] in get_backend(backend).supported_dtypes
        for k in ks
    ]


@dataclass
class EngineFactory:
    """Engines for the suite, with each pair's weights written once per session."""

    weights_root: Path

    def config(self, pair: str, **options) -> EngineConfig:
        directory = self.weights_root / pair
        directory.mkdir(parents=True, exist_ok=True)
        options.setdefault("device", DEVICE)
        options.setdefault("num_blocks", 64)
        options.setdefault("max_num_batched_tokens", 64)
        return EngineConfig(pair=pair, weights_dir=directory, **options)

    def engine(
        self, pair: str, *, oracle: dict[tuple[int, ...], list[int]] | None = None, **options
    ) -> LLMEngine:
        config = self.config(pair, **options)
        runner = make_runner(get_model_pair(pair), config)
        if oracle is not None:
            runner = OracleDrafts(runner, oracle)
        return LLMEngine(config, runner=runner)


@dataclass(frozen=True)
class VerifyRecord:
    """One verify chunk and the target logits it produced."""

    request_id: str
    start_position: int
    token_ids: tuple[int, ...]
    logits: torch.Tensor  # [1 + k, vocab]


class OracleDrafts:
    """The real runner, with each draft replaced by the reference continuation
    (corrupted at every ``ORACLE_ERROR_EVERY``-th position), recording every
    verify chunk's logits. See the module docstring."""

    def __init__(self, runner, references: dict[tuple[int, ...], list[int]]) -> None:
        self._runner = runner
        self._references = [list(prompt) + output for prompt, output in references.items()]
        self.num_oracle_drafts = 0
        self.verify_records: list[VerifyRecord] = []

    def __getattr__(self, name: str):
        return getattr(self._runner, name)

    def execute_target(self, batch):
        output = self._runner.execute_target(batch)
        for chunk, logits in zip(batch.chunks, output.logits, strict=True):
            if chunk.logits == "all":
                record = VerifyRecord(
                    chunk.request_id, chunk.start_position, chunk.token_ids, logits.cpu()
                )
                self.verify_records.append(record)
        return output

    def _continuation(self, token_ids: Sequence[int], k: int) -> list[int] | None:
        for reference in self._references:
            if (
                reference[: len(token_ids)] == list(token_ids)
                and len(reference) >= len(token_ids) + k
            ):
                return reference[len(token_ids) : len(token_ids) + k]
        return None

    def propose(self, batch_ctx: ProposeInput, num_spec_tokens: int) -> DraftOutput:
        output = self._runner.propose(batch_ctx, num_spec_tokens)
        tokens = output.draft_token_ids.clone()
        for row, request in enumerate(batch_ctx.requests):
            continuation = self._continuation(request.token_ids, num_spec_tokens)
            if continuation is None:
                continue
            for j, token in enumerate(continuation):
                wrong = (len(request.token_ids) + j) % ORACLE_ERROR_EVERY == 0
                tokens[row, j] = (token + 1) % output.draft_probs.shape[-1] if wrong else token
            self.num_oracle_drafts += 1
        probs = torch.nn.functional.one_hot(tokens, output.draft_probs.shape[-1]).float()
        return replace(output, draft_token_ids=tokens, draft_probs=probs)


def greedy_generate(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    outputs = engine.generate(
        prompts,
        SamplingParams(max_tokens=MAX_TOKENS),
        on_step=lambda e: e.block_manager.check_invariants(),
    )
    engine.check_no_leaks()
    return outputs


def teacher_forced_logits(engine: LLMEngine, token_ids: Sequence[int]) -> torch.Tensor:
    """The engine's target logits at every position of ``token_ids``, run as one prefill."""
    blocks = engine.block_manager
    assert blocks.allocate("teacher-forced", len(token_ids))
    chunk = ScheduledChunk(
        "teacher-forced", tuple(token_ids), 0, blocks.block_ids("teacher-forced"), "all"
    )
    try:
        return engine.runner.execute_target(StepBatch((chunk,))).logits[0].float().cpu()
    finally:
        blocks.free("teacher-forced")
        engine.runner.remove_requests(["teacher-forced"])
