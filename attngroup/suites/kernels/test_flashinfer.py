"""The FlashInfer backend: its page indices, plans and guards.

FlashInfer itself needs a GPU, so the CPU tests check what the backend hands it:
the CSR page indices (against FlashInfer's documented paged semantics, emulated
here in torch and compared with the oracle), the plan parameters and the
guards. The GPU tests run the real wrappers.
"""

from __future__ import annotations

import pytest
import torch

from attngroup.kernels.attention_oracle import paged_attention_reference
from attngroup.kernels.backend import AttentionLayerParams
from attngroup.kernels.backends.common import HeadCountMismatchError
from attngroup.kernels.backends.flashinfer_attn import (
    FlashInferImpl,
    FlashInferMetadataBuilder,
    FlashInferPlanParams,
    StalePlanError,
    paged_kv_indices,
)
from attngroup.kernels.metadata import CommonAttentionMetadata
from attngroup.reference_engine.kv_cache_spec import FullAttentionSpec, SlidingWindowSpec
from attngroup.suites.kernels.backend_harness import (
    backend_name_params,
    common_metadata,
    launch_cache,
    poisoned_like,
    run_layer,
)
from attngroup.suites.kernels.batches import (
    NULL_BLOCK,
    BatchSpec,
    PagedBatch,
    make_paged_batch,
    relative_error,
)
from attngroup.suites.kernels.flashinfer_standin import paged_attention

pytestmark = pytest.mark.kernels

BLOCK_SIZE = 16


BATCHES = {
    "decode": BatchSpec.decode(70, 17, 1, 32),
    "verify": BatchSpec((70, 17, 9), (4, 4, 4)),
    "mixed-prefill": BatchSpec((45, 20, 5, 33), (45, 6, 1, 16)),
}
WINDOWS = {"full": None, "window-20": 20, "window-1": 1}


def paged_batch(batch_name: str, window: int | None) -> PagedBatch:
    return make_paged_batch(
        BATCHES[batch_name],
        num_heads_q=4,
        num_kv_heads=2,
        head_size=16,
        block_size=BLOCK_SIZE,
        dtype=torch.float32,
        sliding_window=window,
    )


@pytest.mark.parametrize("window_name", list(WINDOWS))
@pytest.mark.parametrize("batch_name", list(BATCHES))
def test_page_indices_reproduce_the_oracle(batch_name, window_name) -> None:
    """Our indices, read with FlashInfer's semantics, give the oracle's attention; with a
    window, the blocks that slid out (the null block in these batches) are left out."""
    window = WINDOWS[window_name]
    batch = paged_batch(batch_name, window)
    common = common_metadata(batch, BLOCK_SIZE)
    window_left = -1 if window is None else window - 1
    pages = paged_kv_indices(common, window_left)
    assert NULL_BLOCK not in pages.kv_indices.tolist(), "a slid-out block was listed"
    emulated = paged_attention(
        batch.query,
        launch_cache("flashinfer", batch.key_cache),
        launch_cache("flashinfer", batch.value_cache),
        pages,
        window_left,
        sm_scale=0.25,
    )
    expected = paged_attention_reference(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        **batch.metadata(),
        sm_scale=0.25,
        sliding_window=window,
    )
    assert relative_error(emulated, expected) < 1e-12


@pytest.mark.parametrize("batch_name", list(BATCHES))
def test_page_indices_layout(batch_name) -> None:
    """Without a window: every request lists exactly its pages, in table order."""
    batch = paged_batch(batch_name, None)
    common = common_metadata(batch, BLOCK_SIZE)
    pages = paged_kv_indices(common)
    expected_indices, expected_last = [], []
    for request, seq_len in enumerate(batch.spec.seq_lens):
        num_pages = -(-seq_len // BLOCK_SIZE)
        expected_indices += batch.block_table[request, :num_pages].tolist()
        expected_last.append(seq_len - (num_pages - 1) * BLOCK_SIZE)
    assert pages.kv_indices.tolist() == expected_indices
    assert pages.kv_last_page_len.tolist() == expected_last
    assert pages.qo_indptr.tolist() == batch.query_start_loc.tolist()
    assert all(t.dtype == torch.int32 for t in vars(pages).values())


def layer(name="layers.0.attn", heads=8, window=None, softcap=None, scale=1.0, head_size=256):
    return AttentionLayerParams(name, heads, 1, head_size, scale, window, softcap)


def spec(head_size=256, window=None, dtype=torch.bfloat16):
    geometry = {"block_size": 32, "num_kv_heads": 1, "head_size": head_size, "dtype": dtype}
    if window is None:
        return FullAttentionSpec(**geometry)
    return SlidingWindowSpec(**geometry, sliding_window=window)


def test_plan_params_follow_the_group() -> None:
    plan = FlashInferPlanParams.for_group(spec(window=512), [layer(window=512)], num_qo_heads=4)
    assert plan == FlashInferPlanParams(
        num_qo_heads=4,
        num_kv_heads=1,
        head_dim=256,
        page_size=32,
        window_left=511,
        logits_soft_cap=0.0,
        sm_scale=1.0,
        dtype=torch.bfloat16,
    )


def test_plan_params_refuse_layers_that_disagree() -> None:
    layers = [layer("a", softcap=30.0), layer("b")]
    with pytest.raises(ValueError, match=r"layers \['a', 'b'\] have"):
        FlashInferPlanParams.for_group(spec(), layers, num_qo_heads=8)


@pytest.mark.parametrize(
    ("heads", "head_size", "batch", "expected"),
    [
        (8, 256, BatchSpec.decode(9, 4), "decode/tensor-cores"),
        (4, 256, BatchSpec.decode(9, 4), "decode/tensor-cores"),
        (8, 512, BatchSpec.decode(9, 4), "decode/tensor-cores"),
        (8, 256, BatchSpec((9, 4), (4, 4)), "prefill/fa2"),
        (8, 512, BatchSpec((9, 4), (4, 4)), "prefill/fa2"),
        (4, 512, BatchSpec((9, 4), (9, 1)), "prefill/fa2"),
    ],
    ids=[
        "g8-d256-decode",
        "g4-d256-decode",
        "g8-d512-decode",
        "g8-d256-verify",
        "g8-d512-verify",
        "g4-d512-mixed",
    ],
)
def test_plan_choice(heads, head_size, batch, expected) -> None:
    """Decode on tensor cores at every GQA group size and head size; longer queries (verify
    and mixed) on FA2 prefill."""
    plan = FlashInferPlanParams.for_group(
        spec(head_size), [layer(heads=heads, head_size=head_size)], num_qo_heads=heads
    )
    table = torch.arange(2 * 2, dtype=torch.int32).reshape(2, 2)
    common = CommonAttentionMetadata.from_seq_lens(
        batch.seq_lens, batch.query_lens, table, 32, "cpu"
    )
    assert plan.choice(common).describe() == expected


def test_plan_refuses_query_with_other_head_count() -> None:
    plan = FlashInferPlanParams.for_group(spec(), [layer(heads=4)], num_qo_heads=4)
    query = torch.zeros(3, 8, 256)
    with pytest.raises(HeadCountMismatchError, match="planned for 4 query heads but q has 8"):
        plan.check_serves(query, layer(heads=8))


def test_plan_refuses_layer_with_other_window() -> None:
    plan = FlashInferPlanParams.for_group(spec(window=512), [layer(window=512)], num_qo_heads=8)
    with pytest.raises(ValueError, match="planned"):
        plan.check_serves(torch.zeros(3, 8, 256), layer(window=1024))


def test_builder_needs_cuda() -> None:
    """On the CPU the builder says why it cannot run (after the strict head check)."""
    with pytest.raises(ValueError, match="flashinfer is not available on cpu"):
        FlashInferMetadataBuilder(spec(), [layer()], torch.device("cpu"))


@pytest.mark.parametrize("backend_name", backend_name_params(["flashinfer"]))
def test_stale_plan_is_refused(backend_name, device) -> None:
    """Metadata whose wrapper a later build re-planned must not run."""
    batch = make_paged_batch(
        BatchSpec.decode(40, 9),
        num_heads_q=8,
        num_kv_heads=1,
        head_size=256,
        block_size=32,
        dtype=torch.bfloat16,
        device=device,
    )
    builder = FlashInferMetadataBuilder(spec(), [layer()], device)
    common = common_metadata(batch, 32)
    stale = builder.build(common)
    builder.build(common)
    output = poisoned_like(batch.query)
    with pytest.raises(StalePlanError, match="build once per step"):
        FlashInferImpl(layer()).forward(
            batch.query, batch.key_cache, batch.value_cache, stale, output
        )
    assert output.isnan().all()
    assert not run_layer(backend_name, builder, layer(), batch, common).isnan().any()
