"""The model runner: a pair's tiny target and draft on the paged KV cache.

Interface with the engine loop (the dataclasses live in ``attngroup.reference_engine.engine.step``;
their fields are stable):

- ``execute_target(StepBatch) -> TargetOutput``: runs the target on every
  chunk, writes its KV, returns logits per chunk. The runner also keeps, per
  request, the target's last hidden state at every position it ran (the input
  EAGLE / MTP / the Gemma 4 assistant need), so the engine never carries
  hidden states around.
- ``propose(ProposeInput, k) -> DraftOutput``: after the target sampled, give
  every drafting request its full token list (prompt + accepted outputs, ending
  with the token just sampled; L tokens, the target has validly cached L - 1).
  The runner rolls state back to those L - 1 tokens and hands the requests to
  the pair's drafter, one drafting method per module of
  ``attngroup.reference_engine.engine.spec_decode`` (draft model, EAGLE / MTP layers, the
  Gemma 4 assistant; ``spec_decode.drafter`` says which runs what).
- State layers (Qwen3-Next): a verify chunk (``logits="all"``) folds rejected
  tokens into the recurrent state too; ``attngroup.reference_engine.engine.state_snapshots``
  saves and restores it and the runner replays the accepted prefix.
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
later steps overwrite); a shortfall raises
``attngroup.reference_engine.engine.forward_metadata.BlockTableError``. State groups keep a
request's recurrent state in its first block.

Start-up on the CPU needs ``TRITON_INTERPRET=1`` before triton is imported:
the KV write is a Triton kernel. Tensor parallelism: each rank builds its
shard of the models (``attngroup.reference_engine.models.parallel``) and the layers of
``pair.layers(tp_size)``; ``tp_group`` (or the default process group) carries
the all-reduces; every rank must get the same batches.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
from torch import nn

from attngroup.kernels.backend import StateBackend
from attngroup.kernels.registry import get_backend
from attngroup.reference_engine.attention_groups import AttentionGroup, GroupingPolicy
from attngroup.reference_engine.engine.cuda_graphs.device_spec_step import (
    DeviceSpecStep,
    DeviceSpecSteps,
)
from attngroup.reference_engine.engine.cuda_graphs.graph_steps import GraphSteps
from attngroup.reference_engine.engine.cuda_graphs.runner_graphs import runner_graph_steps
from attngroup.reference_engine.engine.forward_metadata import (
    INITIAL_CONTEXT_CAPACITY,
    ForwardMetadataBuilder,
)
from attngroup.reference_engine.engine.paged_caches import allocate_caches
from attngroup.reference_engine.engine.spec_decode.constant_position import ConstantPositionDrafter
from attngroup.reference_engine.engine.spec_decode.draft_model import DraftModelDrafter
from attngroup.reference_engine.engine.spec_decode.drafter import Drafter, DraftInputs
from attngroup.reference_engine.engine.spec_decode.hidden_conditioned import (
    HiddenConditionedDrafter,
)
from attngroup.reference_engine.engine.spec_decode.hidden_states import HiddenStateBuffer
from attngroup.reference_engine.engine.state_snapshots import StateSnapshots
from attngroup.reference_engine.engine.step import (
    DraftOutput,
    ProposeInput,
    ScheduledChunk,
    StepBatch,
    TargetOutput,
)
from attngroup.reference_engine.engine.step_rows import StepRows
from attngroup.reference_engine.grouping_plan import plan_grouping
from attngroup.reference_engine.kv_cache_spec import (
    KVCacheGroupSpec,
    MambaSpec,
    UniformTypeKVCacheSpecs,
)
from attngroup.reference_engine.layers import LayerDescription, LayerKind
from attngroup.reference_engine.model_pairs import ModelPair
from attngroup.reference_engine.models import DraftKind, build_pair_models
from attngroup.reference_engine.models.common import ForwardContext, PagedAttention
from attngroup.reference_engine.models.parallel import TensorParallel
from attngroup.reference_engine.models.weights import pair_weight_files

_log = logging.getLogger(__name__)

#: The drafting method of each kind of draft (``attngroup.reference_engine.models.draft_kind_of``).
DRAFTERS: dict[DraftKind, Callable[[DraftInputs], Drafter[Any]]] = {
    DraftKind.DRAFT_MODEL: DraftModelDrafter,
    DraftKind.HIDDEN_CONDITIONED: HiddenConditionedDrafter,
    DraftKind.CONSTANT_POSITION: ConstantPositionDrafter,
}


@dataclass(frozen=True)
class KVCacheGroupInfo:
    """One KV-cache group as the block manager sees it."""

    group_id: int
    block_size: int  # the group spec's block size (page-size unification may scale it)
    sliding_window: int | None  # tokens a query sees (HF convention, counts itself); None = all
    is_state: bool  # a Mamba-like state group: one block per request holds its state
    layer_names: tuple[str, ...]


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


class ModelRunner:
    """A pair's target and draft on the paged KV cache (see the module docstring).

    Start-up follows vLLM: layer descriptions -> ``plan_grouping`` (LEGACY on a
    mixed pair raises vLLM's AssertionError here) -> one metadata builder per
    attention group -> models and weights -> KV caches per layer with its own
    spec (``attngroup.reference_engine.engine.paged_caches``) -> the pair's drafter.
    Each forward pass builds ``CommonAttentionMetadata`` once per KV-cache group
    it touches, all of them in one ``StepMetadataBuilder`` build from persistent
    buffers (``attngroup.reference_engine.engine.forward_metadata``), and hands each object to
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
        cuda_graph: bool = False,
        max_model_len: int | None = None,
    ) -> None:
        if cuda_graph and tp_size > 1:
            raise ValueError("cuda_graph=True runs one rank only (tp_size 1)")
        self.tp = _tensor_parallel(tp_rank, tp_size, tp_group)
        self.pair = pair
        self.device = torch.device(device)
        self.dtype = dtype
        self.num_blocks = num_blocks
        self.num_spec_tokens = num_spec_tokens
        self.timings = RunnerTimings()
        self.num_common_metadata_builds = 0
        self._plan_groups(backend, policy, block_size)
        self._create_builders(max_num_seqs, max_num_batched_tokens, num_spec_tokens)
        self._load_models(seed, weights_dir)
        self._bind_attention_layers()
        self.kv_caches, self.state_caches = allocate_caches(
            self.kv_cache_groups, self.layers, num_blocks, self.device
        )
        self._state_snapshots = StateSnapshots(self.state_caches, self._group_of_layer)
        self._target_hidden = HiddenStateBuffer()
        self._drafter = self._create_drafter()
        self.cuda_graphs: GraphSteps | None = None
        if cuda_graph:
            capacity = max_model_len or min(INITIAL_CONTEXT_CAPACITY, num_blocks * block_size)
            self.cuda_graphs = runner_graph_steps(self, max_num_seqs, capacity)
            for line in self.cuda_graphs.plan.describe():
                _log.info("CUDA graphs: %s", line)
            for step in self.cuda_graphs.plan.steps:
                for group in sorted({d.group for d in step.eager}):
                    _log.warning(
                        "CUDA graphs: %s steps touching group %s run eagerly (see the plan)",
                        step.kind.value,
                        group,
                    )
        self._device_spec_steps: DeviceSpecSteps | None = None
        if self.cuda_graphs is not None and self.draft_kind is DraftKind.CONSTANT_POSITION:
            # The assistant's extra input: the target's hidden state (one rank: not sharded).
            hidden_size = self.pair.target_config().hidden_size
            hidden = torch.empty((0, hidden_size), dtype=dtype, device=self.device)
            self._device_spec_steps = DeviceSpecSteps(
                self.cuda_graphs, self.target, self.draft, hidden
            )

    def device_spec_step(self, num_reqs: int) -> tuple[DeviceSpecStep | None, str]:
        """The captured device-resident speculative step for ``num_reqs`` greedy requests
        (``cuda_graphs.device_spec_step``), or None and why the batch cannot run there."""
        if self.cuda_graphs is None:
            return None, "CUDA graphs are off"
        if self._device_spec_steps is None:
            return None, f"the {self.draft_kind.value} drafter keeps per-request state on the host"
        return self._device_spec_steps.get(num_reqs)

    # --- start-up ---------------------------------------------------------------------------

    @property
    def target_layer_names(self) -> tuple[str, ...]:
        return tuple(name for name, layer in self.layers.items() if not layer.is_draft)

    @property
    def draft_layer_names(self) -> tuple[str, ...]:
        return tuple(name for name, layer in self.layers.items() if layer.is_draft)

    def _plan_groups(self, backend: str, policy: GroupingPolicy | str, block_size: int) -> None:
        """Layer descriptions -> KV-cache groups and attention groups, and what
        the block manager and each pass need to know of them."""
        layers = self.pair.layers(self.tp.size, backend)
        _check_backends(layers, self.device, self.dtype, block_size)
        plan = plan_grouping(layers, policy, block_size, self.dtype)
        plan.raise_on_error()  # a grouping error is the model's, whatever the device: report it first
        _check_kv_write_available(self.device)
        # As planned: a KV-sharing layer carries its cache owner.
        self.layers: dict[str, LayerDescription] = {layer.name: layer for layer in plan.layers}
        self.kv_cache_groups: tuple[KVCacheGroupSpec, ...] = plan.kv_cache_groups
        self.attention_groups: tuple[tuple[AttentionGroup, ...], ...] = tuple(
            tuple(entry.group for entry in row) for row in plan.attention_groups
        )
        self._group_of_layer = {
            name: group_id
            for group_id, group in enumerate(self.kv_cache_groups)
            for name in group.layer_names
        }
        self.kv_cache_group_infos = tuple(
            self._group_info(i) for i in range(len(self.kv_cache_groups))
        )
        self._target_groups = self._groups_of(self.target_layer_names)
        self._draft_groups = self._groups_of(self.draft_layer_names)

    def _create_builders(
        self, max_num_seqs: int, max_num_batched_tokens: int, num_spec_tokens: int
    ) -> None:
        """One metadata builder per attention group, and the step builder that feeds them."""
        options = dict(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_query_len=num_spec_tokens + 1,
        )
        for group in self._all_attention_groups():
            group.create_metadata_builders(self.layers, self.device, num_builders=1, **options)
        self._metadata = ForwardMetadataBuilder(
            self.kv_cache_groups,
            self.attention_groups,
            [info.is_state for info in self.kv_cache_group_infos],
            self.device,
            max_num_seqs=max_num_seqs,
            max_num_tokens=max_num_batched_tokens,
        )

    def _all_attention_groups(self) -> Iterable[AttentionGroup]:
        return (group for row in self.attention_groups for group in row)

    def _group_info(self, group_id: int) -> KVCacheGroupInfo:
        group = self.kv_cache_groups[group_id]
        spec = group.kv_cache_spec
        return KVCacheGroupInfo(
            group_id=group_id,
            block_size=spec.block_size,
            sliding_window=_kv_group_window(spec),
            is_state=isinstance(spec, MambaSpec),
            layer_names=group.layer_names,
        )

    def _load_models(self, seed: int, weights_dir: Path | None) -> None:
        """The pair's target and draft on this rank, weights from ``weights_dir``
        (made from ``seed`` when missing there; a scratch directory when None)."""
        with tempfile.TemporaryDirectory() as scratch:
            files = pair_weight_files(
                self.pair, seed, Path(weights_dir) if weights_dir else Path(scratch)
            )
            models = build_pair_models(
                self.pair, files.target, files.draft, self.device, self.dtype, self.tp
            )
        self.target, self.draft, self.draft_kind = models.target, models.draft, models.draft_kind

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
            backend = group.backend
            if issubclass(backend, StateBackend):
                continue  # state layers run their own recurrence: nothing to bind
            impl_cls = backend.get_impl_cls()
            for name in group.layer_names:
                module, layer = modules[name], self.layers[name]
                if not isinstance(module, PagedAttention):
                    continue
                if module.writes_kv != (layer.kv_sharing_target is None):
                    raise RuntimeError(
                        f"layer {name}: the model's KV sharing disagrees with the pair's description"
                    )
                module.bind(impl_cls(layer.attention_params()))

    def _groups_of(self, layer_names: Iterable[str]) -> tuple[int, ...]:
        return tuple(sorted({self._group_of_layer[name] for name in layer_names}))

    def _create_drafter(self) -> Drafter[Any]:
        inputs = DraftInputs(
            model=self.draft,
            device=self.device,
            forward_context=self._draft_forward_context,
            target_hidden=self._target_hidden,
            decode_pass=self._draft_decode_pass,
        )
        return DRAFTERS[self.draft_kind](inputs)

    # --- per-pass metadata --------------------------------------------------------------------

    def _forward_context(self, rows: StepRows, group_ids: Sequence[int]) -> ForwardContext:
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

    def _draft_forward_context(self, rows: StepRows) -> ForwardContext:
        """A draft pass's context (looked up per call, so that a test can wrap
        ``_forward_context`` on the instance)."""
        return self._forward_context(rows, self._draft_groups)

    def _draft_decode_pass(self, rows: StepRows) -> Callable[..., Any]:
        """``DraftInputs.decode_pass``: the pass from a captured graph where one serves the
        batch, else eagerly; either way the metadata is built or filled once for ``rows``
        and shared by every call (a constant-position draft's k steps)."""
        graph_replay: list[Callable[..., Any] | None] = []
        eager_context: list[ForwardContext] = []

        def step(token_ids: torch.Tensor, *extra: torch.Tensor) -> Any:
            graphs = self.cuda_graphs
            if graphs is not None:
                if not graph_replay:
                    kind = graphs.kind_of(rows.query_lens, drafting=True)
                    graph_replay.append(graphs.prepare(kind, rows, self.draft, extra))
                if graph_replay[0] is not None:
                    return graph_replay[0](token_ids, extra)
            if not eager_context:
                eager_context.append(self._draft_forward_context(rows))
            return self.draft(token_ids.to(self.device), *extra, eager_context[0])

        return step

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
        self._state_snapshots.save(chunks)
        hidden = self._run_target(chunks)
        hidden_per_chunk = tuple(torch.split(hidden, [len(c.token_ids) for c in chunks]))
        logits = self._logits_per_chunk(chunks, hidden)
        _wait_for_device(self.device)
        self.timings.target_forward += time.perf_counter() - started
        return TargetOutput(logits=logits, hidden_states=hidden_per_chunk)

    def _logits_per_chunk(
        self, chunks: Sequence[ScheduledChunk], hidden: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Each chunk's logits rows (its last, all or none) from one projection of every
        row asked for: one lm-head launch per pass, not one per request."""
        counts: list[int] = []
        rows: list[int] = []
        start = 0
        for chunk in chunks:
            end = start + len(chunk.token_ids)
            wanted = {"last": range(end - 1, end), "all": range(start, end), "none": range(0)}
            rows.extend(wanted[chunk.logits])
            counts.append(len(wanted[chunk.logits]))
            start = end
        if len(rows) < hidden.shape[0]:
            hidden = hidden[torch.tensor(rows, dtype=torch.long).to(hidden.device)]
        return tuple(torch.split(self.target.compute_logits(hidden), counts))

    def _run_target(self, chunks: Sequence[ScheduledChunk]) -> torch.Tensor:
        """The target over ``chunks``: final-normed hidden states [tokens, hidden], in chunk
        order, also kept per request for drafting."""
        rows = StepRows(
            request_ids=tuple(c.request_id for c in chunks),
            token_ids=torch.tensor([t for c in chunks for t in c.token_ids], dtype=torch.long),
            seq_lens=tuple(c.start_position + len(c.token_ids) for c in chunks),
            query_lens=tuple(len(c.token_ids) for c in chunks),
            block_ids=tuple(c.block_ids for c in chunks),
        )
        hidden = None
        if self.cuda_graphs is not None:
            kind = self.cuda_graphs.kind_of(rows.query_lens, drafting=False)
            hidden = self.cuda_graphs.run(kind, rows, self.target)
        if hidden is None:
            hidden = self.target(
                rows.token_ids.to(self.device), self._forward_context(rows, self._target_groups)
            )
        per_chunk = torch.split(hidden, list(rows.query_lens))
        for chunk, states in zip(chunks, per_chunk, strict=True):
            self._target_hidden.write(chunk.request_id, chunk.start_position, states)
        return hidden

    def _roll_back_state(
        self, request_id: str, num_valid: int, block_ids: tuple[tuple[int, ...], ...]
    ) -> None:
        """Make the state layers hold exactly the first ``num_valid`` tokens."""
        replay = self._state_snapshots.restore(request_id, num_valid, block_ids)
        if replay is not None:
            self._run_target([replay])

    def remove_requests(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._target_hidden.remove(request_id)
            self._drafter.remove(request_id)
            self._state_snapshots.remove(request_id)

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
            num_valid = len(request.token_ids) - 1
            self._roll_back_state(request.request_id, num_valid, request.block_ids)
            self._drafter.roll_back(request.request_id, num_valid)
        tokens, probs = self._drafter.propose(requests, num_spec_tokens, batch_ctx.generator)
        _wait_for_device(self.device)
        # The drafts stay on the device between the k steps; one copy each to the host here.
        draft_token_ids = torch.stack(tokens, dim=1).cpu()
        draft_probs = torch.stack(probs, dim=1).cpu()
        self.timings.draft_forward += time.perf_counter() - started
        return DraftOutput(draft_token_ids=draft_token_ids, draft_probs=draft_probs)


def _tensor_parallel(tp_rank: int, tp_size: int, tp_group: Any) -> TensorParallel:
    if tp_size > 1 and tp_group is None and not torch.distributed.is_initialized():
        raise ValueError(
            f"tp_size={tp_size} needs torch.distributed initialised (or a tp_group) for the all-reduces"
        )
    return TensorParallel(tp_rank, tp_size, tp_group)


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
