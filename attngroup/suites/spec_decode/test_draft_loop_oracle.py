"""An independent oracle for the k-step paged draft loop, for every pair (CPU in CI).

``ModelRunner.propose`` drafts k tokens on the paged KV cache (torch backend,
float32), at temperature 1 so each step returns softmax(logits). The oracle runs
the same draft modules with the same weights again without any paging: every
attention layer attends in float64 over keys and values kept as whole-sequence
tensors (``dense_attention``), and each draft step is recomputed over the full
sequence so far:

- draft model: the draft LM over prompt + sampled token + earlier drafts;
- EAGLE / MTP: entries p = (hidden state at p, token p + 1), the target's hidden
  states up to L - 2, then the draft's own fed-back output, over all entries;
- Gemma 4 assistant: the target run unpaged over its L - 1 cached tokens gives the
  keys and values the assistant's Q-only layers read; each step's query sits at
  RoPE position L - 1 and attends over positions 0 .. L - 2.

The drafts' distributions must match position by position, and the KV the draft
wrote in the paged cache must equal the oracle's keys and values at every
position it covers (the Q-only assistant must write nothing). Independently of
both, every paged draft pass must use the positions and slot mapping the loop's
contract gives (the drafters of ``attngroup.reference_engine.engine.spec_decode``): a loop that uses the wrong
position for steps 2..k fails all three.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from attngroup.reference_engine.engine.model_runner import ModelRunner
from attngroup.reference_engine.engine.step import (
    ProposeInput,
    ProposeRequest,
    ScheduledChunk,
    StepBatch,
)
from attngroup.reference_engine.model_pairs import MODEL_PAIRS
from attngroup.reference_engine.models import DraftKind
from attngroup.reference_engine.models.common import PagedAttention

pytestmark = pytest.mark.spec_decode

PROB_RTOL = 1e-4  # float32 paged run against the float64 unpaged oracle
KV_RTOL = 1e-5
BLOCKS_PER_REQUEST = 6
BLOCK_SIZE = 16


def prompt_lengths(pair_name: str) -> tuple[int, ...]:
    """Two requests of other lengths, one crossing a page boundary (and a sliding window,
    where Gemma 4's assistant's sliding layers must drop the oldest keys)."""
    windows = [layer.sliding_window for layer in MODEL_PAIRS[pair_name].layers()]
    longest = max((window for window in windows if window), default=0)
    return (5, max(18, longest + 3))


# --- the unpaged attention ---------------------------------------------------------------------


@dataclass
class DenseContext:
    """A forward pass without pages: per layer, the keys and values of positions 0..n-1.

    ``positions`` are the RoPE positions of the query rows; ``mask_positions`` the
    positions the causal and window masks treat them at (they differ only for the
    Gemma 4 assistant, whose query at RoPE position L - 1 sees the cache up to L - 2).
    """

    positions: torch.Tensor
    mask_positions: torch.Tensor
    kv_source: dict[str, str]  # KV-sharing layer -> the layer owning the cache it reads
    keys: dict[str, torch.Tensor] = field(default_factory=dict)
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    rotary_tables: dict = field(default_factory=dict)  # ForwardContext's, made by the stack


def dense_attention(
    module: PagedAttention, query: torch.Tensor, key, value, ctx: DenseContext
) -> torch.Tensor:
    """Causal (windowed, soft-capped) attention in float64 over whole-sequence K/V."""
    name = module.layer_name
    if module.writes_kv:
        ctx.keys[name], ctx.values[name] = key, value  # a pass over the whole sequence
    source = ctx.kv_source.get(name, name)
    keys, values = ctx.keys[source].double(), ctx.values[source].double()
    assert module.impl is not None, f"layer {name}: no attention backend bound"
    layer = module.impl.layer
    group = query.shape[1] // keys.shape[1]
    scores = layer.sm_scale * torch.einsum(
        "qhd,khd->hqk", query.double(), keys.repeat_interleave(group, dim=1)
    )
    if layer.logits_soft_cap:
        scores = layer.logits_soft_cap * torch.tanh(scores / layer.logits_soft_cap)
    key_pos = torch.arange(keys.shape[0], device=query.device)[None, :]
    query_pos = ctx.mask_positions.to(query.device)[:, None]
    visible = key_pos <= query_pos
    if layer.sliding_window is not None:
        visible &= key_pos > query_pos - layer.sliding_window
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    output = torch.einsum("hqk,khd->qhd", probs, values.repeat_interleave(group, dim=1))
    return output.to(query.dtype)


@contextmanager
def unpaged_attention(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``PagedAttention`` attends through ``dense_attention`` for ``DenseContext`` passes."""
    paged_forward = PagedAttention.forward

    def forward(self, query, key, value, ctx):
        if isinstance(ctx, DenseContext):
            return dense_attention(self, query, key, value, ctx)
        return paged_forward(self, query, key, value, ctx)

    with monkeypatch.context() as patch:
        patch.setattr(PagedAttention, "forward", forward)
        yield


def dense_context(runner: ModelRunner, positions, mask_positions=None) -> DenseContext:
    positions = tokens(runner, list(positions))
    sources = {}
    for name in runner.layers:
        source = name
        while (owner := runner.layers[source].kv_sharing_target) is not None:
            source = owner
        if source != name:
            sources[name] = source
    return DenseContext(positions, positions if mask_positions is None else mask_positions, sources)


# --- the oracle per draft kind -----------------------------------------------------------------


@dataclass
class OracleResult:
    probs: list[torch.Tensor]  # per draft step: the draft's distribution
    kv: dict[str, tuple[torch.Tensor, torch.Tensor]]  # draft layer -> K, V at positions 0..n-1


def oracle_draft_model(runner, token_ids: list[int], drafts: list[int]) -> OracleResult:
    probs, ctx = [], None
    for step in range(len(drafts)):
        sequence = token_ids + drafts[:step]
        ctx = dense_context(runner, range(len(sequence)))
        hidden = runner.draft(tokens(runner, sequence), ctx)
        probs.append(torch.softmax(runner.draft.compute_logits(hidden[-1:])[0], dim=-1))
    assert ctx is not None, "no draft steps to recompute"
    return OracleResult(probs, _own_kv(runner, ctx))


def oracle_hidden_conditioned(
    runner, request_id: str, token_ids: list[int], drafts: list[int]
) -> OracleResult:
    length = len(token_ids)
    hidden_in = runner._target_hidden.read(request_id, 0, length - 1)  # the drafter's input
    sequence = token_ids + drafts
    probs, ctx = [], None
    for step in range(len(drafts)):
        entries = length - 1 + step  # entry p: (hidden at p, token p + 1)
        ctx = dense_context(runner, range(entries))
        normed, feedback = runner.draft(tokens(runner, sequence[1 : entries + 1]), hidden_in, ctx)
        probs.append(torch.softmax(runner.draft.compute_logits(normed[-1:])[0], dim=-1))
        hidden_in = torch.cat([hidden_in, feedback[-1:]])
    assert ctx is not None, "no draft steps to recompute"
    return OracleResult(probs, _own_kv(runner, ctx))


def oracle_constant_position(runner, token_ids: list[int], drafts: list[int]) -> OracleResult:
    length = len(token_ids)
    target_ctx = dense_context(runner, range(length - 1))
    hidden = runner.target(tokens(runner, token_ids[:-1]), target_ctx)[-1:]
    probs = []
    inputs = [token_ids[-1], *drafts[:-1]]
    for token in inputs:
        ctx = dense_context(runner, [length - 1], torch.tensor([length - 2]))
        ctx.keys, ctx.values = target_ctx.keys, target_ctx.values
        normed, hidden = runner.draft(tokens(runner, [token]), hidden, ctx)
        probs.append(torch.softmax(runner.draft.compute_logits(normed)[0], dim=-1))
    return OracleResult(probs, {})


def _own_kv(runner, ctx: DenseContext) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {name: (ctx.keys[name], ctx.values[name]) for name in draft_writers(runner)}


def draft_writers(runner: ModelRunner) -> list[str]:
    return [name for name in runner.draft_layer_names if not runner.layers[name].kv_sharing_target]


# --- the paged run and what it recorded --------------------------------------------------------


@dataclass(frozen=True)
class PassRecord:
    positions: list[int]
    slots: dict[str, list[int]]  # draft layer that writes KV -> its slot mapping


def record_passes(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> list[PassRecord]:
    """Every forward pass's RoPE positions and the draft writers' slot mappings."""
    passes: list[PassRecord] = []
    build = runner._forward_context

    def recording(rows, group_ids):
        ctx = build(rows, group_ids)
        tokens = sum(rows.query_lens)
        passes.append(
            PassRecord(
                ctx.positions[:tokens].tolist(),
                {n: ctx.slot_mappings[n][:tokens].tolist() for n in draft_writers(runner)},
            )
        )
        return ctx

    monkeypatch.setattr(runner, "_forward_context", recording)
    return passes


def expected_positions(kind: DraftKind, length: int, k: int) -> list[list[int]]:
    """Per paged draft pass, one request's positions (the first call's catch-up included)."""
    if kind is DraftKind.CONSTANT_POSITION:
        return [[length - 1]]  # metadata built once for the k steps
    if kind is DraftKind.DRAFT_MODEL:
        return [list(range(length))] + [[length - 1 + step] for step in range(1, k)]
    return [list(range(length - 1))] + [[length - 2 + step] for step in range(1, k)]


def slot_of(runner: ModelRunner, layer: str, blocks, position: int) -> int:
    group = next(i for i, g in enumerate(runner.kv_cache_groups) if layer in g.layer_names)
    block_size = runner.kv_cache_groups[group].kv_cache_spec.block_size
    return blocks[group][position // block_size] * block_size + position % block_size


def paged_kv(runner, layer: str, blocks, positions) -> tuple[torch.Tensor, torch.Tensor]:
    slots = tokens(runner, [slot_of(runner, layer, blocks, p) for p in positions])
    key_cache, value_cache = runner.kv_caches[layer]
    flat = (-1, *key_cache.shape[2:])
    return key_cache.view(flat)[slots], value_cache.view(flat)[slots]


def tokens(runner: ModelRunner, values) -> torch.Tensor:
    """int64 ``values`` on the runner's device."""
    return torch.tensor(values, dtype=torch.long, device=runner.device)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.cpu().double(), expected.cpu().double()
    return float((actual - expected).norm() / expected.norm())


# --- the test ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runners(
    tmp_path_factory: pytest.TempPathFactory, device: torch.device
) -> Callable[[str], ModelRunner]:
    cache: dict[str, ModelRunner] = {}

    def get(pair_name: str) -> ModelRunner:
        if pair_name not in cache:
            weights: Path = tmp_path_factory.mktemp(pair_name)
            cache[pair_name] = ModelRunner(
                MODEL_PAIRS[pair_name],
                backend="torch",
                device=device,
                num_blocks=64,
                num_spec_tokens=3,
                weights_dir=weights,
            )
        return cache[pair_name]

    return get


CASES = [
    pytest.param(
        name, k, id=f"{name}-k{k}", marks=[pytest.mark.mtp] if MODEL_PAIRS[name].is_mtp else []
    )
    for name in MODEL_PAIRS
    for k in (1, 3)
]


@pytest.mark.parametrize(("pair_name", "k"), CASES)
@torch.inference_mode()
def test_paged_draft_steps_equal_the_unpaged_recompute(
    runners, monkeypatch: pytest.MonkeyPatch, pair_name: str, k: int
) -> None:
    runner = runners(pair_name)
    generator = torch.Generator().manual_seed(k)
    lengths = prompt_lengths(pair_name)
    prompts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]
    first_blocks = [(k * 2 + i) * BLOCKS_PER_REQUEST for i in range(len(prompts))]
    # Each KV-cache group's table a different rotation of the request's blocks, so that a pass
    # reading another group's table reads other pages.
    blocks = [
        tuple(
            tuple(first + (j + group) % BLOCKS_PER_REQUEST for j in range(BLOCKS_PER_REQUEST))
            for group in range(len(runner.kv_cache_groups))
        )
        for first in first_blocks
    ]
    ids = [f"oracle-k{k}-{i}" for i in range(len(prompts))]
    prefill = runner.execute_target(
        StepBatch(
            tuple(
                ScheduledChunk(i, tuple(p), 0, b, "last")
                for i, p, b in zip(ids, prompts, blocks, strict=True)
            )
        )
    )
    requests = [
        ProposeRequest(i, (*p, int(logits[-1].argmax())), b, temperature=1.0)
        for i, p, b, logits in zip(ids, prompts, blocks, prefill.logits, strict=True)
    ]
    caches_before = {name: tuple(t.clone() for t in kv) for name, kv in runner.kv_caches.items()}
    passes = record_passes(runner, monkeypatch)
    drafts = runner.propose(ProposeInput(tuple(requests), torch.Generator().manual_seed(7)), k)
    monkeypatch.undo()

    kind = runner.draft_kind
    for pass_index, record in enumerate(passes):
        expected = [expected_positions(kind, len(r.token_ids), k)[pass_index] for r in requests]
        assert record.positions == [p for rows in expected for p in rows], f"pass {pass_index}"
        for layer, slots in record.slots.items():
            wanted = [
                slot_of(runner, layer, r.block_ids, p)
                for r, rows in zip(requests, expected, strict=True)
                for p in rows
            ]
            assert slots == wanted, f"pass {pass_index}: slot mapping of {layer}"
    assert len(passes) == len(expected_positions(kind, 2, k))

    with unpaged_attention(monkeypatch):
        for row, request in enumerate(requests):
            token_ids, drafted = list(request.token_ids), drafts.draft_token_ids[row].tolist()
            if kind is DraftKind.DRAFT_MODEL:
                oracle = oracle_draft_model(runner, token_ids, drafted)
            elif kind is DraftKind.HIDDEN_CONDITIONED:
                oracle = oracle_hidden_conditioned(runner, request.request_id, token_ids, drafted)
            else:
                oracle = oracle_constant_position(runner, token_ids, drafted)
            for step, oracle_probs in enumerate(oracle.probs):
                error = relative_error(drafts.draft_probs[row, step], oracle_probs)
                assert error < PROB_RTOL, f"{request.request_id} step {step + 1}: {error:.2e}"
            for layer, (keys, values) in oracle.kv.items():
                paged_keys, paged_values = paged_kv(
                    runner, layer, request.block_ids, range(keys.shape[0])
                )
                assert relative_error(paged_keys, keys) < KV_RTOL, f"{layer} keys"
                assert relative_error(paged_values, values) < KV_RTOL, f"{layer} values"
    if kind is DraftKind.CONSTANT_POSITION:
        for name, kv in runner.kv_caches.items():
            assert all(torch.equal(a, b) for a, b in zip(kv, caches_before[name], strict=True)), (
                f"the Q-only drafter changed {name}'s cache"
            )
    runner.remove_requests(ids)
