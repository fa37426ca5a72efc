"""The model runner: a pair's tiny target and draft on the paged KV cache.

Interface with the engine loop (helper H codes against the dataclasses below;
their fields are stable):

- ``execute_target(StepBatch) -> TargetOutput``: runs the target on every
  chunk, writes its KV, returns logits per chunk. The runner also keeps, per
  request, the target's last hidden state at every position it ran (the input
  EAGLE / MTP / the Gemma 4 assistant need), so the engine never carries
  hidden states around.
- ``propose(ProposeInput, k) -> DraftOutput``: after the target sampled, give
  every drafting request its full token list (prompt + accepted outputs, ending
  with the token just sampled; L tokens, the target has validly cached L - 1).
  The runner brings the draft up to date and drafts ``k`` tokens:

  * draft model (own KV): runs the tokens its cache has not seen (prompt on
    the first call), positions ``seen .. L-1``, then k - 1 decode steps;
  * EAGLE / MTP (own KV): entry p = (target hidden state at p, token p + 1) at
    position p, for the entries not yet run up to p = L - 2; then k - 1 steps
    fed with the draft's own last-layer output (before its final norm);
  * Gemma 4 assistant (Q-only, no KV writes): each of the k steps has one query
    per request at the constant RoPE position L - 1 (transformers' candidate
    generator: ``position_ids = input_ids.shape[1] - 1``) attending over the
    target's cache at positions 0 .. L - 2, i.e. everything the target has
    validly cached and nothing of rejected drafts (the backend sees
    seq_len = L - 1, query_len = 1; sliding layers: the last ``sliding_window``
    of those positions, as vLLM's draft layer with the target layer's window;
    transformers' bidirectional sliding mask admits one key more, and its
    candidate generator also lets the query see the KV of a rejected draft at
    position L - 1: we do neither). Metadata is built once for the k steps
    (vLLM's constant draft positions). Input: target embedding of the last
    token + target hidden state at L - 2, then the post-projected draft state.

  Drafts are greedy (``draft_probs`` one-hot) at temperature 0, else sampled
  from softmax(logits / T) with ``ProposeInput.generator``.
- State layers (Qwen3-Next): a verify chunk (``logits="all"``) folds rejected
  tokens into the recurrent state too. The runner saves the request's state
  slots before such a chunk; when it learns how many tokens were valid (the
  next chunk's ``start_position``, or L - 1 in ``propose``) it restores them and
  replays the accepted prefix (one extra target pass, logits "none").
- ``remove_requests(ids)``: forget finished / preempted requests.
- ``kv_cache_group_infos``: per KV-cache group, what the block manager needs.
- ``timings`` (seconds: metadata building, target forward, draft forward; on
  CUDA the forwards wait for their kernels, see ``RunnerTimings``) and
  ``num_common_metadata_builds`` (one per KV-cache group a pass touches).

Block tables: ``ScheduledChunk.block_ids`` / ``ProposeRequest.block_ids`` are
indexed by KV-cache group id (block ids in that group's block size). A
request's blocks must cover every position written: ``start_position +
len(token_ids)`` for a target chunk and ``len(token_ids) + num_spec_tokens``
for a propose call (the draft writes its own KV for drafted positions, which
later steps overwrite); a shortfall raises ``BlockTableError``. State groups
keep a request's recurrent state in its first block.

Start-up on the CPU needs ``TRITON_INTERPRET=1`` before triton is imported:
the KV write is a Triton kernel. Tensor parallelism: each rank builds its
shard of the models (``reference_engine.models.parallel``) and the layers of
``pair.layers(tp_size)``; ``tp_group`` (or the default process group) carries
the all-reduces; every rank must get the same batches.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
from torch import nn

from kernels.registry import get_backend
from reference_engine.attention_groups import AttentionGroup, GroupingPolicy
from reference_engine.forward_metadata import BlockTableError as BlockTableError  # re-exported
from reference_engine.forward_metadata import ForwardMetadataBuilder
from reference_engine.grouping_plan import plan_grouping
from reference_engine.kv_cache_spec import (
    AttentionSpec,
    KVCacheGroupSpec,
    MambaSpec,
    UniformTypeKVCacheSpecs,
)
from reference_engine.layers import LayerDescription, LayerKind
from reference_engine.model_pairs import ModelPair
from reference_engine.models import DraftKind, build_pair_models
from reference_engine.models.common import ForwardContext, PagedAttention
from reference_engine.models.parallel import TensorParallel
from reference_engine.step import ScheduledChunk, StepBatch
from reference_engine.weights import pair_weight_files


@dataclass(frozen=True)
class KVCacheGroupInfo:
    """One KV-cache group as the block manager sees it."""

    group_id: int
    block_size: int  # the group spec's block size (page-size unification may scale it)
    sliding_window: int | None  # tokens a query sees (HF convention, counts itself); None = all
    is_state: bool  # a Mamba-like state group: one block per request holds its state
    layer_names: tuple[str, ...]
    draft_writes: bool  # some draft layer of this group writes its own KV (EAGLE/MTP/draft model)


@dataclass(frozen=True)
class TargetOutput:
    """What one target step returns, in ``StepBatch.chunks`` order."""

    # Per chunk: [1, vocab] for logits="last", [len(token_ids), vocab] for "all",
    # [0, vocab] for "none"; float32.
    logits: tuple[torch.Tensor, ...]
    # Per chunk: [len(token_ids), hidden] target last hidden states (after the
    # final norm, the input of lm_head); also kept inside the runner for propose.
    hidden_states: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class ProposeRequest:
    request_id: str
    # Prompt + accepted output tokens, ending with the token the target just sampled.
    token_ids: tuple[int, ...]
    # Per KV-cache group id; must cover len(token_ids) + num_spec_tokens positions.
    block_ids: tuple[tuple[int, ...], ...]
    # 0 drafts greedily (draft_probs one-hot); > 0 samples drafts from softmax(logits / T).
    temperature: float = 0.0


@dataclass(frozen=True)
class ProposeInput:
    requests: tuple[ProposeRequest, ...]
    generator: torch.Generator | None = None  # for sampled drafts (temperature > 0)


@dataclass(frozen=True)
class DraftOutput:
    draft_token_ids: torch.Tensor  # int64 [num_requests, k]
    draft_probs: torch.Tensor  # float32 [num_requests, k, vocab]: q(x) the draft sampled from


@dataclass
class RunnerTimings:
    """Wall seconds summed over calls. ``metadata`` is part of the two others.

    On CUDA, ``execute_target`` and ``propose`` wait for the device before they
    stop their clocks, so the forward times cover the kernels, not only their
    launches. The wait costs nothing extra: the engine reads the logits and
    drafts on the host right after, which would wait for the same kernels.
    ``metadata`` is host time (the step's copy to the device is asynchronous).
    """

    metadata: float = 0.0  # CommonAttentionMetadata + builder.build
    target_forward: float = 0.0
    draft_forward: float = 0.0


def _kv_group_window(spec) -> int | None:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        spec = spec.kv_cache_specs[0][1]
    return getattr(spec, "sliding_window", None)


class _HiddenStateBuffer:
    """The target's last hidden state at every position it ran, per request.

    Entries past the latest accepted position may belong to rejected verify
    tokens; readers only ask for positions below ``len(token_ids) - 1``, which
    the target has validly computed."""

    def __init__(self) -> None:
        self._states: dict[str, torch.Tensor] = {}
        self._lengths: dict[str, int] = {}

    def write(self, request_id: str, start: int, states: torch.Tensor) -> None:
        end = start + states.shape[0]
        buffer = self._states.get(request_id)
        if buffer is None or buffer.shape[0] < end:
            grown = states.new_zeros(
                max(end, 2 * (0 if buffer is None else buffer.shape[0])), states.shape[1]
            )
            if buffer is not None:
                grown[: buffer.shape[0]] = buffer
            self._states[request_id] = buffer = grown
        buffer[start:end] = states
        self._lengths[request_id] = end

    def read(self, request_id: str, start: int, end: int) -> torch.Tensor:
        """States of positions [start, end)."""
        have = self._lengths.get(request_id, 0)
        if end > have:
            raise RuntimeError(
                f"request {request_id}: the drafter needs the target's hidden states up to position "
                f"{end - 1}, but the target has run only {have} positions; run execute_target on the "
                "request's tokens before propose"
            )
        return self._states[request_id][start:end]

    def remove(self, request_id: str) -> None:
        self._states.pop(request_id, None)
        self._lengths.pop(request_id, None)


@dataclass(frozen=True)
class _StepRows:
    """One forward pass over a batch: per request, the tokens run and where they sit."""

    request_ids: tuple[str, ...]
    token_ids: torch.Tensor  # int64 [num_tokens]
    seq_lens: tuple[int, ...]  # per request: context + this pass's tokens (the backend's view)
    query_lens: tuple[int, ...]
    block_ids: tuple[tuple[tuple[int, ...], ...], ...]  # per request, per KV-cache group
    # int64 [num_tokens]; None: the backend's positions (seq_len - query_len + i), which
    # the metadata computes anyway. Only the Gemma 4 assistant's constant position differs.
    rope_positions: torch.Tensor | None = None

    @property
    def last_rows(self) -> torch.Tensor:
        return torch.tensor(self.query_lens).cumsum(0) - 1


class ModelRunner:
    """A pair's target and draft on the paged KV cache (see the module docstring).

    Start-up follows vLLM: layer descriptions -> ``plan_grouping`` (LEGACY on a
    mixed pair raises vLLM's AssertionError here) -> one metadata builder per
    attention group -> KV caches per layer with its own spec (KV-sharing layers
    read their target's tensors; state layers get ``[num_blocks, *state]``).
    Each forward pass builds ``CommonAttentionMetadata`` once per KV-cache group
    it touches, all of them in one ``StepMetadataBuilder`` build from persistent
    buffers (``reference_engine.forward_metadata``), and hands each object to
    every builder of its group (``num_common_metadata_builds`` counts them). A
    pass's metadata is valid until the next pass builds.
    """

    def __init__(
        self,
        pair: ModelPair,
        *,
        backend: str = "torch",
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        policy: GroupingPolicy | str = "split",
        block_size: int = 16,
        num_blocks: int = 256,
        num_spec_tokens: int = 0,
        seed: int = 0,
        tp_rank: int = 0,
        tp_size: int = 1,
        tp_group: Any = None,
        weights_dir: Path | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 8192,
    ) -> None:
        if tp_size > 1 and tp_group is None and not torch.distributed.is_initialized():
            raise ValueError(
                f"tp_size={tp_size} needs torch.distributed initialised (or a tp_group) for the all-reduces"
            )
        self.tp = TensorParallel(tp_rank, tp_size, tp_group)
        self.pair = pair
        self.device = torch.device(device)
        self.dtype = dtype
        self.num_blocks = num_blocks
        self.num_spec_tokens = num_spec_tokens
        self.timings = RunnerTimings()
        self.num_common_metadata_builds = 0
        self.layers: dict[str, LayerDescription] = {
            layer.name: layer for layer in pair.layers(tp_size, backend)
        }
        _check_backends(self.layers.values(), self.device, dtype, block_size)

        plan = plan_grouping(list(self.layers.values()), policy, block_size, dtype)
        plan.raise_on_error()  # a grouping error is the model's, whatever the device: report it first
        _check_kv_write_available(self.device)
        self.kv_cache_groups: tuple[KVCacheGroupSpec, ...] = plan.kv_cache_groups
        self.attention_groups: tuple[tuple[AttentionGroup, ...], ...] = tuple(
            tuple(entry.group for entry in row) for row in plan.attention_groups
        )
        self._group_of_layer = {
            name: group_id
            for group_id, group in enumerate(self.kv_cache_groups)
            for name in group.layer_names
        }
        self._create_builders(max_num_seqs, max_num_batched_tokens, num_spec_tokens)
        self.kv_cache_group_infos = tuple(
            self._group_info(i) for i in range(len(self.kv_cache_groups))
        )
        self._metadata = ForwardMetadataBuilder(
            self.kv_cache_groups,
            self.attention_groups,
            [info.is_state for info in self.kv_cache_group_infos],
            self.device,
            max_num_seqs=max_num_seqs,
            max_num_tokens=max_num_batched_tokens,
        )

        with tempfile.TemporaryDirectory() as scratch:
            files = pair_weight_files(
                pair, seed, Path(weights_dir) if weights_dir else Path(scratch)
            )
            models = build_pair_models(pair, files.target, files.draft, self.device, dtype, self.tp)
        self.target, self.draft, self.draft_kind = models.target, models.draft, models.draft_kind
        self._bind_attention_layers()
        self.kv_caches, self.state_caches = self._allocate_caches()
        self._target_groups = self._groups_of(self.target_layer_names)
        self._draft_groups = self._groups_of(self.draft_layer_names)
        self._target_hidden = _HiddenStateBuffer()
        self._draft_progress: dict[str, int] = {}
        self._state_snapshots: dict[str, tuple[int, tuple[int, ...], dict]] = {}

    # --- start-up ---------------------------------------------------------------------------

    @property
    def target_layer_names(self) -> tuple[str, ...]:
        return tuple(name for name, layer in self.layers.items() if not layer.is_draft)

    @property
    def draft_layer_names(self) -> tuple[str, ...]:
        return tuple(name for name, layer in self.layers.items() if layer.is_draft)

    def _create_builders(
        self, max_num_seqs: int, max_num_batched_tokens: int, num_spec_tokens: int
    ) -> None:
        options = dict(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_query_len=num_spec_tokens + 1,
        )
        for group in self._all_attention_groups():
            group.create_metadata_builders(self.layers, self.device, num_builders=1, **options)

    def _all_attention_groups(self) -> Iterable[AttentionGroup]:
        return (group for row in self.attention_groups for group in row)

    def _group_info(self, group_id: int) -> KVCacheGroupInfo:
        group = self.kv_cache_groups[group_id]
        spec = group.kv_cache_spec
        writers = [
            name
            for name in group.layer_names
            if self.layers[name].is_draft and not self.layers[name].kv_sharing_target
        ]
        return KVCacheGroupInfo(
            group_id=group_id,
            block_size=spec.block_size,
            sliding_window=_kv_group_window(spec),
            is_state=isinstance(spec, MambaSpec),
            layer_names=group.layer_names,
            draft_writes=bool(writers),
        )

    def _bind_attention_layers(self) -> None:
        """Give every attention module its backend implementation; check the
        models' layers are exactly the pair's described layers."""
        modules: dict[str, nn.Module] = {}
        for model in (self.target, self.draft):
            for module in model.modules():
                name = getattr(module, "layer_name", None)
                if name is not None:
                    modules[name] = module
        if set(modules) != set(self.layers):
            raise RuntimeError(
                f"model pair {self.pair.name}: the engine models' layers differ from the pair's layer "
                f"descriptions: only in the models {sorted(set(modules) - set(self.layers))}, only in "
                f"the descriptions {sorted(set(self.layers) - set(modules))}"
            )
        for group in self._all_attention_groups():
            impl_cls = group.backend.get_impl_cls()
            for name in group.layer_names:
                module, layer = modules[name], self.layers[name]
                if not isinstance(module, PagedAttention):
                    continue
                if module.writes_kv != (layer.kv_sharing_target is None):
                    raise RuntimeError(
                        f"layer {name}: the model's KV sharing disagrees with the pair's description"
                    )
                module.bind(impl_cls(layer.attention_params()))

    def _allocate_caches(self):
        kv_caches: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        state_caches: dict[str, tuple[torch.Tensor, ...]] = {}
        for group in self.kv_cache_groups:
            block_size = group.kv_cache_spec.block_size
            for name in group.layer_names:
                if self.layers[name].kv_sharing_target is not None:
                    continue
                spec = group.spec_for(name)
                if isinstance(spec, MambaSpec):
                    state_caches[name] = tuple(
                        torch.zeros(self.num_blocks, *shape, dtype=dtype, device=self.device)
                        for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)
                    )
                elif isinstance(spec, AttentionSpec):
                    shape = (self.num_blocks, block_size, spec.num_kv_heads, spec.head_size)
                    kv_caches[name] = (
                        torch.zeros(shape, dtype=spec.dtype, device=self.device),
                        torch.zeros(shape, dtype=spec.dtype, device=self.device),
                    )
                else:
                    raise TypeError(f"layer {name}: no cache layout for {type(spec).__name__}")
        for name, layer in self.layers.items():
            if layer.kv_sharing_target is not None:
                source = layer.kv_sharing_target
                while self.layers[source].kv_sharing_target is not None:
                    source = self.layers[source].kv_sharing_target
                kv_caches[name] = kv_caches[source]
        return kv_caches, state_caches

    def _groups_of(self, layer_names: Iterable[str]) -> tuple[int, ...]:
        return tuple(sorted({self._group_of_layer[name] for name in layer_names}))

    # --- per-pass metadata --------------------------------------------------------------------

    def _forward_context(self, rows: _StepRows, group_ids: Sequence[int]) -> ForwardContext:
        """Every KV-cache group's common metadata from one step build (valid until the
        next pass builds), then each attention group's builder builds from its group's."""
        started = time.perf_counter()
        metadata = self._metadata.build(
            rows.seq_lens,
            rows.query_lens,
            self._metadata.block_tables(rows.request_ids, rows.seq_lens, rows.block_ids, group_ids),
        )
        self.num_common_metadata_builds += metadata.num_common_builds
        positions = metadata.positions
        if rows.rope_positions is not None:
            positions = rows.rope_positions.to(self.device)
        self.timings.metadata += time.perf_counter() - started
        return ForwardContext(
            positions=positions,
            attn_metadata=metadata.attn_metadata,
            kv_caches=self.kv_caches,
            slot_mappings=metadata.slot_mappings,
            state_caches=self.state_caches,
        )

    # --- target ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute_target(self, batch: StepBatch) -> TargetOutput:
        started = time.perf_counter()
        chunks = batch.chunks
        if not chunks:
            raise ValueError("execute_target: empty StepBatch")
        for chunk in chunks:
            _check_chunk(chunk)
            self._roll_back_state(chunk.request_id, chunk.start_position, chunk.block_ids)
        self._snapshot_state(chunks)
        hidden_per_chunk = self._run_target(chunks)
        logits = tuple(
            self.target.compute_logits(
                {"last": states[-1:], "all": states, "none": states[:0]}[chunk.logits]
            )
            for chunk, states in zip(chunks, hidden_per_chunk, strict=True)
        )
        _wait_for_device(self.device)
        self.timings.target_forward += time.perf_counter() - started
        return TargetOutput(logits=logits, hidden_states=hidden_per_chunk)

    def _run_target(self, chunks: Sequence[ScheduledChunk]) -> tuple[torch.Tensor, ...]:
        """The target over ``chunks``; their final-normed hidden states, also kept for drafting."""
        rows = _StepRows(
            request_ids=tuple(c.request_id for c in chunks),
            token_ids=torch.tensor([t for c in chunks for t in c.token_ids], dtype=torch.long),
            seq_lens=tuple(c.start_position + len(c.token_ids) for c in chunks),
            query_lens=tuple(len(c.token_ids) for c in chunks),
            block_ids=tuple(c.block_ids for c in chunks),
        )
        hidden = self.target(
            rows.token_ids.to(self.device), self._forward_context(rows, self._target_groups)
        )
        per_chunk = torch.split(hidden, list(rows.query_lens))
        for chunk, states in zip(chunks, per_chunk, strict=True):
            self._target_hidden.write(chunk.request_id, chunk.start_position, states)
        return tuple(per_chunk)

    # State layers fold every token they see into the request's state, rejected
    # verify tokens too. Before a verify chunk (logits="all") the runner saves
    # the request's state slots; once it learns how many tokens were accepted
    # (the next chunk's start_position, or len(token_ids) - 1 in propose) it
    # restores them and replays the accepted prefix of that chunk.

    def _snapshot_state(self, chunks: Sequence[ScheduledChunk]) -> None:
        if not self.state_caches:
            return
        for chunk in chunks:
            if chunk.logits != "all":
                continue
            saved = {}
            for name, caches in self.state_caches.items():
                slot = chunk.block_ids[self._group_of_layer[name]][0]
                saved[name] = (slot, tuple(cache[slot].clone() for cache in caches))
            self._state_snapshots[chunk.request_id] = (chunk.start_position, chunk.token_ids, saved)

    def _roll_back_state(self, request_id: str, num_valid: int, block_ids) -> None:
        """Make the state layers hold exactly the first ``num_valid`` tokens."""
        snapshot = self._state_snapshots.pop(request_id, None)
        if snapshot is None:
            return
        start, token_ids, saved = snapshot
        if num_valid >= start + len(token_ids):
            return
        if num_valid <= start:
            raise RuntimeError(
                f"request {request_id}: {num_valid} valid tokens, but its last verify chunk started "
                f"at position {start} (its first token is always accepted)"
            )
        for name, (slot, tensors) in saved.items():
            for cache, tensor in zip(self.state_caches[name], tensors, strict=True):
                cache[slot] = tensor
        self._run_target(
            [ScheduledChunk(request_id, token_ids[: num_valid - start], start, block_ids, "none")]
        )

    def remove_requests(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._target_hidden.remove(request_id)
            self._draft_progress.pop(request_id, None)
            self._state_snapshots.pop(request_id, None)

    # --- draft ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, batch_ctx: ProposeInput, num_spec_tokens: int) -> DraftOutput:
        started = time.perf_counter()
        if num_spec_tokens < 1:
            raise ValueError(f"propose: num_spec_tokens must be >= 1, got {num_spec_tokens}")
        requests = batch_ctx.requests
        if not requests:
            raise ValueError("propose: no requests")
        for request in requests:
            if len(request.token_ids) < 2:
                raise ValueError(
                    f"request {request.request_id}: propose needs the prompt and the token the target "
                    f"sampled after it, got {len(request.token_ids)} token(s)"
                )
            self._roll_back_state(request.request_id, len(request.token_ids) - 1, request.block_ids)
        propose_fn = {
            DraftKind.DRAFT_MODEL: self._propose_draft_model,
            DraftKind.HIDDEN_CONDITIONED: self._propose_hidden_conditioned,
            DraftKind.CONSTANT_POSITION: self._propose_constant_position,
        }[self.draft_kind]
        tokens, probs = propose_fn(requests, num_spec_tokens, batch_ctx.generator)
        _wait_for_device(self.device)
        self.timings.draft_forward += time.perf_counter() - started
        return DraftOutput(
            draft_token_ids=torch.stack(tokens, dim=1), draft_probs=torch.stack(probs, dim=1)
        )

    def _decode_rows(
        self, requests: Sequence[ProposeRequest], token_ids: torch.Tensor, positions: Sequence[int]
    ) -> _StepRows:
        """One token per request at ``positions`` (writes there: seq_len = position + 1)."""
        return _StepRows(
            request_ids=tuple(r.request_id for r in requests),
            token_ids=token_ids,
            seq_lens=tuple(p + 1 for p in positions),
            query_lens=(1,) * len(requests),
            block_ids=tuple(r.block_ids for r in requests),
        )

    def _propose_draft_model(self, requests, k, generator):
        """A separate LM with its own KV: catch its cache up on the tokens it has
        not seen (prefill too), then decode k tokens."""
        lengths = [len(r.token_ids) for r in requests]
        starts = [
            min(self._draft_progress.get(r.request_id, 0), n - 1)
            for r, n in zip(requests, lengths, strict=True)
        ]
        rows = _StepRows(
            request_ids=tuple(r.request_id for r in requests),
            token_ids=torch.tensor(
                [t for r, s in zip(requests, starts, strict=True) for t in r.token_ids[s:]]
            ),
            seq_lens=tuple(lengths),
            query_lens=tuple(n - s for s, n in zip(starts, lengths, strict=True)),
            block_ids=tuple(r.block_ids for r in requests),
        )
        hidden = self.draft(
            rows.token_ids.to(self.device), self._forward_context(rows, self._draft_groups)
        )
        token, prob = _sample_drafts(
            self.draft.compute_logits(hidden[rows.last_rows]), requests, generator
        )
        tokens, probs = [token], [prob]
        for request, length in zip(requests, lengths, strict=True):
            self._draft_progress[request.request_id] = length
        for step in range(1, k):
            rows = self._decode_rows(requests, tokens[-1], [n - 1 + step for n in lengths])
            hidden = self.draft(
                rows.token_ids.to(self.device), self._forward_context(rows, self._draft_groups)
            )
            token, prob = _sample_drafts(self.draft.compute_logits(hidden), requests, generator)
            tokens.append(token)
            probs.append(prob)
        return tokens, probs

    def _propose_hidden_conditioned(self, requests, k, generator):
        """EAGLE / MTP: entry p = (target hidden at p, token p + 1) at position p,
        in the draft's own KV. Catch up entries up to L - 2, then k - 1 steps
        fed with the draft's own hidden output."""
        lengths = [len(r.token_ids) for r in requests]
        starts = [
            min(self._draft_progress.get(r.request_id, 0), n - 2)
            for r, n in zip(requests, lengths, strict=True)
        ]
        rows = _StepRows(
            request_ids=tuple(r.request_id for r in requests),
            token_ids=torch.tensor(
                [t for r, s in zip(requests, starts, strict=True) for t in r.token_ids[s + 1 :]]
            ),
            seq_lens=tuple(n - 1 for n in lengths),
            query_lens=tuple(n - 1 - s for s, n in zip(starts, lengths, strict=True)),
            block_ids=tuple(r.block_ids for r in requests),
        )
        target_hidden = torch.cat(
            [
                self._target_hidden.read(r.request_id, s, n - 1)
                for r, s, n in zip(requests, starts, lengths, strict=True)
            ]
        )
        normed, feedback = self.draft(
            rows.token_ids.to(self.device),
            target_hidden,
            self._forward_context(rows, self._draft_groups),
        )
        last = rows.last_rows
        token, prob = _sample_drafts(self.draft.compute_logits(normed[last]), requests, generator)
        tokens, probs, feedback = [token], [prob], feedback[last]
        for request, length in zip(requests, lengths, strict=True):
            self._draft_progress[request.request_id] = length - 1
        for step in range(1, k):
            rows = self._decode_rows(requests, tokens[-1], [n - 2 + step for n in lengths])
            normed, feedback = self.draft(
                rows.token_ids.to(self.device),
                feedback,
                self._forward_context(rows, self._draft_groups),
            )
            token, prob = _sample_drafts(self.draft.compute_logits(normed), requests, generator)
            tokens.append(token)
            probs.append(prob)
        return tokens, probs

    def _propose_constant_position(self, requests, k, generator):
        """Gemma 4 assistant: Q-only, no KV writes. Every step's query sits at
        RoPE position L - 1 and attends over the target's cache at positions
        0 .. L - 2 (what the target has validly cached; sliding layers: the last
        ``sliding_window`` of them), so the metadata is built once for all k
        steps (vLLM's constant draft positions)."""
        lengths = [len(r.token_ids) for r in requests]
        rows = _StepRows(
            request_ids=tuple(r.request_id for r in requests),
            token_ids=torch.tensor([r.token_ids[-1] for r in requests]),
            rope_positions=torch.tensor([n - 1 for n in lengths]),
            seq_lens=tuple(n - 1 for n in lengths),
            query_lens=(1,) * len(requests),
            block_ids=tuple(r.block_ids for r in requests),
        )
        ctx = self._forward_context(rows, self._draft_groups)
        hidden = torch.cat(
            [
                self._target_hidden.read(r.request_id, n - 2, n - 1)
                for r, n in zip(requests, lengths, strict=True)
            ]
        )
        token_ids = rows.token_ids.to(self.device)
        tokens, probs = [], []
        for _ in range(k):
            normed, hidden = self.draft(token_ids, hidden, ctx)
            token, prob = _sample_drafts(self.draft.compute_logits(normed), requests, generator)
            tokens.append(token)
            probs.append(prob)
            token_ids = token.to(self.device)
        return tokens, probs


def _check_chunk(chunk: ScheduledChunk) -> None:
    if not chunk.token_ids:
        raise ValueError(f"request {chunk.request_id}: a scheduled chunk has no tokens")
    if chunk.start_position < 0:
        raise ValueError(
            f"request {chunk.request_id}: negative start_position {chunk.start_position}"
        )
    if chunk.logits not in ("last", "all", "none"):
        raise ValueError(
            f"request {chunk.request_id}: logits must be 'last', 'all' or 'none', got {chunk.logits!r}"
        )


def _sample_drafts(
    logits: torch.Tensor, requests: Sequence[ProposeRequest], generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft token per request and the distribution q it was drawn from:
    one-hot of the argmax for temperature 0, softmax(logits / T) otherwise."""
    logits = logits.float().cpu()
    tokens = torch.empty(len(requests), dtype=torch.long)
    probs = torch.empty_like(logits)
    for row, request in enumerate(requests):
        if request.temperature <= 0:
            tokens[row] = int(logits[row].argmax())
            probs[row] = nn.functional.one_hot(tokens[row], logits.shape[-1]).float()
        else:
            probs[row] = torch.softmax(logits[row] / request.temperature, dim=-1)
            tokens[row] = int(torch.multinomial(probs[row], 1, generator=generator))
    return tokens, probs


def _wait_for_device(device: torch.device) -> None:
    """Block until ``device`` has run the work queued on it (CUDA); a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_kv_write_available(device: torch.device) -> None:
    if device.type == "cpu" and not triton.knobs.runtime.interpret:
        raise RuntimeError(
            "the KV-cache write is a Triton kernel: on the CPU it runs only under the Triton "
            "interpreter; set TRITON_INTERPRET=1 before anything imports triton"
        )


def _check_backends(
    layers: Iterable[LayerDescription], device: torch.device, dtype: torch.dtype, block_size: int
) -> None:
    for layer in layers:
        if layer.kind is not LayerKind.ATTENTION:
            continue
        reason = get_backend(layer.backend).unsupported_reason(
            layer.head_size, dtype, block_size, device
        )
        if reason:
            raise ValueError(f"layer {layer.name}: {reason}")
