"""The merged-group hazard: one builder sized for one head count serving layers of another.

LEGACY grouping (backend + KV spec, no head count) puts a mixed pair's target
and draft layers into one attention group where they share a KV spec: gemma4-e2b-mtp's
target layers (8 q / 1 kv heads) and its draft's Q-only layers (4 q heads on the same
pages), per layer type (head 256 sliding, 512 full). Every pair whose LEGACY grouping
merges two head counts is a case, registered pairs and those of a pairs file
(``--pairs``) alike. The strict check refuses that group; these tests turn it off
(builder ``strict=False`` with ``num_heads_q_override``), as an engine without the
check would, and run both directions through every backend:

- ``draft-builder-serves-target``: state sized for the draft's heads, run by a target layer;
- ``target-builder-serves-draft``: state sized for the target's heads, run by a draft layer.

Each case records what the backend did (``hazard_outcome``): ``refused`` (a clear
error naming the head counts, output untouched), ``wrong_rows`` (output the
float64 oracle rejects) or ``correct`` (no head-sized state on this path, or
right by luck). A backend that returns wrong output without an error fails the
test: that is the silent corruption users fear most.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

import pytest
import torch

from attngroup.kernels.backend import AttentionLayerParams, AttentionMetadataBuilder
from attngroup.kernels.backends.common import HeadCountMismatchError
from attngroup.kernels.ops.split_kv_scratch import ScratchTooSmallError
from attngroup.kernels.registry import get_backend
from attngroup.reference_engine.attention_groups import GroupingPolicy
from attngroup.reference_engine.model_pairs import MODEL_PAIRS, get_model_pair
from attngroup.suites.kernels.backend_harness import (
    BACKEND_DTYPE,
    attention_spec,
    backend_params,
    common_metadata,
    group_holding,
    launch_cache,
    native_dtype_params,
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

pytestmark = [pytest.mark.kernels, pytest.mark.mtp, pytest.mark.grouping]

DETECTOR_PAIR = "gemma4-e2b-mtp"
REFUSALS = (HeadCountMismatchError, ScratchTooSmallError)
"""The errors a backend may refuse a mis-sized launch with; anything else is a failure."""

PHASES = {
    "decode": BatchSpec.decode(70, 33, 5),
    "verify": BatchSpec((70, 33, 9), (4, 4, 4)),
}
DIRECTIONS = {  # direction -> (role the builder is sized for, role of the layer it serves)
    "draft-builder-serves-target": ("draft", "target"),
    "target-builder-serves-draft": ("target", "draft"),
}
LAYER_TYPES = ("sliding", "full")


def merged_groups() -> list:
    """(pair, layer type) for every LEGACY group that holds a draft layer beside layers
    of another head count: where a builder sized for one serves the other."""
    cases = []
    for name, pair in MODEL_PAIRS.items():
        for layer_type in LAYER_TYPES if pair.is_mixed else ():
            try:
                layers, group = group_holding(
                    name, "draft", layer_type, GroupingPolicy.LEGACY, torch.float32
                )
            except LookupError:  # no draft layer of this type
                continue
            if len({layers[layer].num_heads_q for layer in group.layer_names}) > 1:
                head_size = attention_spec(group).head_size
                cases.append(pytest.param(name, layer_type, id=f"{name}-{layer_type}-d{head_size}"))
    return cases


MERGED_GROUPS = merged_groups()

OutcomeKind = Literal["refused", "wrong_rows", "correct"]


@dataclass(frozen=True)
class HazardOutcome:
    kind: OutcomeKind
    detail: str
    relative_error: float | None = None


def classify(
    launch: Callable[[torch.Tensor], object], output: torch.Tensor, expected: torch.Tensor
) -> HazardOutcome:
    """Run ``launch(output)`` and judge it against the oracle's ``expected``.

    A refusal must be one of ``REFUSALS``, name the head counts and leave
    ``output`` untouched; any other exception propagates (a crash is not a
    clear error).
    """
    try:
        launch(output)
    except REFUSALS as error:
        message = str(error)
        assert "heads" in message, f"refusal does not name the head counts: {message}"
        assert output.isnan().all(), "the refused launch wrote part of the output"
        return HazardOutcome("refused", f"{type(error).__name__}: {message}")
    relative = relative_error(output, expected)
    bound = RELATIVE_ERROR_BOUND[output.dtype]
    if not relative < bound:  # NaN (unwritten rows) counts as wrong
        return HazardOutcome("wrong_rows", f"relative error {relative:.3g} >= {bound:g}", relative)
    return HazardOutcome("correct", f"relative error {relative:.3g} < {bound:g}", relative)


@pytest.fixture
def record_outcome(request: pytest.FixtureRequest, record_property) -> Callable:
    """Record a case's outcome: a property always, the error as a metric when the
    reports plugin's ``record_metric`` is installed."""
    try:
        record_metric = request.getfixturevalue("record_metric")
    except pytest.FixtureLookupError:
        record_metric = None

    def record(outcome: HazardOutcome) -> None:
        record_property("hazard_outcome", outcome.kind)
        record_property("hazard_detail", outcome.detail)
        error = outcome.relative_error
        if record_metric is not None and error is not None and math.isfinite(error):
            record_metric("hazard_relative_error", error, "ratio")

    return record


@dataclass(frozen=True)
class HazardSetup:
    builder: AttentionMetadataBuilder
    layer: AttentionLayerParams
    batch: PagedBatch
    expected: torch.Tensor


def hazard_setup(backend_name, dtype, pair, layer_type, direction, phase, device) -> HazardSetup:
    """The merged LEGACY group's builder, sized for the other role's heads, and a batch
    of the served layer's shape on the group's pages."""
    layers, group = group_holding(pair, "draft", layer_type, GroupingPolicy.LEGACY, dtype)
    builder_role, served_role = DIRECTIONS[direction]
    roles = get_model_pair(pair).layer_roles()
    role_heads = {
        role: {layers[name].num_heads_q for name in group.layer_names if name in roles[role]}
        for role in ("target", "draft")
    }
    assert all(len(heads) == 1 for heads in role_heads.values()), role_heads
    assert role_heads["target"] != role_heads["draft"], f"{pair}: no head-count mix {role_heads}"
    (builder_heads,) = role_heads[builder_role]
    spec = attention_spec(group)
    builder = get_backend(backend_name).get_builder_cls()(
        spec,
        [layers[name] for name in group.layer_names],
        device,
        strict=False,
        num_heads_q_override=builder_heads,
        max_num_seqs=8,
        max_query_len=5,
    )
    assert builder.num_heads_q == builder_heads
    layer = next(layers[name] for name in group.layer_names if name in roles[served_role])
    batch = make_paged_batch(
        PHASES[phase],
        num_heads_q=layer.num_heads_q,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        block_size=spec.block_size,
        dtype=spec.dtype,
        device=device,
        sliding_window=layer.sliding_window,
    )
    expected = batch.oracle(
        sm_scale=layer.sm_scale,
        sliding_window=layer.sliding_window,
        logits_soft_cap=layer.logits_soft_cap,
    )
    return HazardSetup(builder, layer, batch, expected)


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize(BACKEND_DTYPE, native_dtype_params())
@pytest.mark.parametrize(("pair", "layer_type"), MERGED_GROUPS)
def test_merged_group_hazard(
    pair, layer_type, backend_name, dtype, direction, phase, device, record_outcome
) -> None:
    """Refused or right; never wrong without an error."""
    setup = hazard_setup(backend_name, dtype, pair, layer_type, direction, phase, device)
    common = common_metadata(setup.batch, setup.builder.kv_cache_spec.block_size)
    launch = partial(run_layer, backend_name, setup.builder, setup.layer, setup.batch, common)
    outcome = classify(launch, poisoned_like(setup.batch.query), setup.expected)
    record_outcome(outcome)
    assert outcome.kind != "wrong_rows", (
        f"{backend_name} silently returned wrong output for a {setup.layer.num_heads_q}-head "
        f"layer served by a builder sized for {setup.builder.num_heads_q}: {outcome.detail}"
    )


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize(
    BACKEND_DTYPE, backend_params(["flashinfer"], [torch.bfloat16], slow_dtypes=[torch.bfloat16])
)
@pytest.mark.parametrize(("pair", "layer_type"), MERGED_GROUPS)
def test_merged_group_hazard_flashinfer_unguarded_probe(
    pair, layer_type, backend_name, dtype, direction, phase, device, record_outcome
) -> None:
    """What raw FlashInfer does with a q whose head count differs from its plan.

    FlashInfer does not check; the outcome (wrong rows or right by luck, SGLang
    saw the former) is recorded, not judged. The test asserts that the backend's
    guard refuses exactly this launch. Marked slow: an unguarded launch may fault
    the device, so run it in its own pytest process.
    """
    setup = hazard_setup(backend_name, dtype, pair, layer_type, direction, phase, device)
    common = common_metadata(setup.batch, setup.builder.kv_cache_spec.block_size)
    metadata = setup.builder.build(common)
    caches = (
        launch_cache(backend_name, setup.batch.key_cache),
        launch_cache(backend_name, setup.batch.value_cache),
    )
    raw = classify(
        lambda output: metadata.wrapper.run(setup.batch.query, caches, out=output),
        poisoned_like(setup.batch.query),
        setup.expected,
    )
    record_outcome(raw)
    output = poisoned_like(setup.batch.query)
    with pytest.raises(HeadCountMismatchError, match="planned for"):
        run_layer(backend_name, setup.builder, setup.layer, setup.batch, common, output)
    assert output.isnan().all()


class _PlannedHeadsOnly:
    """A stand-in for a plan-sized kernel (FlashInfer's failure mode): it computes
    only the heads its builder planned and never looks at q's head count."""

    def __init__(self, planned_heads: int, expected: torch.Tensor) -> None:
        self.planned_heads = planned_heads
        self.expected = expected

    def __call__(self, output: torch.Tensor) -> None:
        output[:, : self.planned_heads] = self.expected[:, : self.planned_heads].to(output.dtype)


def test_merged_group_hazard_detector_catches_wrong_rows(device) -> None:
    """The suite's judge flags a silently mis-sized kernel and accepts a right one, so a
    'correct' or 'refused' outcome above means something."""
    setup = hazard_setup(
        "torch",
        torch.float32,
        DETECTOR_PAIR,
        "sliding",
        "draft-builder-serves-target",
        "decode",
        device,
    )
    query = setup.batch.query
    assert setup.builder.num_heads_q < setup.layer.num_heads_q
    mis_sized = _PlannedHeadsOnly(setup.builder.num_heads_q, setup.expected)
    assert classify(mis_sized, poisoned_like(query), setup.expected).kind == "wrong_rows"
    right = _PlannedHeadsOnly(setup.layer.num_heads_q, setup.expected)
    assert classify(right, poisoned_like(query), setup.expected).kind == "correct"


def test_merged_group_hazard_detector_rejects_unclear_errors(device) -> None:
    """A crash (an out-of-bounds index, say) is not a clear refusal: it propagates."""
    setup = hazard_setup(
        "torch",
        torch.float32,
        DETECTOR_PAIR,
        "full",
        "target-builder-serves-draft",
        "decode",
        device,
    )

    def crash(output: torch.Tensor) -> None:
        raise IndexError("index 9 is out of bounds for dimension 1 with size 8")

    with pytest.raises(IndexError):
        classify(crash, poisoned_like(setup.batch.query), setup.expected)
