"""The FlashInfer backend ("flashinfer"): paged decode and prefill wrappers planned per group.

Written against flashinfer-python 0.6.13. Each builder (one per attention
group and micro-batch) owns its wrappers and one float workspace, and plans
them in ``build`` with the group's ``num_qo_heads``, the KV geometry, the
window (``window_left = W - 1``: our window counts the current token,
FlashInfer's does not), the soft cap and the scale:

Which wrapper, and with which options, is chosen per head size and query
length by one table, ``WRAPPER_CHOICES``: each row names the H200 measurement
that put it there (README "FlashInfer's path"). In short: decode on tensor
cores up to head 256 (at every GQA group size), FA2 prefill for multi-token
queries up to head 256 (FlashInfer's default FA3 prefill is 4-8x slower on
short queries), and at head 512 the CUDA-core decode wrapper, with every
query token of a longer query expanded into its own one-token request (the
tensor-core kernels reject a 512-wide head). ``flashinfer.BatchAttention`` is
never used: at head 512 it leaves the CUDA context in a sticky error.

FlashInfer reads the head count from ``q`` at run time but fixes its work
partition at plan time, and never compares the two: a q with more heads than
planned can come out silently wrong (SGLang PR #32625). ``run`` here refuses
any q whose head count differs from the plan, and a plan that a later
``build`` replaced.

Importing this module needs neither CUDA nor FlashInfer; the builder does.
"""

from __future__ import annotations

import importlib.util
import sys
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
TENSOR_CORE_MAX_HEAD_SIZE = 256  # larger heads fail on the tensor-core kernels (see above)

PlanKind = Literal["decode", "prefill", "expanded_decode"]
EVIDENCE_RUN = "attngroup/benchmarks/results/h200-2026-12-03-best-peer-matrix.json"
EARLIER_RUN = "attngroup/benchmarks/results/h200-2026-12-02-graph-matrix.json"


@dataclass(frozen=True)
class WrapperChoice:
    """One FlashInfer wrapper with its options: what the builder plans for a batch."""

    kind: PlanKind  # decode / expanded_decode: BatchDecode...; prefill: BatchPrefill...
    tensor_cores: bool  # BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=...)
    prefill_backend: str | None  # BatchPrefillWithPagedKVCacheWrapper(backend=...)

    def describe(self) -> str:
        if self.kind == "prefill":
            return f"prefill/{self.prefill_backend}"
        return f"{self.kind}/{'tensor-cores' if self.tensor_cores else 'cuda-cores'}"


@dataclass(frozen=True)
class ChoiceRow:
    """A rule of the choice table: head sizes and query length -> wrapper, with its evidence."""

    max_head_dim: int  # the row serves head sizes up to this (rows are tried in order)
    multi_token: bool  # False: every query is one token; True: some query is longer
    choice: WrapperChoice
    evidence: str  # the measurement that put this choice here (command, result file, figures)


WRAPPER_CHOICES: tuple[ChoiceRow, ...] = (
    ChoiceRow(
        TENSOR_CORE_MAX_HEAD_SIZE,
        multi_token=False,
        choice=WrapperChoice("decode", tensor_cores=True, prefill_backend=None),
        evidence=f"python -m attngroup.benchmarks.bench_attention: decode and draft, CUDA cores in {EARLIER_RUN} "
        f"against tensor cores in {EVIDENCE_RUN} (Llama 32q/8kv 64x8k: 769.4 us on CUDA cores; "
        "e4b 8q/2kv head 256: 386.9 us on CUDA cores)",
    ),
    ChoiceRow(
        TENSOR_CORE_MAX_HEAD_SIZE,
        multi_token=True,
        choice=WrapperChoice("prefill", tensor_cores=True, prefill_backend="fa2"),
        evidence=f"python -m attngroup.benchmarks.bench_attention: verify (q_len 4), default backend (FA3 on "
        f"sm90) in {EARLIER_RUN} against fa2 in {EVIDENCE_RUN} (FA3: e2b head 256 64x8k 1146.6 us, "
        "Llama 64x8k 2116.6 us)",
    ),
    ChoiceRow(
        512,
        multi_token=False,
        choice=WrapperChoice("decode", tensor_cores=False, prefill_backend=None),
        evidence="the only decode FlashInfer 0.6.13 runs at head 512: use_tensor_cores=True fails "
        '("Invalid configuration: NUM_MMA_Q=1 NUM_MMA_D_QK=32"); BatchAttention leaves a sticky '
        f"CUDA error; timed in {EVIDENCE_RUN}",
    ),
    ChoiceRow(
        512,
        multi_token=True,
        choice=WrapperChoice("expanded_decode", tensor_cores=False, prefill_backend=None),
        evidence="FA2 prefill cannot hold a 512-wide head (IsInvalid() for NUM_MMA_D_VO = 32 in "
        "prefill.cuh), tensor-core decode fails as above: each query token becomes a one-token "
        f"CUDA-core decode request; timed in {EVIDENCE_RUN}",
    ),
)


def choose_wrapper(head_dim: int, multi_token: bool) -> WrapperChoice:
    """The first row of ``WRAPPER_CHOICES`` that serves this head size and query length
    (``multi_token``: some request's query is not exactly one token)."""
    for row in WRAPPER_CHOICES:
        if head_dim <= row.max_head_dim and row.multi_token == multi_token:
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

    @property
    def use_tensor_core_decode(self) -> bool:
        return choose_wrapper(self.head_dim, multi_token=False).tensor_cores

    def choice(self, common: CommonAttentionMetadata) -> WrapperChoice:
        multi_token = not bool((common.query_lens_cpu == 1).all())
        return choose_wrapper(self.head_dim, multi_token)

    def plan_kind(self, common: CommonAttentionMetadata) -> PlanKind:
        return self.choice(common).kind

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
    seq_lens = common.seq_lens_cpu.long()
    return _pages_of(
        qo_indptr=common.query_start_loc_cpu,
        kv_lens=seq_lens,
        first_visible=_first_visible(seq_lens - query_lens, window_left),
        block_table_rows=torch.arange(common.num_reqs),
        common=common,
    )


def expanded_decode_indices(
    common: CommonAttentionMetadata, window_left: int = -1
) -> PagedKVIndices:
    """Every query token as a one-token request over its causal prefix.

    The token at position p of request r attends to positions 0..p (or its
    window) of r's pages, exactly what its causal prefill row sees; the
    CUDA-core decode kernel then serves verify and prefill for head sizes the
    tensor-core kernels reject.
    """
    query_lens = common.query_lens_cpu.long()
    num_tokens = common.num_actual_tokens
    request_of_token = torch.repeat_interleave(torch.arange(common.num_reqs), query_lens)
    first_position = common.seq_lens_cpu.long() - query_lens
    offset_in_query = torch.arange(num_tokens) - common.query_start_loc_cpu.long()[request_of_token]
    positions = first_position[request_of_token] + offset_in_query
    return _pages_of(
        qo_indptr=torch.arange(num_tokens + 1, dtype=torch.int32),
        kv_lens=positions + 1,
        first_visible=_first_visible(positions, window_left),
        block_table_rows=request_of_token,
        common=common,
    )


def _first_visible(first_query_positions: torch.Tensor, window_left: int) -> torch.Tensor:
    """The first key position a query at ``first_query_positions`` sees."""
    if window_left < 0:
        return torch.zeros_like(first_query_positions)
    return (first_query_positions - window_left).clamp(min=0)


def _pages_of(
    *,
    qo_indptr: torch.Tensor,
    kv_lens: torch.Tensor,
    first_visible: torch.Tensor,
    block_table_rows: torch.Tensor,
    common: CommonAttentionMetadata,
) -> PagedKVIndices:
    """Pages ``first_visible // block_size ..`` of requests that read ``kv_lens`` tokens
    from the given block-table rows."""
    block_size = common.block_size
    end_page = (kv_lens + block_size - 1) // block_size
    first_page = first_visible // block_size
    num_pages = end_page - first_page
    kv_indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int64)
    torch.cumsum(num_pages, 0, out=kv_indptr[1:])
    owner = torch.repeat_interleave(torch.arange(len(kv_lens)), num_pages)
    page_column = torch.arange(int(kv_indptr[-1])) - kv_indptr[:-1][owner] + first_page[owner]
    table = common.block_table
    rows = block_table_rows[owner].to(table.device, non_blocking=True)
    columns = page_column.to(table.device, non_blocking=True)
    return PagedKVIndices(
        qo_indptr=qo_indptr.to(torch.int32),
        kv_indptr=kv_indptr.to(torch.int32),
        kv_indices=table[rows, columns].to(torch.int32),
        kv_last_page_len=(kv_lens - (end_page - 1) * block_size).to(torch.int32),
    )


def plan_wrapper(
    wrapper: Any, kind: PlanKind, plan: FlashInferPlanParams, common: CommonAttentionMetadata
) -> None:
    """Plan ``wrapper`` (a prefill wrapper for "prefill", else a decode wrapper) for the batch:
    the one place that maps a group's plan parameters onto FlashInfer's ``plan`` arguments,
    for the eager builders and for the CUDA-graph wrappers (``flashinfer_graph``) alike."""
    if kind == "prefill":
        pages = paged_kv_indices(common, plan.window_left)
        wrapper.plan(
            pages.qo_indptr,
            pages.kv_indptr,
            pages.kv_indices,
            pages.kv_last_page_len,
            plan.num_qo_heads,
            plan.num_kv_heads,
            plan.head_dim,
            plan.page_size,
            causal=True,
            sm_scale=plan.sm_scale,
            window_left=plan.window_left,
            logits_soft_cap=plan.logits_soft_cap,
            q_data_type=plan.dtype,
            kv_data_type=plan.dtype,
        )
        return
    pages_of = paged_kv_indices if kind == "decode" else expanded_decode_indices
    pages = pages_of(common, plan.window_left)
    wrapper.plan(
        pages.kv_indptr,
        pages.kv_indices,
        pages.kv_last_page_len,
        plan.num_qo_heads,
        plan.num_kv_heads,
        plan.head_dim,
        plan.page_size,
        window_left=plan.window_left,
        logits_soft_cap=plan.logits_soft_cap,
        q_data_type=plan.dtype,
        kv_data_type=plan.dtype,
        sm_scale=plan.sm_scale,
    )


@dataclass(frozen=True)
class FlashInferMetadata:
    common: CommonAttentionMetadata
    plan: FlashInferPlanParams
    kind: PlanKind
    wrapper: Any  # the planned FlashInfer wrapper
    builder: FlashInferMetadataBuilder
    generation: int  # the builder's plan counter when this plan was made


class FlashInferMetadataBuilder(AttentionMetadataBuilder):
    """Owns one decode and one prefill wrapper, planned for the group's head count."""

    def __init__(
        self,
        kv_cache_spec: KVCacheGeometry,
        layers: Sequence[AttentionLayerParams],
        device: torch.device,
        **options: Any,
    ) -> None:
        super().__init__(kv_cache_spec, layers, device, **options)
        reason = FlashInferBackend.unsupported_reason(
            self.head_size, kv_cache_spec.dtype, kv_cache_spec.block_size, self.device
        )
        if reason is not None:
            raise ValueError(f"cannot build a FlashInfer builder for {self.layer_names}: {reason}")
        self.plan = FlashInferPlanParams.for_group(kv_cache_spec, self.layers, self.num_heads_q)
        flashinfer = _import_flashinfer()
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.plan.use_tensor_core_decode
        )
        prefill = choose_wrapper(self.plan.head_dim, multi_token=True)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend=prefill.prefill_backend or "auto"
        )
        self.generation = 0

    def build(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        """Plan this step's wrapper; the metadata is valid until the next ``build``."""
        kind = self.plan.plan_kind(common)
        wrapper = self.prefill_wrapper if kind == "prefill" else self.decode_wrapper
        plan_wrapper(wrapper, kind, self.plan, common)
        self.generation += 1
        return FlashInferMetadata(
            common=common,
            plan=self.plan,
            kind=kind,
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
                "tensor_core_decode": plan.use_tensor_core_decode,
                "multi_token_path": choose_wrapper(plan.head_dim, multi_token=True).describe(),
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
        """Needs a CUDA device and the flashinfer-python package (looked up, not imported);
        on the CPU only the suites' stand-in (``attngroup/suites/kernels/flashinfer_standin.py``,
        installed as ``flashinfer`` by a test fixture) serves."""
        if torch.device(device).type == "cpu":
            return getattr(sys.modules.get("flashinfer"), "CPU_TEST_STANDIN", False) is True
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
            "the flashinfer backend needs flashinfer-python (tested with 0.6.13): "
            "pip install 'flashinfer-python==0.6.13'"
        ) from error
    return flashinfer
