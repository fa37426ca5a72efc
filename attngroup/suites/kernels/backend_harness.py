"""Running one attention layer through a backend's builder and implementation, as the engine does.

Shared by the backend, builder, FlashInfer and merged-group-hazard suites: backend
parameters with readable ids and GPU marks, the step's ``CommonAttentionMetadata``
for a ``PagedBatch``, and a NaN-poisoned launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from attngroup.kernels.backend import AttentionLayerParams, AttentionMetadataBuilder
from attngroup.kernels.metadata import CommonAttentionMetadata
from attngroup.kernels.registry import get_backend
from attngroup.reference_engine.attention_groups import (
    AttentionGroup,
    GroupingPolicy,
    group_attention_layers,
)
from attngroup.reference_engine.kv_cache_groups import get_kv_cache_groups
from attngroup.reference_engine.kv_cache_spec import AttentionSpec
from attngroup.reference_engine.kv_sharing import kv_sharing_of
from attngroup.reference_engine.model_pairs import get_model_pair
from attngroup.suites.kernels.batches import PagedBatch

ATTENTION_BACKENDS = ("torch", "triton", "flashinfer")
"""The registry's attention backends (it also holds non-attention state backends)."""
DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
FINITE_GARBAGE = 50.0
"""What FlashInfer tests put in never-read cache slots instead of NaN (see ``launch_cache``)."""


def backend_marks(name: str) -> list[pytest.MarkDecorator]:
    """FlashInfer cases carry the ``gpu`` mark and skip, with the reason, where it cannot run."""
    if name != "flashinfer":
        return []
    return [
        pytest.mark.gpu,
        pytest.mark.skipif(
            not get_backend(name).is_available("cuda"),
            reason="FlashInfer needs a CUDA device and flashinfer-python",
        ),
    ]


def backend_name_params(names: Sequence[str] = ATTENTION_BACKENDS) -> list[Any]:
    return [pytest.param(name, id=name, marks=backend_marks(name)) for name in names]


BACKEND_DTYPE = ("backend_name", "dtype")
"""Argument names of ``backend_params`` (the run records read them as backend and dtype)."""


def backend_params(
    names: Sequence[str],
    dtypes: Sequence[torch.dtype],
    slow_dtypes: Sequence[torch.dtype] = (),
) -> list[Any]:
    """``pytest.param(name, dtype)`` for every pair the backend supports, id ``name-dtype``;
    parametrize ``BACKEND_DTYPE`` with it.

    Cases in ``slow_dtypes`` are marked ``slow``: Triton's interpreter is slow on the CPU,
    and every FlashInfer dtype costs a JIT compile per kernel variant on a fresh GPU.
    """
    params = []
    for name in names:
        for dtype in dtypes:
            if dtype not in get_backend(name).supported_dtypes:
                continue
            marks = backend_marks(name)
            if dtype in slow_dtypes:
                marks = [*marks, pytest.mark.slow]
            params.append(pytest.param(name, dtype, id=f"{name}-{DTYPE_IDS[dtype]}", marks=marks))
    return params


def native_dtype(backend_name: str) -> torch.dtype:
    """float32 for torch and Triton (exact checks on the CPU), bfloat16 for FlashInfer (it
    has no float32 kernels)."""
    return torch.bfloat16 if backend_name == "flashinfer" else torch.float32


def native_dtype_params() -> list[Any]:
    """Each attention backend once, in its ``native_dtype``."""
    return [
        param
        for name in ATTENTION_BACKENDS
        for param in backend_params([name], [native_dtype(name)])
    ]


def attention_groups(
    pair_name: str, policy: GroupingPolicy, dtype: torch.dtype, block_size: int = 16
) -> tuple[dict[str, AttentionLayerParams], list[AttentionGroup]]:
    """A model pair's layers (as their backends see them) and its attention groups under
    ``policy``, flattened over KV-cache groups; as the reference engine groups them."""
    layers = get_model_pair(pair_name).layers(tp=1)
    specs = {
        layer.name: spec
        for layer in layers
        if (spec := layer.kv_cache_spec(block_size, dtype)) is not None
    }
    kv_cache_groups = get_kv_cache_groups(specs, kv_sharing_of(layers))
    groups = group_attention_layers(kv_cache_groups, layers, policy=policy)
    params = {layer.name: layer.attention_params() for layer in layers if layer.is_attention}
    return params, [group for per_kv_group in groups for group in per_kv_group]


def group_holding(
    pair_name: str, role: str, layer_type: str, policy: GroupingPolicy, dtype: torch.dtype
) -> tuple[dict[str, AttentionLayerParams], AttentionGroup]:
    """A pair's layers and its first attention group that holds a ``role`` ("target" or
    "draft") layer of ``layer_type`` ("sliding" or "full")."""
    layers, groups = attention_groups(pair_name, policy, dtype)
    roles = get_model_pair(pair_name).layer_roles()
    for group in groups:
        for name in group.layer_names:
            is_sliding = layers[name].sliding_window is not None
            if name in roles[role] and is_sliding == (layer_type == "sliding"):
                return layers, group
    raise LookupError(f"{pair_name} has no {role} {layer_type} attention layer")


def attention_spec(group: AttentionGroup) -> AttentionSpec:
    """``group``'s KV spec with its attention geometry (KV heads, head size, dtype): a group's
    spec may also be a state layer's, which has none."""
    spec = group.kv_cache_spec
    assert isinstance(spec, AttentionSpec), f"{group.layer_names}: no attention spec: {spec}"
    return spec


def common_metadata(batch: PagedBatch, block_size: int) -> CommonAttentionMetadata:
    spec = batch.spec
    return CommonAttentionMetadata.from_seq_lens(
        spec.seq_lens, spec.query_lens, batch.block_table, block_size, batch.query.device
    )


def launch_cache(backend_name: str, cache: torch.Tensor) -> torch.Tensor:
    """The cache a backend is launched on.

    ``make_paged_batch`` fills never-readable slots with NaN, so a kernel that
    reads one shows it. FlashInfer may load whole tiles and multiply masked
    probabilities (zero) by the values it loaded, where a NaN in a masked slot
    would poison a row that never attends to it (0 * NaN); its tests fill those
    slots with a large finite value instead, which still wrecks any row that
    wrongly attends to them. (The backend already leaves out pages that slid
    out of a window; this covers the masked part of the first and last page.)
    """
    if backend_name != "flashinfer":
        return cache
    return torch.nan_to_num(cache, nan=FINITE_GARBAGE)


def run_layer(
    backend_name: str,
    builder: AttentionMetadataBuilder,
    layer: AttentionLayerParams,
    batch: PagedBatch,
    common: CommonAttentionMetadata,
    output: torch.Tensor | None = None,
) -> torch.Tensor:
    """``layer`` over ``batch`` through ``builder.build`` and the backend's impl.

    The output starts as NaN (pass ``output`` to inspect it after a refusal), so
    any row the kernel leaves unwritten shows.
    """
    impl = get_backend(backend_name).get_impl_cls()(layer)
    if output is None:
        output = poisoned_like(batch.query)
    impl.forward(
        batch.query,
        launch_cache(backend_name, batch.key_cache),
        launch_cache(backend_name, batch.value_cache),
        builder.build(common),
        output,
    )
    return output


def poisoned_like(query: torch.Tensor) -> torch.Tensor:
    return torch.full_like(query, float("nan"))
