"""The engine loop: schedule, run the target, sample or verify, draft, repeat.

One ``step()``:

1. the scheduler picks chunks (prefill chunks, decodes, 1 + k verify tokens)
   under the token budget, preempting by recompute when blocks run out;
2. the runner runs the target on them (one forward, every backend of every
   attention group);
3. a chunk ending a prefill or decoding samples one token; a verify chunk goes
   through the rejection sampler (greedy or random) and emits 1..k+1 tokens;
4. finished requests give all their blocks back; requests that sampled draft
   ``k`` tokens for the next step.

With CUDA graphs, a greedy speculative batch the runner can keep on the device runs on
``spec_decode.device_loop`` instead: one graph per step, the bookkeeping above done one
step behind while the device computes; ``device_loop.counts`` says why other steps did not.

Start-up builds the runner, whose grouping start-up raises the strict check's
AssertionError under the LEGACY policy on a mixed pair.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attngroup.reference_engine.engine.block_manager import BlockManager
from attngroup.reference_engine.engine.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    greedy_rejection_sample,
    random_rejection_sample,
)
from attngroup.reference_engine.engine.request import Request, SamplingParams
from attngroup.reference_engine.engine.sampler import probs_from_logits, sample
from attngroup.reference_engine.engine.scheduler import ScheduledRequest, Scheduler
from attngroup.reference_engine.engine.spec_decode.device_loop import DeviceLoop
from attngroup.reference_engine.engine.spec_decode.metrics import SpecDecodeStats
from attngroup.reference_engine.engine.spec_decode.proposer import Proposer
from attngroup.reference_engine.model_pairs import ModelPair, get_model_pair


@dataclass(frozen=True)
class EngineConfig:
    pair: str
    backend: str = "torch"
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    policy: str = "split"
    block_size: int = 16
    num_blocks: int = 256
    num_spec_tokens: int = 0
    seed: int = 0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 256
    tp_rank: int = 0
    tp_size: int = 1
    tp_group: Any = field(default=None, compare=False)
    weights_dir: Path | None = None
    cuda_graph: bool = False  # uniform steps from CUDA graphs (attngroup.reference_engine.engine.cuda_graphs.graph_steps)
    max_model_len: int | None = None  # context a captured step holds (None: the runner's default)

    def __post_init__(self) -> None:
        if not 0 <= self.num_spec_tokens <= 8:
            raise ValueError(f"num_spec_tokens must be in 0..8, got {self.num_spec_tokens}")


@dataclass
class StepTimings:
    """Engine-side wall seconds, summed over steps; the runner's own counters
    (``runner.timings``) split model time into target forward, draft forward
    and metadata building."""

    schedule: float = 0.0
    sampling: float = 0.0  # sampling and rejection sampling
    device_wait: float = 0.0  # device steps: the host waiting for a launched step's result


@dataclass
class EngineStats:
    spec: SpecDecodeStats
    num_steps: int = 0
    num_generated_tokens: int = 0
    timings: StepTimings = field(default_factory=StepTimings)


def make_runner(pair: ModelPair, config: EngineConfig) -> Any:
    """The model runner for ``config`` (imported here: it pulls in the models)."""
    from attngroup.reference_engine.engine.model_runner import ModelRunner

    return ModelRunner(
        pair,
        backend=config.backend,
        device=config.device,
        dtype=config.dtype,
        policy=config.policy,
        block_size=config.block_size,
        num_blocks=config.num_blocks,
        num_spec_tokens=config.num_spec_tokens,
        seed=config.seed,
        tp_rank=config.tp_rank,
        tp_size=config.tp_size,
        tp_group=config.tp_group,
        weights_dir=config.weights_dir,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        cuda_graph=config.cuda_graph,
        max_model_len=config.max_model_len,
    )


class LLMEngine:
    def __init__(self, config: EngineConfig, runner: Any = None) -> None:
        self.config = config
        self.pair: ModelPair = get_model_pair(config.pair)
        self.runner = runner or make_runner(self.pair, config)

        self.block_manager = BlockManager.for_group_infos(
            self.runner.kv_cache_group_infos, config.num_blocks
        )
        k = config.num_spec_tokens
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            # After a chunk ending at position e the request holds e + 1 tokens (one
            # sampled) and the drafter writes KV up to len(tokens) + k: reserve k + 1.
            num_lookahead_tokens=k + 1 if k else 0,
        )
        self.proposer = Proposer(self.runner, self.block_manager, k) if k else None
        self.generator = torch.Generator(device="cpu").manual_seed(config.seed)
        self.stats = EngineStats(spec=SpecDecodeStats(k))
        # Greedy speculative steps kept on the device while the batch qualifies.
        self.device_loop = (
            DeviceLoop(self.runner, self.scheduler, self.stats) if k and config.cuda_graph else None
        )
        self._ids = itertools.count()

    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Request:
        token_ids = tuple(int(t) for t in prompt_token_ids)
        request = Request(f"req-{next(self._ids)}", token_ids, params)
        self.scheduler.add_request(request)
        return request

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[Request]:
        """Run one engine step; the requests that finished in it."""
        if self.device_loop is not None:
            finished_on_device = self.device_loop.step()
            if finished_on_device is not None:
                self.stats.num_steps += 1
                return finished_on_device
        timings = self.stats.timings
        started = time.perf_counter()
        output = self.scheduler.schedule()
        if output.preempted:
            self.runner.remove_requests(list(output.preempted))
        timings.schedule += time.perf_counter() - started
        if output.is_empty:
            return []
        target = self.runner.execute_target(output.batch)
        started = time.perf_counter()
        finished: list[Request] = []
        sampled: list[Request] = []
        emissions = self._emit_all(output.scheduled, target.logits)
        for item, emitted in zip(output.scheduled, emissions, strict=True):
            if item.num_draft_tokens:
                self.stats.spec.record(item.num_draft_tokens, len(emitted) - 1)
            before = len(item.request.output_token_ids)
            self.scheduler.update_after_step(item, emitted)
            self.stats.num_generated_tokens += len(item.request.output_token_ids) - before
            (finished if item.request.is_finished else sampled).append(item.request)
        timings.sampling += time.perf_counter() - started
        if finished:
            self.runner.remove_requests([request.request_id for request in finished])
        if self.proposer is not None:
            self.proposer.propose(
                [request for request in sampled if request.is_decoding], self.generator
            )
        self.stats.num_steps += 1
        return finished

    def _emit_all(
        self, scheduled: Sequence[ScheduledRequest], logits: Sequence[torch.Tensor]
    ) -> list[list[int]]:
        """The tokens each chunk emits: none mid-prefill, one after a prefill end or
        decode, the rejection sampler's output after verification.

        Greedy chunks with the same number of drafts are decided together on the logits'
        device, with one copy of their tokens to the host (not one per request); sampled
        chunks draw from the engine's CPU generator one by one, in chunk order."""
        emitted: list[list[int]] = [[] for _ in scheduled]
        greedy_by_drafts: dict[int, list[int]] = {}
        for index, (item, chunk_logits) in enumerate(zip(scheduled, logits, strict=True)):
            if chunk_logits.shape[0] == 0:
                continue
            if item.request.sampling_params.is_greedy:
                greedy_by_drafts.setdefault(item.num_draft_tokens, []).append(index)
            else:
                emitted[index] = self._emit_sampled(item, chunk_logits)
        for num_drafts, indices in greedy_by_drafts.items():
            rows = torch.stack([logits[i][-(num_drafts + 1) :] for i in indices]).float()
            if num_drafts:
                drafts = torch.tensor(
                    [scheduled[i].request.spec_token_ids[:num_drafts] for i in indices],
                    dtype=torch.long,
                ).to(rows.device)
                out = greedy_rejection_sample(drafts, rows).tolist()
            else:
                out = sample(rows, 0.0, self.generator).tolist()
            for index, tokens in zip(indices, out, strict=True):
                emitted[index] = [token for token in tokens if token != PLACEHOLDER_TOKEN_ID]
        return emitted

    def _emit_sampled(self, item: ScheduledRequest, logits: torch.Tensor) -> list[int]:
        """A sampled chunk's tokens, drawn on the CPU with the engine's generator."""
        logits = logits.float().cpu()  # tiny vocabularies; the engine's generator lives on the CPU
        request = item.request
        temperature = request.sampling_params.temperature
        if not item.num_draft_tokens:
            return [int(sample(logits[-1], temperature, self.generator))]
        drafts = torch.tensor([request.spec_token_ids[: item.num_draft_tokens]], dtype=torch.long)
        target_logits = logits[None, -(item.num_draft_tokens + 1) :]
        assert request.spec_probs is not None  # set with the drafts (Proposer.propose)
        draft_probs = request.spec_probs[None, : item.num_draft_tokens].float().cpu()
        out = random_rejection_sample(
            drafts, draft_probs, probs_from_logits(target_logits, temperature), self.generator
        )
        return [token for token in out[0].tolist() if token != PLACEHOLDER_TOKEN_ID]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        on_step: Callable[[LLMEngine], None] | None = None,
    ) -> list[list[int]]:
        """Run ``prompts`` to completion; their generated tokens, in prompt order."""
        requests = [self.add_request(prompt, params) for prompt in prompts]
        while self.has_unfinished:
            self.step()
            if on_step is not None:
                on_step(self)
        return [list(request.output_token_ids) for request in requests]

    def check_no_leaks(self) -> None:
        """Every block back in its pool once no request is left (raises otherwise)."""
        self.block_manager.check_invariants()
        used = self.block_manager.num_used_blocks()
        if not self.has_unfinished and used:
            raise AssertionError(
                f"{used} KV-cache blocks still owned after every request finished: "
                f"{self.block_manager.request_ids}"
            )
