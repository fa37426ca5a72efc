"""Metadata builders: head-sized state follows the attention group, and mis-sized state is refused.

The groups come from the reference engine's grouping of gemma4-e2b-mtp (target
8 q / 1 kv heads, draft 4 q heads on the same pages; head 256 sliding, 512 full);
the builder-sizing check also runs over every other mixed pair (a pairs file's too).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import triton

from attngroup.kernels.backend import MIXED_HEADS_MESSAGE, AttentionLayerParams
from attngroup.kernels.backends.common import HeadCountMismatchError
from attngroup.kernels.backends.triton_attn import TritonAttentionMetadataBuilder
from attngroup.kernels.ops.split_kv_scratch import ScratchTooSmallError
from attngroup.kernels.ops.triton_launch_config import DEFAULT_NUM_SEGMENTS
from attngroup.kernels.registry import get_backend
from attngroup.reference_engine.attention_groups import AttentionGroup, GroupingPolicy
from attngroup.reference_engine.kv_cache_spec import FullAttentionSpec
from attngroup.reference_engine.model_pairs import MODEL_PAIRS, get_model_pair
from attngroup.suites.kernels.backend_harness import (
    ATTENTION_BACKENDS,
    attention_groups,
    attention_spec,
    backend_name_params,
    common_metadata,
    group_holding,
    native_dtype,
    poisoned_like,
    run_layer,
)
from attngroup.suites.kernels.batches import (
    RELATIVE_ERROR_BOUND,
    BatchSpec,
    PagedBatch,
    make_paged_batch,
    relative_error,
)

pytestmark = pytest.mark.kernels

MTP_PAIR = "gemma4-e2b-mtp"
SMALL_BUILDER = {"max_num_seqs": 4, "max_query_len": 5}  # keeps CPU scratch small


def group_by_role(
    backend_name: str, role: str, layer_type: str, policy=None, pair_name: str = MTP_PAIR
):
    """The layers and the first group holding a ``role`` ("target"/"draft") layer of
    ``layer_type`` ("sliding"/"full"); under LEGACY the draft's group is a merged one."""
    return group_holding(
        pair_name,
        role,
        layer_type,
        policy or GroupingPolicy.SPLIT_BY_Q_HEADS,
        native_dtype(backend_name),
    )


def make_group_builder(backend_name: str, layers, group: AttentionGroup, device, **options):
    params = [layers[name] for name in group.layer_names]
    builder_cls = get_backend(backend_name).get_builder_cls()
    return builder_cls(attention_spec(group), params, device, **{**SMALL_BUILDER, **options})


def _role_cases() -> list:
    """pair, (role, layer type, the role's query heads) for every mixed pair, a pairs
    file's included; ids read ``target-sliding-d256`` for gemma4-e2b-mtp, else start
    with the pair's name."""
    cases = []
    for name in (MTP_PAIR, *(n for n, p in MODEL_PAIRS.items() if p.is_mixed and n != MTP_PAIR)):
        layers = [layer for layer in get_model_pair(name).layers() if layer.is_attention]
        for layer_type, role in itertools.product(("sliding", "full"), ("target", "draft")):
            layer = next(
                (
                    layer
                    for layer in layers
                    if layer.role == role
                    and (layer.sliding_window is not None) == (layer_type == "sliding")
                ),
                None,
            )
            if layer is None:
                continue
            case_id = f"{role}-{layer_type}-d{layer.head_size}"
            cases.append(
                pytest.param(
                    name,
                    (role, layer_type, layer.num_heads_q),
                    id=case_id if name == MTP_PAIR else f"{name}-{case_id}",
                    marks=[pytest.mark.mtp] if get_model_pair(name).is_mtp else [],
                )
            )
    return cases


ROLES = _role_cases()


@pytest.mark.parametrize("backend_name", backend_name_params())
@pytest.mark.parametrize(("pair_name", "role"), ROLES)
def test_builder_state_follows_group_heads(backend_name: str, pair_name, role, device) -> None:
    """Scratch shapes and FlashInfer plans are sized by the group's own head count."""
    role_name, layer_type, expected_heads = role
    layers, group = group_by_role(backend_name, role_name, layer_type, pair_name=pair_name)
    assert group.num_heads_q == expected_heads
    builder = make_group_builder(backend_name, layers, group, device)
    description = builder.describe()
    assert builder.num_heads_q == description["num_heads_q"] == expected_heads
    assert description["layers"] == list(group.layer_names)
    assert description["head_size"] == group.kv_cache_spec.head_size
    if backend_name == "triton":
        padded = triton.next_power_of_2(group.kv_cache_spec.head_size)
        rows = min(128 // group.kv_cache_spec.num_kv_heads, 4) * min(5, 8)
        assert description["scratch_shapes"] == {
            "segm_output": [rows, expected_heads, DEFAULT_NUM_SEGMENTS, padded],
            "segm_max": [rows, expected_heads, DEFAULT_NUM_SEGMENTS],
            "segm_expsum": [rows, expected_heads, DEFAULT_NUM_SEGMENTS],
        }
    if backend_name == "flashinfer":
        assert description["plan"]["num_qo_heads"] == expected_heads
        assert description["plan"]["window_left"] == (
            layers[group.layer_names[0]].sliding_window - 1 if layer_type == "sliding" else -1
        )
        batch = make_paged_batch(
            BatchSpec.decode(40, 9),
            num_heads_q=expected_heads,
            num_kv_heads=group.kv_cache_spec.num_kv_heads,
            head_size=group.kv_cache_spec.head_size,
            block_size=group.kv_cache_spec.block_size,
            dtype=torch.bfloat16,
            device=device,
        )
        metadata = builder.build(common_metadata(batch, group.kv_cache_spec.block_size))
        assert metadata.wrapper._num_qo_heads == expected_heads  # what FlashInfer planned


@pytest.mark.parametrize(
    "pair_name", [name for name, pair in MODEL_PAIRS.items() if pair.default_backend == "triton"]
)
def test_every_triton_group_owns_scratch_for_its_heads(pair_name: str) -> None:
    """All of a pair's groups built side by side, as the engine builds them: each builder's
    split-KV scratch has its own group's head count and head size (not the model's) and
    storage of its own (a scratch shared by groups of one KV geometry would serve the
    draft with the target's)."""
    layers = {layer.name: layer for layer in MODEL_PAIRS[pair_name].layers()}
    _, groups = attention_groups(pair_name, GroupingPolicy.SPLIT_BY_Q_HEADS, torch.float32)
    triton_groups = [group for group in groups if group.backend.name == "triton"]
    for group in triton_groups:
        group.create_metadata_builders(layers, "cpu", **SMALL_BUILDER)
    builders: list[TritonAttentionMetadataBuilder] = []
    for group in triton_groups:
        builder = group.get_metadata_builder()
        assert isinstance(builder, TritonAttentionMetadataBuilder), type(builder)
        builders.append(builder)
    assert [builder.scratch.segm_output.shape[1:] for builder in builders] == [
        (
            group.num_heads_q,
            DEFAULT_NUM_SEGMENTS,
            triton.next_power_of_2(attention_spec(group).head_size),
        )
        for group in triton_groups
    ]
    storages = {builder.scratch.segm_output.data_ptr() for builder in builders}
    assert len(storages) == len(builders), "builders share a scratch"


@pytest.mark.parametrize(
    ("num_kv_heads", "max_num_seqs", "max_query_len", "rows"),
    [(1, 256, 9, 128 * 8), (8, 256, 9, 16 * 8), (2, 100, 3, 64 * 3), (1, 4, 1, 4), (4, 7, 20, 56)],
    ids=["mqa-engine-default", "gqa8", "kv2-verify3", "decode-only", "long-verify-capped"],
)
def test_triton_scratch_rows(num_kv_heads, max_num_seqs, max_query_len, rows) -> None:
    """rows = min(128 // num_kv_heads, max_num_seqs) * min(max_query_len, 8) (vLLM 0.34)."""
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=num_kv_heads, head_size=16, dtype=torch.float32
    )
    layer = AttentionLayerParams("layers.0.attn", 8, num_kv_heads, 16, sm_scale=0.25)
    builder = TritonAttentionMetadataBuilder(
        spec, [layer], torch.device("cpu"), max_num_seqs=max_num_seqs, max_query_len=max_query_len
    )
    assert builder.scratch.rows == rows
    assert builder.seq_threshold_3d == 128 // num_kv_heads
    assert (builder.scratch.num_segments, builder.scratch.head_size_padded) == (
        DEFAULT_NUM_SEGMENTS,
        16,
    )


@pytest.mark.mtp
@pytest.mark.parametrize("backend_name", ATTENTION_BACKENDS)
@pytest.mark.parametrize("layer_type", ["sliding", "full"])
def test_builder_refuses_mixed_heads(backend_name: str, layer_type: str) -> None:
    """A LEGACY group merges target (8) and draft (4) layers; its builder must refuse them
    with the strict check's exact message (before touching any device)."""
    layers, group = group_by_role(backend_name, "draft", layer_type, GroupingPolicy.LEGACY)
    assert {layers[name].num_heads_q for name in group.layer_names} == {8, 4}
    expected = MIXED_HEADS_MESSAGE.format(heads="{8, 4}", layers=list(group.layer_names))
    with pytest.raises(AssertionError) as raised:
        make_group_builder(backend_name, layers, group, "cpu")
    assert str(raised.value) == expected


def one_kv_head_case(
    batch_spec: BatchSpec,
    num_heads_q: int,
    head_size: int,
    device: torch.device,
    **builder_options: int,
) -> tuple[AttentionLayerParams, TritonAttentionMetadataBuilder, PagedBatch]:
    """A Triton layer of ``num_heads_q`` query heads over one KV head (page 16, fp32), its
    builder and a random batch for it on ``device``."""
    layer = AttentionLayerParams("layers.0.attn", num_heads_q, 1, head_size, sm_scale=0.125)
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=head_size, dtype=torch.float32
    )
    builder = TritonAttentionMetadataBuilder(spec, [layer], device, **builder_options)
    batch = make_paged_batch(
        batch_spec,
        num_heads_q=num_heads_q,
        num_kv_heads=1,
        head_size=head_size,
        block_size=16,
        dtype=torch.float32,
        device=device,
    )
    return layer, builder, batch


def test_triton_launch_with_too_small_scratch_raises(device: torch.device) -> None:
    """More decode tokens than the scratch has rows: refused, output untouched."""
    layer, builder, batch = one_kv_head_case(
        BatchSpec.decode(20, 33, 7), 8, 64, device, max_num_seqs=2, max_query_len=1
    )
    output = poisoned_like(batch.query)
    with pytest.raises(ScratchTooSmallError, match="rows: scratch 2, needed 3 tokens"):
        run_layer("triton", builder, layer, batch, common_metadata(batch, 16), output)
    assert output.isnan().all(), "a refused launch wrote output"


def test_triton_short_prefill_past_the_builders_query_length_runs_2d(
    device: torch.device,
) -> None:
    """A prefill chunk of 8 tokens per request, longer than the engine's ``k + 1`` the scratch
    rows were sized for, would fit the split-KV path's query bound; it must run 2D and match
    the oracle, not overflow the scratch (the engine with short prompts did)."""
    layer, builder, batch = one_kv_head_case(
        BatchSpec.prefill(8, 8), 8, 64, device, max_num_seqs=2, max_query_len=4
    )
    assert builder.scratch.rows < batch.spec.num_tokens  # what the split-KV path would need
    output = poisoned_like(batch.query)
    run_layer("triton", builder, layer, batch, common_metadata(batch, 16), output)
    assert not output.isnan().any(), "rows left unwritten"
    expected = batch.oracle(sm_scale=layer.sm_scale)
    assert relative_error(output, expected) < RELATIVE_ERROR_BOUND[torch.float32]


def test_triton_builder_reuses_its_scratch(device: torch.device) -> None:
    """``build`` hands out the builder's persistent scratch: no allocation per step."""
    _, builder, batch = one_kv_head_case(BatchSpec.decode(20, 9), 4, 32, device, max_num_seqs=2)
    common = common_metadata(batch, 16)
    assert builder.build(common).scratch is builder.build(common).scratch is builder.scratch


@pytest.mark.mtp
@pytest.mark.parametrize("backend_name", backend_name_params(["flashinfer"]))
@pytest.mark.parametrize("layer_type", ["sliding", "full"])
def test_flashinfer_plan_for_4_heads_refuses_8_head_query(backend_name, layer_type, device) -> None:
    """A wrapper planned for the draft's 4 heads, run by a target layer with 8: refused
    (FlashInfer itself would run it), output untouched."""
    layers, group = group_by_role(backend_name, "draft", layer_type)
    builder = make_group_builder(backend_name, layers, group, device)
    spec = group.kv_cache_spec
    target_layer = next(
        layer
        for name, layer in layers.items()
        if name.startswith("model.") and layer.head_size == spec.head_size
    )
    batch = make_paged_batch(
        BatchSpec.decode(40, 9),
        num_heads_q=8,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        block_size=spec.block_size,
        dtype=torch.bfloat16,
        device=device,
        sliding_window=target_layer.sliding_window,
    )
    output = poisoned_like(batch.query)
    common = common_metadata(batch, spec.block_size)
    with pytest.raises(HeadCountMismatchError, match="planned for 4 query heads but q has 8"):
        run_layer(backend_name, builder, target_layer, batch, common, output)
    assert output.isnan().all(), "a refused launch wrote output"
