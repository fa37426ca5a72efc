"""Twin runners for the CUDA-graph suite: one eager, one with ``cuda_graph=True``, same weights.

Both get the same poisoned KV caches (random values, never zeros, block 0 included: the
padding requests of a captured step read the null block), then the same prefill, verify
and draft calls; the suite compares the verify logits, every draft step's logits (recorded
at ``compute_logits``) and the KV caches. On the CPU the graph runner replays through
``HostReplay``; on CUDA through real graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from attngroup.reference_engine.engine.cuda_graphs.graph_steps import GraphSteps
from attngroup.reference_engine.engine.model_runner import ModelRunner
from attngroup.reference_engine.engine.step import (
    ProposeInput,
    ProposeRequest,
    ScheduledChunk,
    StepBatch,
)
from attngroup.reference_engine.model_pairs import get_model_pair

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
K = 2  # drafts per step: verify q_len 3, one draft decode step after the catch-up (two for the assistant)
MAX_NUM_SEQS = 4  # buckets 1, 2, 4: a batch of 3 pads to 4
MAX_MODEL_LEN = 96  # context capacity of the captured steps
BLOCKS_PER_REQUEST = 6  # 96 tokens at block size 16
NUM_BLOCKS = 1 + MAX_NUM_SEQS * BLOCKS_PER_REQUEST  # block 0 is the null block
# ||graph - eager|| / ||eager||: the same kernels, launched with the captured plan (its
# max_seq_len is the capacity, so Triton may split the keys into other segments).
RTOL = {"fp32": 1e-4, "bf16": 5e-2}


@dataclass
class TwinRunners:
    eager: ModelRunner
    graph: ModelRunner
    draft_logits: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    @property
    def both(self) -> tuple[tuple[str, ModelRunner], ...]:
        return (("eager", self.eager), ("graph", self.graph))

    @property
    def graph_steps(self) -> GraphSteps:
        """The graph runner's captured steps (it is made with ``cuda_graph=True``)."""
        steps = self.graph.cuda_graphs
        assert steps is not None, "the graph runner has no CUDA graphs"
        return steps


def make_twins(
    pair: str,
    backend: str,
    dtype: str,
    *,
    record_drafts: bool = True,
    max_model_len: int = MAX_MODEL_LEN,
) -> TwinRunners:
    """Eager and graph runners of one pair; ``record_drafts`` records every draft logits call
    (on the host: not for a graph that captures the draft's lm-head itself);
    ``max_model_len``: the context capacity of the graph runner's captured steps."""

    def runner(cuda_graph: bool) -> ModelRunner:
        return ModelRunner(
            get_model_pair(pair),
            backend=backend,
            device=DEVICE,
            dtype=DTYPES[dtype],
            num_blocks=NUM_BLOCKS,
            num_spec_tokens=K,
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_SEQS * MAX_MODEL_LEN,
            cuda_graph=cuda_graph,
            max_model_len=max_model_len,
        )

    twins = TwinRunners(eager=runner(False), graph=runner(True))
    for name, each in twins.both:
        twins.draft_logits[name] = _record_draft_logits(each) if record_drafts else []
    return twins


def _record_draft_logits(runner: ModelRunner) -> list[torch.Tensor]:
    """Every draft ``compute_logits`` result of ``runner`` (the draft steps' outputs), in order."""
    recorded: list[torch.Tensor] = []
    compute = runner.draft.compute_logits

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        logits = compute(hidden)
        recorded.append(logits.float().cpu())
        return logits

    # An instance attribute that shadows the model's method (mypy refuses a method assignment).
    object.__setattr__(runner.draft, "compute_logits", recording)
    return recorded


def poison(twins: TwinRunners, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Fill both runners' KV caches with the same random values; a host copy of them per
    layer that owns its cache (a KV-sharing layer's tensors are its owner's)."""
    generator = torch.Generator().manual_seed(seed)
    snapshot: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    seen: set[int] = set()
    for name, (key, value) in twins.eager.kv_caches.items():
        if key.data_ptr() in seen:
            continue
        seen.add(key.data_ptr())
        fresh = [torch.randn(t.shape, generator=generator).to(t.dtype) for t in (key, value)]
        for _, runner in twins.both:
            for cache, data in zip(runner.kv_caches[name], fresh, strict=True):
                cache.copy_(data)
        snapshot[name] = (fresh[0], fresh[1])
    return snapshot


def blocks_of(runner: ModelRunner, slot: int) -> tuple[tuple[int, ...], ...]:
    """Request ``slot``'s blocks (1-based: block 0 stays the null block) in every KV-cache group."""
    first = 1 + slot * BLOCKS_PER_REQUEST
    return (tuple(range(first, first + BLOCKS_PER_REQUEST)),) * len(runner.kv_cache_groups)


@dataclass(frozen=True)
class Batch:
    """``prompts[i]`` of request ``ids[i]``, in block slot ``i``."""

    ids: tuple[str, ...]
    prompts: tuple[tuple[int, ...], ...]


def make_batch(pair: str, num_reqs: int, lengths: Sequence[int], seed: int, tag: str) -> Batch:
    vocab = get_model_pair(pair).target_config().vocab_size
    generator = torch.Generator().manual_seed(seed)
    prompts = tuple(
        tuple(torch.randint(0, vocab, (lengths[i % len(lengths)],), generator=generator).tolist())
        for i in range(num_reqs)
    )
    return Batch(ids=tuple(f"{tag}-{i}" for i in range(num_reqs)), prompts=prompts)


def prefill(runner: ModelRunner, batch: Batch) -> None:
    runner.execute_target(
        StepBatch(
            tuple(
                ScheduledChunk(rid, prompt, 0, blocks_of(runner, i), "last")
                for i, (rid, prompt) in enumerate(zip(batch.ids, batch.prompts, strict=True))
            )
        )
    )


def verify(
    runner: ModelRunner, batch: Batch, tokens: Sequence[Sequence[int]], starts: Sequence[int]
) -> tuple[torch.Tensor, ...]:
    """One verify chunk of ``1 + K`` tokens per request at ``starts``; its logits."""
    output = runner.execute_target(
        StepBatch(
            tuple(
                ScheduledChunk(rid, tuple(chunk), start, blocks_of(runner, i), "all")
                for i, (rid, chunk, start) in enumerate(zip(batch.ids, tokens, starts, strict=True))
            )
        )
    )
    return tuple(logits.float().cpu() for logits in output.logits)


def propose(runner: ModelRunner, batch: Batch, sequences: Sequence[Sequence[int]]) -> list[int]:
    output = runner.propose(
        ProposeInput(
            tuple(
                ProposeRequest(rid, tuple(sequence), blocks_of(runner, i))
                for i, (rid, sequence) in enumerate(zip(batch.ids, sequences, strict=True))
            )
        ),
        K,
    )
    return output.draft_token_ids.flatten().tolist()


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64; NaN anywhere fails (inf)."""
    actual, expected = actual.double(), expected.double()
    if not (torch.isfinite(actual).all() and torch.isfinite(expected).all()):
        return float("inf")
    return float((actual - expected).norm() / expected.norm())


def check_caches(twins: TwinRunners, before: dict, num_reqs: int, bound: float) -> None:
    """Blocks no request owns (the null block 0 and the slots of absent requests) are as
    poisoned, bit for bit; the owned blocks match the eager runner's."""
    owned_end = 1 + num_reqs * BLOCKS_PER_REQUEST
    for name in before:
        key, value = twins.graph.kv_caches[name]
        eager_key, eager_value = twins.eager.kv_caches[name]
        for cache, eager_cache, poisoned in (
            (key, eager_key, before[name][0]),
            (value, eager_value, before[name][1]),
        ):
            cache = cache.cpu()
            untouched = torch.cat([cache[:1], cache[owned_end:]])
            expected = torch.cat([poisoned[:1], poisoned[owned_end:]])
            assert torch.equal(untouched, expected), f"{name}: a block no request owns was written"
            error = relative_error(cache[1:owned_end], eager_cache.cpu()[1:owned_end])
            assert error <= bound, f"{name}: KV differs from eager by {error:.2e}"
