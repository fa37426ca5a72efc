"""vLLM's own Triton unified attention (the benchmarks' "vllm-triton" peer) against the oracle.

The kernel is fetched, not committed (``scripts/fetch_vllm_triton_kernel.sh``); without it
every case skips and says how to fetch it. On the CPU it runs in fp32 under the Triton
interpreter (whose ``tl.dot`` on bf16 is wrong); on a GPU in bf16 at larger sizes. Each case
goes through the peer's builder and impl, which size the split-KV scratch and pick the
threshold as vLLM's Triton backend does, on a NaN-poisoned output and a cache that holds NaN
wherever no query may look.
"""

from __future__ import annotations

import pytest
import torch

from attngroup.benchmarks.vllm_triton_peer import (
    VllmTritonImpl,
    VllmTritonMetadataBuilder,
    missing_reason,
)
from attngroup.kernels.attention_oracle import paged_attention_reference
from attngroup.kernels.backend import AttentionLayerParams
from attngroup.reference_engine.kv_cache_spec import FullAttentionSpec
from attngroup.suites.kernels.backend_harness import common_metadata, poisoned_like
from attngroup.suites.kernels.batches import (
    BATCHES_CPU,
    BATCHES_GPU,
    RELATIVE_ERROR_BOUND,
    BatchSpec,
    gpu_only,
    make_paged_batch,
    relative_error,
)

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or ""),
]

BLOCK_SIZE = 16
TF32_RELATIVE_ERROR_BOUND = 5e-3
"""vLLM's kernel leaves ``tl.dot``'s input precision at Triton's default, TF32 on a GPU: fp32
inputs keep 10 mantissa bits there (9.7e-4 seen on the H200); the interpreter computes in fp32."""


def run_peer(
    batch_spec: BatchSpec,
    *,
    heads: tuple[int, int],
    head_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    sliding_window: int | None = None,
) -> float:
    """The peer's relative error against the float64 oracle on one fresh random batch."""
    num_heads_q, num_kv_heads = heads
    batch = make_paged_batch(
        batch_spec,
        num_heads_q=num_heads_q,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=BLOCK_SIZE,
        dtype=dtype,
        device=device,
        sliding_window=sliding_window,
    )
    layer = AttentionLayerParams(
        name="peer",
        num_heads_q=num_heads_q,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        sm_scale=head_size**-0.5,
        sliding_window=sliding_window,
    )
    kv_spec = FullAttentionSpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        dtype=dtype,
        sliding_window=sliding_window,
    )
    builder = VllmTritonMetadataBuilder(
        kv_spec,
        [layer],
        torch.device(device),
        max_num_seqs=batch_spec.num_reqs,
        max_query_len=batch_spec.max_query_len,
    )
    output = poisoned_like(batch.query)
    VllmTritonImpl(layer).forward(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        builder.build(common_metadata(batch, BLOCK_SIZE)),
        output,
    )
    expected = paged_attention_reference(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        **batch.metadata(),
        sm_scale=layer.sm_scale,
        sliding_window=sliding_window,
    )
    return relative_error(output, expected)


@pytest.mark.parametrize(
    ("kind", "heads", "head_size", "sliding_window"),
    [
        ("decode", (8, 1), 64, None),
        ("verify", (8, 2), 64, 24),
    ],
    ids=["decode-hq8-hkv1-d64-split-kv", "verify-hq8-hkv2-d64-swa24"],
)
def test_vllm_triton_fp32_under_interpreter(kind, heads, head_size, sliding_window, device):
    """Small fp32 batches; on the CPU this runs vLLM's kernel in Triton's interpreter."""
    bound = (
        TF32_RELATIVE_ERROR_BOUND if device.type == "cuda" else RELATIVE_ERROR_BOUND[torch.float32]
    )
    error = run_peer(
        BATCHES_CPU[kind],
        heads=heads,
        head_size=head_size,
        dtype=torch.float32,
        device=device,
        sliding_window=sliding_window,
    )
    assert error < bound, f"relative error {error:.2e}"


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize(
    ("kind", "heads", "head_size"),
    [
        ("decode64", (8, 1), 256),
        ("verify", (8, 1), 256),
        ("decode64", (4, 1), 256),
        ("decode64", (8, 2), 512),
        ("verify", (8, 2), 512),
        ("decode64", (32, 8), 128),
        ("verify", (32, 8), 128),
    ],
    ids=lambda value: "-".join(map(str, value)) if isinstance(value, tuple) else str(value),
)
def test_vllm_triton_bf16_on_gpu(kind, heads, head_size):
    """The benchmark's geometries (Gemma 4 e2b/e4b and draft, Llama 3) in bf16."""
    error = run_peer(
        BATCHES_GPU[kind], heads=heads, head_size=head_size, dtype=torch.bfloat16, device="cuda"
    )
    assert error < RELATIVE_ERROR_BOUND[torch.bfloat16], f"relative error {error:.2e}"
