"""A stand-in for the ``flashinfer`` package, so FlashInfer's planning runs in CPU CI.

The real package needs CUDA, so without this every check of what the FlashInfer
builder plans (above all ``num_qo_heads``) would be GPU-only, and a builder that
plans one group with another group's head count would pass the CPU suite.

The stand-in's paged wrappers take the real signatures (flashinfer-python 0.7.4:
the decode plan's options after ``page_size`` by keyword, ``q_len_per_req`` on
tensor cores only) and record every constructor option, every ``plan()`` and every ``run()`` with
its arguments bound to FlashInfer's parameter names, whether passed by position
or by keyword. ``run`` refuses a q whose head count (or head size) differs from
the plan, and a run before any plan, then computes FlashInfer's documented
paged attention in float64 (``paged_attention``), so a run can also be checked
against the oracle.

It is installed only by the ``flashinfer_standin`` fixture
(``attngroup/suites/kernels/conftest.py``), which puts this module into ``sys.modules`` as
``flashinfer`` for one test; nothing else makes it importable under that name.
The fixture also tells the FlashInfer backend, for that test only, that the CPU serves;
the backend itself knows nothing of this module.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

WRAPPERS: list[_PagedWrapper] = []
"""Every wrapper made since the fixture installed the stand-in, in creation order, so a
test finds what a builder planned without knowing where the builder keeps its wrappers."""


class PlanMismatchError(RuntimeError):
    """A run whose q (or cache) does not fit the wrapper's plan, or a run before any plan."""


@dataclass(frozen=True)
class Call:
    """One ``plan()`` or ``run()``: FlashInfer parameter name -> value."""

    arguments: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.arguments[name]


@dataclass
class _Recorder:
    """What a wrapper was made with and everything it was asked to do."""

    options: dict[str, Any] = field(default_factory=dict)
    plans: list[Call] = field(default_factory=list)
    runs: list[Call] = field(default_factory=list)


def _decode_plan_signature(
    indptr,
    indices,
    last_page_len,
    num_qo_heads,
    num_kv_heads,
    head_dim,
    page_size,
    *,
    pos_encoding_mode="NONE",
    window_left=-1,
    logits_soft_cap=None,
    q_data_type="float16",
    kv_data_type=None,
    o_data_type=None,
    data_type=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    non_blocking=True,
    q_len_per_req=1,
    **extra,
): ...


def _prefill_plan_signature(
    qo_indptr,
    paged_kv_indptr,
    paged_kv_indices,
    paged_kv_last_page_len,
    num_qo_heads,
    num_kv_heads,
    head_dim_qk,
    page_size,
    head_dim_vo=None,
    custom_mask=None,
    packed_custom_mask=None,
    causal=False,
    pos_encoding_mode="NONE",
    use_fp16_qk_reduction=False,
    sm_scale=None,
    window_left=-1,
    logits_soft_cap=None,
    q_data_type="float16",
    kv_data_type=None,
    non_blocking=True,
    **extra,
): ...


def _run_signature(q, paged_kv_cache, *args, out=None, lse=None, return_lse=False, **extra): ...


def _bind(signature_of, args: tuple, kwargs: dict) -> Call:
    bound = inspect.signature(signature_of).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.update(arguments.pop("extra", {}))
    return Call(arguments)


class _PagedWrapper(ABC):
    """What the decode and prefill wrappers share: recording, the plan check, the run."""

    _plan_signature: Any
    _causal_default: bool

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", **options):
        if kv_layout != "NHD":
            raise ValueError(f"the stand-in implements kv_layout 'NHD' only, got {kv_layout!r}")
        self.record = _Recorder(options={"kv_layout": kv_layout, **options})
        self.workspace = float_workspace_buffer
        WRAPPERS.append(self)

    @property
    def last_plan(self) -> Call:
        if not self.record.plans:
            raise PlanMismatchError(f"{type(self).__name__}.run before any plan()")
        return self.record.plans[-1]

    def plan(self, *args, **kwargs) -> None:
        self.record.plans.append(_bind(type(self)._plan_signature, args, kwargs))

    def _geometry(self, plan: Call) -> tuple[int, int, int, int]:
        """(num_qo_heads, num_kv_heads, head_dim, page_size) of a plan."""
        # The decode plan names it head_dim, the prefill plan head_dim_qk.
        head_dim = plan["head_dim"] if "head_dim" in plan.arguments else plan["head_dim_qk"]
        return plan["num_qo_heads"], plan["num_kv_heads"], head_dim, plan["page_size"]

    @abstractmethod
    def _pages(self, plan: Call) -> PagedRequests:
        """The plan's requests on the paged cache, in the wrapper's own parameter names."""

    def run(self, *args, **kwargs) -> torch.Tensor:
        call = _bind(_run_signature, args, kwargs)
        self.record.runs.append(call)
        plan = self.last_plan
        num_qo_heads, num_kv_heads, head_dim, page_size = self._geometry(plan)
        query, (key_cache, value_cache) = call["q"], call["paged_kv_cache"]
        if query.shape[1:] != (num_qo_heads, head_dim):
            raise PlanMismatchError(
                f"q has {query.shape[1]} heads of size {query.shape[2]}, but the wrapper was "
                f"planned for {num_qo_heads} query heads of size {head_dim}"
            )
        pages = self._pages(plan)
        rows = int(pages.qo_indptr[-1])
        if query.shape[0] != rows:  # FlashInfer's own row check (flashinfer #2801)
            raise PlanMismatchError(
                f"q.shape[0] ({query.shape[0]}) does not match qo_indptr[-1] ({rows})"
            )
        if key_cache.shape[1:] != (page_size, num_kv_heads, head_dim):
            raise PlanMismatchError(
                f"paged KV cache {tuple(key_cache.shape)} does not fit the plan's page size "
                f"{page_size}, {num_kv_heads} KV heads and head size {head_dim}"
            )
        output = paged_attention(
            query,
            key_cache,
            value_cache,
            pages,
            window_left=plan["window_left"],
            sm_scale=plan["sm_scale"] if plan["sm_scale"] is not None else head_dim**-0.5,
            logits_soft_cap=plan["logits_soft_cap"] or 0.0,
        ).to(query.dtype)
        out = call["out"]
        if out is None:
            return output
        out.copy_(output)
        return out


class BatchDecodeWithPagedKVCacheWrapper(_PagedWrapper):
    """``q_len_per_req`` query tokens per request (one unless planned otherwise): request i
    owns rows ``i * q_len_per_req ..``, causal within them, as 0.7.4's tensor-core decode."""

    _plan_signature = _decode_plan_signature

    def plan(self, *args, **kwargs) -> None:
        super().plan(*args, **kwargs)
        q_len_per_req = self.record.plans[-1]["q_len_per_req"]
        if q_len_per_req < 1:
            raise ValueError(f"q_len_per_req must be >= 1, got {q_len_per_req}")
        if q_len_per_req > 1 and not self.record.options.get("use_tensor_cores", False):
            raise ValueError(
                "q_len_per_req > 1 requires tensor-core decode (use_tensor_cores=True)"
            )

    def _pages(self, plan: Call) -> PagedRequests:
        num_requests = plan["last_page_len"].shape[0]
        return PagedRequests(
            qo_indptr=torch.arange(num_requests + 1) * plan["q_len_per_req"],
            kv_indptr=plan["indptr"],
            kv_indices=plan["indices"],
            kv_last_page_len=plan["last_page_len"],
        )


class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapper):
    """Requests of any query length; the stand-in implements the causal mask only."""

    _plan_signature = _prefill_plan_signature

    def plan(self, *args, **kwargs) -> None:
        super().plan(*args, **kwargs)
        if not self.record.plans[-1]["causal"]:
            raise ValueError("the stand-in implements causal prefill only")

    def _pages(self, plan: Call) -> PagedRequests:
        return PagedRequests(
            qo_indptr=plan["qo_indptr"],
            kv_indptr=plan["paged_kv_indptr"],
            kv_indices=plan["paged_kv_indices"],
            kv_last_page_len=plan["paged_kv_last_page_len"],
        )


@dataclass(frozen=True)
class PagedRequests:
    """FlashInfer's CSR description of a batch of requests on the paged cache."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor

    @property
    def num_requests(self) -> int:
        return self.kv_last_page_len.shape[0]


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    pages: Any,
    window_left: int,
    sm_scale: float,
    logits_soft_cap: float = 0.0,
) -> torch.Tensor:
    """FlashInfer's documented paged attention, plainly in float64.

    Request i reads pages ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``, all full
    but the last (``kv_last_page_len[i]`` tokens); its queries are the last
    ``qo_len`` positions of its ``kv_len`` keys (causal, bottom-right aligned);
    a query at q sees keys at k <= q with k >= q - window_left when window_left >= 0;
    scores are ``sm_scale * q.k``, soft-capped as ``cap * tanh(score / cap)`` when cap > 0.
    """
    block_size = key_cache.shape[1]
    group_size = query.shape[1] // key_cache.shape[2]
    output = torch.empty(query.shape, dtype=torch.float64)
    for request in range(pages.num_requests):
        page_ids = pages.kv_indices[pages.kv_indptr[request] : pages.kv_indptr[request + 1]].long()
        kv_len = (len(page_ids) - 1) * block_size + int(pages.kv_last_page_len[request])
        keys = key_cache[page_ids].flatten(0, 1)[:kv_len].double()
        values = value_cache[page_ids].flatten(0, 1)[:kv_len].double()
        q_start, q_end = int(pages.qo_indptr[request]), int(pages.qo_indptr[request + 1])
        query_pos = torch.arange(kv_len - (q_end - q_start), kv_len)[:, None]
        key_pos = torch.arange(kv_len)[None, :]
        visible = key_pos <= query_pos
        if window_left >= 0:
            visible &= key_pos >= query_pos - window_left
        scores = sm_scale * torch.einsum(
            "qhd,khd->hqk",
            query[q_start:q_end].double(),
            keys.repeat_interleave(group_size, dim=1),
        )
        if logits_soft_cap > 0:
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        output[q_start:q_end] = torch.einsum(
            "hqk,khd->qhd", probs, values.repeat_interleave(group_size, dim=1)
        )
    return output


CALL_KINDS = ("plans", "runs")


def mark() -> dict[tuple[int, str], int]:
    """How many plans and runs each wrapper has recorded so far (for ``calls_since``)."""
    return {
        (id(wrapper), kind): len(getattr(wrapper.record, kind))
        for wrapper in WRAPPERS
        for kind in CALL_KINDS
    }


def calls_since(marks: dict[tuple[int, str], int], kind: str) -> list[tuple[_PagedWrapper, Call]]:
    """The ``kind`` ("plans" or "runs") calls recorded after ``marks`` (from ``mark()``)."""
    return [
        (wrapper, call)
        for wrapper in WRAPPERS
        for call in getattr(wrapper.record, kind)[marks.get((id(wrapper), kind), 0) :]
    ]
