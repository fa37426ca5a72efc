"""The FlashInfer backend ("flashinfer"): paged decode and prefill wrappers planned per group.

Written against flashinfer-python 0.7.4. Each builder (one per attention
group and micro-batch) owns its wrappers and one float workspace, and plans
them in ``build`` with the group's ``num_qo_heads``, the KV geometry, the
window (``window_left = W - 1``: our window counts the current token,
FlashInfer's does not), the soft cap and the scale.

Which wrapper, and with which options, is chosen per head size and query
shape by one table, ``WRAPPER_CHOICES``: each row names the H200 measurement
that put it there (docs/performance.md, "FlashInfer's path"). In short: one
query token per request runs the tensor-core decode at every head size, 512
included; any longer query runs FA2 prefill, which measured a hair faster on
verify than the tensor-core decode planned with ``q_len_per_req`` (FA3 is
several times slower on short queries and has no 512-wide head).

FlashInfer reads the head count from ``q`` at run time but fixes its work
partition at plan time, and never compares the two (0.7.4's ``run()`` takes
``q.size(1)`` as it comes): a q with more heads than planned can come out
silently wrong (SGLang PR #32625). ``run`` here refuses any q whose head count
differs from the plan, and a plan that a later ``build`` replaced.

Importing this module needs neither CUDA nor FlashInfer; the builder does.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from attngroup.kernels.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionLayerParams,
    AttentionMetadataBuilder,
    KVCacheGeometry,
)
from attngroup.kernels.backends.common import (
    HeadCountMismatchError,
    check_launch_shapes,
    describe_builder,
)
from attngroup.kernels.metadata import CommonAttentionMetadata

# FA2 prefill at head 256 plans 128 MiB of split-KV tmp_v alone on the H200 (128 MiB overflowed)
WORKSPACE_BYTES = 256 * 1024 * 1024
MAX_HEAD_SIZE = 512

PlanKind = Literal["decode", "prefill"]
QueryShape = Literal["single", "uniform", "mixed"]
"""A batch's queries: one token each; the same longer length each (verify); anything else."""

EVIDENCE_RUN = "attngroup/benchmarks/results/h200-2026-12-04-flashinfer-0.7.4-matrix.json"
EVIDENCE_RUN_LLAMA = (
    "attngroup/benchmarks/results/h200-2026-12-04-flashinfer-0.7.4-matrix-llama.json"
)


@dataclass(frozen=True)
class WrapperChoice:
    """One FlashInfer wrapper with its options: what the builder plans for a batch."""

    kind: PlanKind  # decode: BatchDecode...; prefill: BatchPrefill...
    tensor_cores: bool = True  # BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=...)
    prefill_backend: str | None = None  # BatchPrefillWithPagedKVCacheWrapper(backend=...)
    q_len_per_req: bool = False  # decode: plan(q_len_per_req=the batch's uniform query length)

    def describe(self) -> str:
        if self.kind == "prefill":
            return f"prefill/{self.prefill_backend}"
        cores = "tensor-cores" if self.tensor_cores else "cuda-cores"
        return f"decode/{cores}{'/q_len_per_req' if self.q_len_per_req else ''}"

    def serves(self, queries: QueryShape) -> bool:
        """Whether FlashInfer runs this wrapper on such a batch (decode: one token per
        request, or with ``q_len_per_req`` on tensor cores a uniform query length)."""
        if self.kind == "prefill":
            return True
        if self.q_len_per_req:
            return self.tensor_cores and queries == "uniform"
        return queries == "single"


TENSOR_CORE_DECODE = WrapperChoice("decode")
VERIFY_DECODE = WrapperChoice("decode", q_len_per_req=True)
FA2_PREFILL = WrapperChoice("prefill", prefill_backend="fa2")


@dataclass(frozen=True)
class ChoiceRow:
    """A rule of the choice table: head sizes and query shape -> wrapper, with its evidence."""

    max_head_dim: int  # the row serves head sizes up to this (rows are tried in order)
    queries: QueryShape
    choice: WrapperChoice
    evidence: str  # the measurement that put this choice here (command, result file, figures)


WRAPPER_CHOICES: tuple[ChoiceRow, ...] = (
    ChoiceRow(
        MAX_HEAD_SIZE,
        queries="single",
        choice=TENSOR_CORE_DECODE,
        evidence="python -m attngroup.benchmarks.bench_attention (every FlashInfer configuration per "
        f"case), decode and draft at heads 128, 256 and 512 in {EVIDENCE_RUN} and {EVIDENCE_RUN_LLAMA}: "
        "within 1.2 % of the fastest configuration in all 18 cases (FA2 prefill, the same kernel "
        "family, within p10-p90 of it); CUDA-core decode up to 2.7x slower (e2b head 512 64x8k: "
        "705.0 us against 260.6 us; level only on e4b head-256 draft), FA3 prefill 2.2-7.9x slower",
    ),
    ChoiceRow(
        MAX_HEAD_SIZE,
        queries="uniform",
        choice=FA2_PREFILL,
        evidence="python -m attngroup.benchmarks.bench_attention (every FlashInfer configuration per "
        f"case), verify (q_len 4) at heads 128, 256 and 512 in {EVIDENCE_RUN} and {EVIDENCE_RUN_LLAMA}: "
        "FA2 prefill the faster in 9 of 10 cases, by 0.2-0.8 % over tensor-core decode with "
        "q_len_per_req (e2b head 512 64x8k: 331.2 us against 333.8 us), the tenth within 0.4 %; "
        "FA3 prefill 3.7-7.7x slower (e2b head 256 64x8k: 1130.7 us)",
    ),
    ChoiceRow(
        MAX_HEAD_SIZE,
        queries="mixed",
        choice=FA2_PREFILL,
        evidence="the one FlashInfer wrapper for queries of different lengths at every head size "
        "(q_len_per_req needs one length; FA3 builds no 512-wide head and is 3.7-7.7x slower on "
        f"verify-length queries in {EVIDENCE_RUN})",
    ),
)


def query_shape(query_lens: torch.Tensor) -> QueryShape:
    """``query_lens``: the batch's per-request query lengths (host)."""
    if bool((query_lens == 1).all()):
        return "single"
    if bool((query_lens == query_lens[0]).all()):
        return "uniform"
    return "mixed"


def query_shape_of_length(query_len: int) -> QueryShape:
    """The shape of a batch whose requests all have ``query_len`` tokens (a captured step)."""
    return "single" if query_len == 1 else "uniform"


def choose_wrapper(head_dim: int, queries: QueryShape) -> WrapperChoice:
    """The first row of ``WRAPPER_CHOICES`` that serves this head size and query shape."""
    for row in WRAPPER_CHOICES:
        if head_dim <= row.max_head_dim and row.queries == queries:
            return row.choice
    raise ValueError(f"FlashInfer has no wrapper choice for head size {head_dim}")


class StalePlanError(RuntimeError):
    """Metadata whose wrapper a later ``build`` re-planned was run."""


@dataclass(frozen=True)
class FlashInferPlanParams:
    """Everything a plan fixes besides the batch: one set per attention group."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    window_left: int  # W - 1, or -1 for full attention
    logits_soft_cap: float  # 0.0 means none
    sm_scale: float
    dtype: torch.dtype

    @classmethod
    def for_group(
        cls,
        kv_cache_spec: KVCacheGeometry,
        layers: Sequence[AttentionLayerParams],
        num_qo_heads: int,
    ) -> FlashInferPlanParams:
        """The plan of a group whose layers share window, soft cap and scale.

        ``num_qo_heads`` is the builder's head count; the rest must agree across
        the layers, since one plan serves all of them.
        """
        per_layer = {_layer_plan_fields(layer) for layer in layers}
        if len(per_layer) != 1:
            raise ValueError(
                "FlashInfer plans one (window_left, logits_soft_cap, sm_scale) per attention "
                f"group; layers {[layer.name for layer in layers]} have {sorted(per_layer)}"
            )
        window_left, logits_soft_cap, sm_scale = per_layer.pop()
        return cls(
            num_qo_heads=num_qo_heads,
            num_kv_heads=kv_cache_spec.num_kv_heads,
            head_dim=kv_cache_spec.head_size,
            page_size=kv_cache_spec.block_size,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            dtype=kv_cache_spec.dtype,
        )

    def choice(self, common: CommonAttentionMetadata) -> WrapperChoice:
        return choose_wrapper(self.head_dim, query_shape(common.query_lens_cpu))

    def check_serves(self, query: torch.Tensor, layer: AttentionLayerParams) -> None:
        """Refuse a q or a layer that this plan was not made for.

        FlashInfer itself never compares q's head count with the plan; this is
        the check that turns a mis-sized plan into an error instead of wrong rows.
        """
        if query.shape[1] != self.num_qo_heads:
            raise HeadCountMismatchError(
                f"layer {layer.name}: FlashInfer wrapper was planned for {self.num_qo_heads} query "
                f"heads but q has {query.shape[1]}; plan one wrapper set per head count "
                "(attention groups split by num_heads_q)"
            )
        planned = (self.window_left, self.logits_soft_cap, self.sm_scale)
        if _layer_plan_fields(layer) != planned:
            raise ValueError(
                f"layer {layer.name} needs (window_left, logits_soft_cap, sm_scale) "
                f"{_layer_plan_fields(layer)}, but its group planned {planned}"
            )


def _layer_plan_fields(layer: AttentionLayerParams) -> tuple[int, float, float]:
    """A layer's (window_left, logits_soft_cap, sm_scale) in FlashInfer's terms."""
    window_left = -1 if layer.sliding_window is None else layer.sliding_window - 1
    return window_left, layer.logits_soft_cap or 0.0, layer.sm_scale


@dataclass(frozen=True)
class PagedKVIndices:
    """FlashInfer's CSR view of a batch: per request, its query rows and its pages."""

    qo_indptr: torch.Tensor  # int32 [requests + 1], host
    kv_indptr: torch.Tensor  # int32 [requests + 1], host
    kv_indices: torch.Tensor  # int32 [total pages], on the block table's device
    kv_last_page_len: torch.Tensor  # int32 [requests], host: tokens in each last page

    @property
    def num_requests(self) -> int:
        return self.kv_last_page_len.shape[0]


def paged_kv_indices(common: CommonAttentionMetadata, window_left: int = -1) -> PagedKVIndices:
    """The batch's requests as FlashInfer pages (no device synchronisation).

    With a sliding window, pages wholly before the first position any query of
    the request can see are left out (vLLM frees them; their slots may hold
    anything). Dropping whole leading pages shifts query and key positions
    alike, so FlashInfer's causal and window masks are unchanged.
    """
    query_lens = common.query_lens_cpu.long()
    kv_lens = common.seq_lens_cpu.long()
    first_visible = torch.zeros_like(kv_lens)
    if window_left >= 0:
        first_visible = (kv_lens - query_lens - window_left).clamp(min=0)
    block_size = common.block_size
    end_page = (kv_lens + block_size - 1) // block_size
    first_page = first_visible // block_size
    num_pages = end_page - first_page
    kv_indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int64)
    torch.cumsum(num_pages, 0, out=kv_indptr[1:])
    owner = torch.repeat_interleave(torch.arange(len(kv_lens)), num_pages)
    page_column = torch.arange(int(kv_indptr[-1])) - kv_indptr[:-1][owner] + first_page[owner]
    table = common.block_table
    rows = owner.to(table.device, non_blocking=True)
    columns = page_column.to(table.device, non_blocking=True)
    return PagedKVIndices(
        qo_indptr=common.query_start_loc_cpu.to(torch.int32),
        kv_indptr=kv_indptr.to(torch.int32),
        kv_indices=table[rows, columns].to(torch.int32),
        kv_last_page_len=(kv_lens - (end_page - 1) * block_size).to(torch.int32),
    )


def plan_wrapper(
    wrapper: Any, choice: WrapperChoice, plan: FlashInferPlanParams, common: CommonAttentionMetadata
) -> None:
    """Plan ``wrapper`` (made for ``choice``) for the batch: the one place that maps a group's
    plan parameters onto FlashInfer's ``plan`` arguments, for the eager builders and for the
    CUDA-graph wrappers (``flashinfer_graph``) alike."""
    pages = paged_kv_indices(common, plan.window_left)
    geometry = (plan.num_qo_heads, plan.num_kv_heads, plan.head_dim, plan.page_size)
    options = {
        "window_left": plan.window_left,
        "logits_soft_cap": plan.logits_soft_cap,
        "q_data_type": plan.dtype,
        "kv_data_type": plan.dtype,
        "sm_scale": plan.sm_scale,
    }
    kv_pages = (pages.kv_indptr, pages.kv_indices, pages.kv_last_page_len)
    if choice.kind == "prefill":
        wrapper.plan(pages.qo_indptr, *kv_pages, *geometry, causal=True, **options)
        return
    q_len_per_req = int(common.query_lens_cpu[0]) if common.num_reqs else 1
    wrapper.plan(*kv_pages, *geometry, q_len_per_req=q_len_per_req, **options)


@dataclass(frozen=True)
class FlashInferMetadata:
    common: CommonAttentionMetadata
    plan: FlashInferPlanParams
    choice: WrapperChoice
    wrapper: Any  # the planned FlashInfer wrapper
    builder: FlashInferMetadataBuilder
    generation: int  # the builder's plan counter when this plan was made


class FlashInferMetadataBuilder(AttentionMetadataBuilder):
    """Plans the table's wrapper for each step, with the group's head count.

    ``wrapper_choice`` (the benchmark's sweep over FlashInfer's configurations) plans
    that wrapper instead of the table's; a batch it cannot serve is refused.
    """

    def __init__(
        self,
        kv_cache_spec: KVCacheGeometry,
        layers: Sequence[AttentionLayerParams],
        device: torch.device,
        *,
        wrapper_choice: WrapperChoice | None = None,
        **options: Any,
    ) -> None:
        super().__init__(kv_cache_spec, layers, device, **options)
        reason = FlashInferBackend.unsupported_reason(
            self.head_size, kv_cache_spec.dtype, kv_cache_spec.block_size, self.device
        )
        if reason is not None:
            raise ValueError(f"cannot build a FlashInfer builder for {self.layer_names}: {reason}")
        self.plan = FlashInferPlanParams.for_group(kv_cache_spec, self.layers, self.num_heads_q)
        self.wrapper_choice = wrapper_choice
        self.flashinfer = _import_flashinfer()
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.wrappers: dict[tuple[PlanKind, bool, str | None], Any] = {}
        self.generation = 0

    def choice(self, common: CommonAttentionMetadata) -> WrapperChoice:
        if self.wrapper_choice is None:
            return self.plan.choice(common)
        queries = query_shape(common.query_lens_cpu)
        if not self.wrapper_choice.serves(queries):
            raise ValueError(
                f"FlashInfer {self.wrapper_choice.describe()} cannot serve a batch of "
                f"{queries} queries"
            )
        return self.wrapper_choice

    def wrapper(self, choice: WrapperChoice) -> Any:
        """The builder's wrapper for a choice (one per kind and options, made on first use)."""
        key = (choice.kind, choice.tensor_cores, choice.prefill_backend)
        if key not in self.wrappers:
            if choice.kind == "prefill":
                self.wrappers[key] = self.flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace, "NHD", backend=choice.prefill_backend
                )
            else:
                self.wrappers[key] = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_tensor_cores=choice.tensor_cores
                )
        return self.wrappers[key]

    def build(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        """Plan this step's wrapper; the metadata is valid until the next ``build``."""
        choice = self.choice(common)
        wrapper = self.wrapper(choice)
        plan = self.plan
        plan_wrapper(wrapper, choice, plan, common)
        self.generation += 1
        return FlashInferMetadata(
            common=common,
            plan=plan,
            choice=choice,
            wrapper=wrapper,
            builder=self,
            generation=self.generation,
        )

    def describe(self) -> dict:
        plan = self.plan
        return describe_builder(
            self,
            FlashInferBackend.name,
            plan={
                "num_qo_heads": plan.num_qo_heads,
                "num_kv_heads": plan.num_kv_heads,
                "head_dim": plan.head_dim,
                "page_size": plan.page_size,
                "window_left": plan.window_left,
                "logits_soft_cap": plan.logits_soft_cap,
                "sm_scale": plan.sm_scale,
                "dtype": str(plan.dtype).removeprefix("torch."),
                "wrappers": {
                    queries: (
                        self.wrapper_choice or choose_wrapper(plan.head_dim, queries)
                    ).describe()
                    for queries in ("single", "uniform", "mixed")
                },
            },
        )


class FlashInferImpl(AttentionImpl):
    def forward(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: FlashInferMetadata,
        output: torch.Tensor,
    ) -> torch.Tensor:
        common = metadata.common
        check_launch_shapes(query, key_cache, output, common, self.layer)
        metadata.plan.check_serves(query, self.layer)
        if metadata.generation != metadata.builder.generation:
            raise StalePlanError(
                f"layer {self.layer.name}: this FlashInfer metadata was planned as step "
                f"{metadata.generation}, but its builder has since planned step "
                f"{metadata.builder.generation}; build once per step and micro-batch"
            )
        num_tokens = common.num_actual_tokens
        if num_tokens:
            metadata.wrapper.run(
                query[:num_tokens], (key_cache, value_cache), out=output[:num_tokens]
            )
        return output


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"
    supported_head_sizes = (64, 128, 256, 512)
    supported_dtypes = (torch.float16, torch.bfloat16)
    supported_block_sizes = (16, 32, 64)

    @classmethod
    def get_builder_cls(cls) -> type[FlashInferMetadataBuilder]:
        return FlashInferMetadataBuilder

    @classmethod
    def get_impl_cls(cls) -> type[FlashInferImpl]:
        return FlashInferImpl

    @classmethod
    def is_available(cls, device: torch.device | str) -> bool:
        """Needs a CUDA device and the flashinfer-python package (looked up, not imported)."""
        return (
            torch.device(device).type == "cuda"
            and torch.cuda.is_available()
            and importlib.util.find_spec("flashinfer") is not None
        )


def _import_flashinfer() -> Any:
    try:
        import flashinfer
    except ImportError as error:
        raise ImportError(
            "the flashinfer backend needs flashinfer-python (tested with 0.7.4): "
            "pip install 'flashinfer-python==0.7.4'"
        ) from error
    return flashinfer
