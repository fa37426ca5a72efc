"""Every backend end to end (registry -> builder -> build -> impl) against the float64 oracle.

torch and Triton run everywhere (Triton under its interpreter on the CPU);
FlashInfer needs a GPU. Outputs start as NaN so an unwritten row shows; the
cache's never-readable slots are NaN too (``attngroup.suites.kernels.batches``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import pytest
import torch
import triton

from attngroup.kernels.backend import AttentionLayerParams, AttentionMetadataBuilder
from attngroup.kernels.backends.common import HeadCountMismatchError
from attngroup.kernels.metadata import CommonAttentionMetadata
from attngroup.kernels.registry import (
    BACKEND_PATHS,
    STATE_BACKENDS,
    NotAnAttentionBackendError,
    NotAStateBackendError,
    get_backend,
    get_state_backend,
)
from attngroup.reference_engine.kv_cache_spec import FullAttentionSpec, SlidingWindowSpec
from attngroup.suites.kernels.backend_harness import (
    ATTENTION_BACKENDS,
    BACKEND_DTYPE,
    backend_params,
    common_metadata,
    native_dtype_params,
    run_layer,
)
from attngroup.suites.kernels.batches import (
    BatchSpec,
    PagedBatch,
    assert_within_bound,
    make_paged_batch,
)

pytestmark = pytest.mark.kernels

BLOCK_SIZE = 16
ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class AttentionSpecFields(TypedDict):
    """The fields full and sliding-window specs share, typed per key so that unpacking them
    into either constructor is checked."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype


@dataclass(frozen=True)
class LayerCase:
    """One layer shape and one step's batch."""

    num_heads_q: int
    num_kv_heads: int
    head_size: int
    batch: BatchSpec
    sliding_window: int | None = None
    logits_soft_cap: float | None = None

    def layer(self) -> AttentionLayerParams:
        return AttentionLayerParams(
            name="layers.0.attn",
            num_heads_q=self.num_heads_q,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            sm_scale=self.head_size**-0.5,
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
        )

    def kv_cache_spec(self, dtype: torch.dtype) -> FullAttentionSpec | SlidingWindowSpec:
        geometry: AttentionSpecFields = {
            "block_size": BLOCK_SIZE,
            "num_kv_heads": self.num_kv_heads,
            "head_size": self.head_size,
            "dtype": dtype,
        }
        if self.sliding_window is None:
            return FullAttentionSpec(**geometry)
        return SlidingWindowSpec(**geometry, sliding_window=self.sliding_window)


CASES = {
    "gqa4-d64-decode": LayerCase(8, 2, 64, BatchSpec.decode(37, 5, 64, 16)),
    "mqa8-d128-verify-window": LayerCase(8, 1, 128, BatchSpec((40, 9, 23), (4, 4, 4)), 16),
    "mha-d64-mixed-softcap": LayerCase(
        4, 4, 64, BatchSpec((19, 30, 12), (19, 7, 1)), logits_soft_cap=1.0
    ),
    "gemma4-sliding-d256-verify": LayerCase(8, 1, 256, BatchSpec((70, 33, 5), (4, 4, 4)), 32),
    "gemma4-full-d512-decode": LayerCase(8, 1, 512, BatchSpec.decode(70, 17, 49)),
    "gemma4-full-d512-verify": LayerCase(8, 1, 512, BatchSpec((70, 17), (4, 4))),
    "gemma4-e4b-draft-d256-prefill-window": LayerCase(4, 2, 256, BatchSpec((45, 20), (45, 6)), 32),
}


def make_batch(case: LayerCase, dtype: torch.dtype, device: torch.device) -> PagedBatch:
    return make_paged_batch(
        case.batch,
        num_heads_q=case.num_heads_q,
        num_kv_heads=case.num_kv_heads,
        head_size=case.head_size,
        block_size=BLOCK_SIZE,
        dtype=dtype,
        device=device,
        sliding_window=case.sliding_window,
    )


def make_builder(
    backend_name: str, case: LayerCase, dtype: torch.dtype, device: torch.device
) -> AttentionMetadataBuilder:
    builder_cls = get_backend(backend_name).get_builder_cls()
    return builder_cls(case.kv_cache_spec(dtype), [case.layer()], device, max_num_seqs=8)


def oracle(case: LayerCase, batch: PagedBatch) -> torch.Tensor:
    layer = case.layer()
    return batch.oracle(
        sm_scale=layer.sm_scale,
        sliding_window=layer.sliding_window,
        logits_soft_cap=layer.logits_soft_cap,
    )


@pytest.mark.parametrize(
    BACKEND_DTYPE, backend_params(ATTENTION_BACKENDS, ALL_DTYPES, slow_dtypes=[torch.float16])
)
@pytest.mark.parametrize("case_name", list(CASES))
def test_backend_matches_oracle(backend_name, dtype, case_name: str, device: torch.device) -> None:
    case = CASES[case_name]
    batch = make_batch(case, dtype, device)
    builder = make_builder(backend_name, case, dtype, device)
    common = common_metadata(batch, BLOCK_SIZE)
    output = run_layer(backend_name, builder, case.layer(), batch, common)
    assert not output.isnan().any(), "the backend left output rows unwritten (or produced NaN)"
    assert_within_bound(output, oracle(case, batch), dtype)


@pytest.mark.parametrize(BACKEND_DTYPE, native_dtype_params())
def test_backend_leaves_padding_rows_alone(backend_name, dtype, device: torch.device) -> None:
    """A CUDA-graph-padded step: real rows right, padded rows untouched."""
    case = CASES["gqa4-d64-decode"]
    batch = make_batch(case, dtype, device)
    num_real = batch.spec.num_tokens
    padding = 3
    spec = batch.spec
    common = CommonAttentionMetadata.from_seq_lens(
        spec.seq_lens,
        spec.query_lens,
        batch.block_table,
        BLOCK_SIZE,
        device,
        num_tokens_padded=num_real + padding,
    )
    builder = make_builder(backend_name, case, dtype, device)
    extra = torch.randn(padding, *batch.query.shape[1:], device=device).to(dtype)
    padded_batch = PagedBatch(**{**vars(batch), "query": torch.cat([batch.query, extra])})
    output = run_layer(backend_name, builder, case.layer(), padded_batch, common)
    assert output[num_real:].isnan().all(), "padded rows were written"
    assert_within_bound(output[:num_real], oracle(case, batch), dtype)


@pytest.mark.parametrize(BACKEND_DTYPE, native_dtype_params())
def test_backend_refuses_query_of_other_shape(backend_name, dtype, device: torch.device) -> None:
    """A query whose head count is not the layer's is refused before any kernel runs."""
    case = CASES["gqa4-d64-decode"]
    batch = make_batch(case, dtype, device)
    builder = make_builder(backend_name, case, dtype, device)
    four_head_layer = AttentionLayerParams("layers.0.attn", 4, 2, 64, sm_scale=0.125)
    with pytest.raises(HeadCountMismatchError, match=r"query must be \[tokens, 4, 64\]"):
        run_layer(backend_name, builder, four_head_layer, batch, common_metadata(batch, BLOCK_SIZE))


@pytest.mark.parametrize("name", ATTENTION_BACKENDS)
def test_registry_identity(name: str) -> None:
    """The registry name resolves to a backend of that name whose fully qualified class
    name (its identity in attention-group keys) is the registered path."""
    backend = get_backend(name)
    assert backend.name == name
    assert backend.full_cls_name() == BACKEND_PATHS[name]
    assert backend.get_builder_cls().__module__ == backend.__module__
    assert backend.get_impl_cls().__module__ == backend.__module__


@pytest.mark.parametrize("name", sorted(STATE_BACKENDS))
def test_registry_identity_of_state_backends(name: str) -> None:
    """A state backend resolves through its own lookup, with a builder and no implementation."""
    backend = get_state_backend(name)
    assert backend.name == name
    assert backend.full_cls_name() == BACKEND_PATHS[name]
    assert backend.get_builder_cls().__module__ == backend.__module__
    assert not hasattr(backend, "get_impl_cls")


def test_registry_lookups_refuse_the_other_kind() -> None:
    """Each lookup returns its own kind only: the kind says which builder constructor the
    engine calls."""
    with pytest.raises(NotAnAttentionBackendError):
        get_backend("mamba")
    with pytest.raises(NotAStateBackendError):
        get_state_backend("torch")


def test_cpu_availability() -> None:
    """torch runs anywhere, Triton on the CPU only under its interpreter (set by the suite's
    conftest), FlashInfer never on the CPU."""
    assert get_backend("torch").is_available("cpu")
    assert get_backend("triton").is_available("cpu") == bool(triton.knobs.runtime.interpret)
    assert not get_backend("flashinfer").is_available("cpu")
