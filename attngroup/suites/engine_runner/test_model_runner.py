"""The model runner's own contract: grouping at start-up, metadata built once
per KV-cache group and shared by that group's builders, the state layers of
the hybrid pair (chunked and incremental runs agree; rejected verify tokens
are rolled back), the weight-loading path, and its errors."""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from attngroup.kernels.backend import MIXED_HEADS_MESSAGE
from attngroup.reference_engine.engine import model_runner
from attngroup.reference_engine.engine.forward_metadata import BlockTableError
from attngroup.reference_engine.engine.model_runner import ModelRunner
from attngroup.reference_engine.engine.step import (
    ProposeInput,
    ProposeRequest,
    ScheduledChunk,
    StepBatch,
)
from attngroup.reference_engine.model_pairs import get_model_pair
from attngroup.reference_engine.models.common import ForwardContext
from attngroup.reference_engine.models.weights import (
    WeightLoadError,
    load_weights,
    pair_weight_files,
)

RTOL = 1e-5


@pytest.fixture(scope="module")
def runners(device):
    cache: dict[str, ModelRunner] = {}

    def get(name: str) -> ModelRunner:
        if name not in cache:
            cache[name] = ModelRunner(
                get_model_pair(name), device=device, num_blocks=32, num_spec_tokens=3
            )
        return cache[name]

    return get


def _blocks(runner: ModelRunner, first: int, count: int = 4) -> tuple[tuple[int, ...], ...]:
    return (tuple(range(first, first + count)),) * len(runner.kv_cache_groups)


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm())


@pytest.mark.grouping
def test_legacy_policy_on_mixed_pair_fails_at_start() -> None:
    """The Gemma 4 assistant's 4-head layers share the target's KV spec: the
    old grouping puts them with 8-head layers and start-up must fail as vLLM's did."""
    with pytest.raises(AssertionError) as error:
        ModelRunner(get_model_pair("gemma4-e2b-mtp"), policy="legacy")
    assert str(error.value).startswith(MIXED_HEADS_MESSAGE.split("{")[0])
    assert "{8, 4}" in str(error.value)


@pytest.mark.grouping
@pytest.mark.mtp
def test_builders_are_sized_by_their_layers_heads(runners) -> None:
    runner = runners("gemma4-e4b-mtp")
    for row in runner.attention_groups:
        for group in row:
            heads = {runner.layers[name].num_heads_q for name in group.layer_names}
            assert heads == {group.metadata_builders[0].num_heads_q}, group.layer_names
    draft_heads = {runner.layers[name].num_heads_q for name in runner.draft_layer_names}
    assert draft_heads == {4}


@pytest.mark.grouping
@pytest.mark.mtp
def test_common_metadata_built_once_per_kv_group_and_shared(runners, monkeypatch) -> None:
    """One ``CommonAttentionMetadata`` per KV-cache group per forward pass, the
    same object handed to every attention group (builder) of that KV group."""
    runner = runners("gemma4-e4b-mtp")
    seen: dict[int, list[int]] = defaultdict(
        list
    )  # kv group -> ids of the objects its builders got
    for group_id, row in enumerate(runner.attention_groups):
        for group in row:
            builder = group.metadata_builders[0]
            original = builder.build

            def spy(common, _original=original, _group_id=group_id):
                seen[_group_id].append(id(common))
                return _original(common)

            monkeypatch.setattr(builder, "build", spy)
    before = runner.num_common_metadata_builds
    runner.execute_target(
        StepBatch((ScheduledChunk("meta", (5, 6, 7), 0, _blocks(runner, 0), "last"),))
    )
    target_groups = {runner._group_of_layer[name] for name in runner.target_layer_names}
    assert runner.num_common_metadata_builds - before == len(target_groups)
    assert set(seen) == target_groups
    for group_id, ids in seen.items():
        assert len(ids) == len(runner.attention_groups[group_id])
        assert len(set(ids)) == 1, (
            f"KV-cache group {group_id} built its common metadata more than once"
        )
    assert len({ids[0] for ids in seen.values()}) == len(seen)


def _record_draft_contexts(runner: ModelRunner) -> tuple[list[ForwardContext], Callable[[], None]]:
    """The ``ForwardContext`` of every draft forward (its last argument), and the undo."""
    contexts: list[ForwardContext] = []

    def record(module: nn.Module, args: tuple[Any, ...]) -> None:
        contexts.append(args[-1])

    return contexts, runner.draft.register_forward_pre_hook(record).remove


def _draft_groups_layers(runner: ModelRunner) -> set[str]:
    """Every layer of the KV-cache groups that hold a draft layer."""
    groups = {runner._group_of_layer[name] for name in runner.draft_layer_names}
    return {name for group in groups for name in runner.kv_cache_groups[group].layer_names}


@pytest.mark.mtp
@pytest.mark.spec_decode
@pytest.mark.parametrize(
    "pair_name",
    [
        pytest.param("qwen3-next-mtp", id="qwen3-next-mtp-target-state-groups"),
        pytest.param("gemma4-e4b-mtp", id="gemma4-e4b-mtp-target-only-attention-groups"),
    ],
)
def test_draft_passes_carry_only_their_own_groups_metadata(runners, pair_name: str) -> None:
    """Every draft pass, its prefill included, gets metadata built for the draft's own
    KV-cache groups only. A target-only group's metadata (the hybrid target's state
    layers) in the draft's context is metadata the draft side may take for its own:
    vllm-ascend #14791, where the MTP draft prefill reused the target's GDN metadata."""
    runner = runners(pair_name)
    vocab = runner.pair.target_config().vocab_size
    prompt = torch.randint(vocab, (int(torch.randint(5, 20, ())),)).tolist()
    blocks = _blocks(runner, 28)
    logits = _run(runner, "draft-metadata", blocks, [(prompt, 0, "last")])[0]
    tokens = (*prompt, int(logits[-1].argmax()))
    contexts, stop_recording = _record_draft_contexts(runner)
    try:
        runner.propose(ProposeInput((ProposeRequest("draft-metadata", tokens, blocks),)), 3)
    finally:
        stop_recording()
        runner.remove_requests(["draft-metadata"])
    assert len(contexts) == 3, "one draft forward per drafted token"
    own_layers = _draft_groups_layers(runner)
    for index, ctx in enumerate(contexts):
        foreign = sorted(set(ctx.attn_metadata) - own_layers)
        assert not foreign, f"draft pass {index} carries target-only layers' metadata: {foreign}"
        assert set(ctx.slot_mappings) <= own_layers, f"draft pass {index}"


def _run(runner: ModelRunner, request_id: str, blocks, chunks: list[tuple[list[int], int, str]]):
    return [
        runner.execute_target(
            StepBatch((ScheduledChunk(request_id, tuple(tokens), start, blocks, logits),))
        ).logits[0]
        for tokens, start, logits in chunks
    ]


@pytest.mark.mtp
def test_hybrid_state_layers_chunked_equals_one_shot(runners) -> None:
    """The conv and recurrent states carry over between chunks and decode steps."""
    runner = runners("qwen3-next-mtp")
    tokens = [11, 7, 300, 42, 9, 250, 17, 3]
    one_shot = _run(runner, "one-shot", _blocks(runner, 0), [(tokens, 0, "all")])[0]
    pieces = _run(
        runner,
        "chunked",
        _blocks(runner, 4),
        [
            (tokens[:3], 0, "all"),
            (tokens[3:6], 3, "all"),
            (tokens[6:7], 6, "all"),
            (tokens[7:], 7, "all"),
        ],
    )
    assert _relative_error(torch.cat(pieces), one_shot) < RTOL


@pytest.mark.mtp
@pytest.mark.spec_decode
def test_hybrid_state_rolls_back_rejected_verify_tokens(runners) -> None:
    """After a verify chunk whose drafts are all rejected, the next step must
    see the state of the accepted tokens only (via execute_target and via propose)."""
    runner = runners("qwen3-next-mtp")
    prompt, bonus, follow = [21, 5, 400, 77], 13, 99
    reference = _run(
        runner,
        "plain",
        _blocks(runner, 8),
        [(prompt, 0, "last"), ([bonus], 4, "last"), ([follow], 5, "last")],
    )
    spec = _run(
        runner,
        "spec",
        _blocks(runner, 12),
        [(prompt, 0, "last"), ([bonus, 1, 2, 3], 4, "all"), ([follow], 5, "last")],
    )
    assert _relative_error(spec[0], reference[0]) < RTOL
    assert (
        _relative_error(spec[1][:1], reference[1]) < RTOL
    )  # the verify's first row is the plain decode
    assert _relative_error(spec[2], reference[2]) < RTOL

    blocks = _blocks(runner, 16)
    _run(runner, "spec-propose", blocks, [(prompt, 0, "last"), ([bonus, 1, 2, 3], 4, "all")])
    runner.propose(
        ProposeInput((ProposeRequest("spec-propose", (*prompt, bonus, follow), blocks),)), 2
    )
    after = _run(runner, "spec-propose", blocks, [([follow], 5, "last")])[0]
    assert _relative_error(after, reference[2]) < RTOL


def test_blocks_that_do_not_cover_the_chunk_are_refused(runners) -> None:
    runner = runners("qwen3-mtp")
    short = (tuple(range(1)),) * len(runner.kv_cache_groups)  # 16 slots
    with pytest.raises(BlockTableError, match="need 2"):
        runner.execute_target(
            StepBatch((ScheduledChunk("short", tuple(range(17)), 0, short, "last"),))
        )


@pytest.mark.spec_decode
def test_propose_before_the_target_ran_is_refused(runners) -> None:
    runner = runners("llama3-eagle")
    request = ProposeRequest("never-ran", (1, 2, 3), _blocks(runner, 0))
    with pytest.raises(RuntimeError, match="execute_target"):
        runner.propose(ProposeInput((request,)), 2)


class _Clock:
    """``time.perf_counter`` plus an offset the stand-in device wait advances."""

    def __init__(self) -> None:
        self.offset = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.offset


WAIT_SECONDS = 3600.0


@pytest.mark.spec_decode
def test_forward_timings_include_the_wait_for_the_device(runners, monkeypatch) -> None:
    """On CUDA a forward's kernels run after its launches return: verify and draft
    times must stop only after the runner waits for the device. A stand-in wait
    that advances the runner's clock by an hour shows in both timings, once each."""
    runner = runners("llama3-eagle")
    clock, waits = _Clock(), []

    def wait(device: torch.device) -> None:
        waits.append(device)
        clock.offset += WAIT_SECONDS

    monkeypatch.setattr(model_runner, "time", clock)
    monkeypatch.setattr(model_runner, "_wait_for_device", wait)
    blocks = _blocks(runner, 28)
    before = dataclasses.replace(runner.timings)
    logits = _run(runner, "timed", blocks, [([4, 9, 16], 0, "last")])[0]
    tokens = (4, 9, 16, int(logits[-1].argmax()))
    runner.propose(ProposeInput((ProposeRequest("timed", tokens, blocks),)), 2)
    runner.remove_requests(["timed"])
    target = runner.timings.target_forward - before.target_forward
    draft = runner.timings.draft_forward - before.draft_forward
    assert WAIT_SECONDS <= target < 2 * WAIT_SECONDS
    assert WAIT_SECONDS <= draft < 2 * WAIT_SECONDS
    assert runner.timings.metadata - before.metadata < WAIT_SECONDS, "metadata is host time"
    assert waits == [runner.device, runner.device]


@pytest.mark.parametrize(
    ("device", "synchronized"),
    [("cpu", []), ("cuda:0", [torch.device("cuda:0")])],
    ids=["cpu-no-op", "cuda-synchronizes"],
)
def test_wait_for_device_synchronizes_cuda_only(monkeypatch, device, synchronized) -> None:
    calls: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", calls.append)
    model_runner._wait_for_device(torch.device(device))
    assert calls == synchronized


class _Tiny(nn.Module):
    scale: torch.Tensor  # a buffer

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 3, bias=False)
        self.register_buffer("scale", torch.ones(1))


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        pytest.param({"proj.weight": torch.randn(3, 4)}, r"missing \['scale'\]", id="missing"),
        pytest.param(
            {"proj.weight": torch.randn(3, 4), "scale": torch.ones(1), "extra": torch.ones(2)},
            r"unexpected \['extra'\]",
            id="unexpected",
        ),
        pytest.param(
            {"proj.weight": torch.randn(4, 3), "scale": torch.ones(1)},
            r"checkpoint \(4, 3\) vs engine \(3, 4\)",
            id="shape",
        ),
    ],
)
def test_load_weights_refuses_checkpoints_that_do_not_fit(tmp_path: Path, tensors, message) -> None:
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(WeightLoadError, match=message):
        load_weights(_Tiny(), path)


def test_load_weights_loads_every_tensor(tmp_path: Path) -> None:
    weight = torch.randn(3, 4)
    path = tmp_path / "w.safetensors"
    save_file({"proj.weight": weight, "scale": torch.full((1,), 2.5)}, str(path))
    module = _Tiny()
    load_weights(module, path)
    assert torch.equal(module.proj.weight, weight)
    assert float(module.scale) == 2.5


def test_weight_files_are_reused_only_for_the_same_pair_and_seed(tmp_path: Path) -> None:
    pair = get_model_pair("qwen3-mtp")
    files = pair_weight_files(pair, 0, tmp_path)
    written = files.target.stat().st_mtime_ns
    assert pair_weight_files(pair, 0, tmp_path).target.stat().st_mtime_ns == written
    reseeded = pair_weight_files(pair, 1, tmp_path)
    assert reseeded.target.stat().st_mtime_ns != written
    assert not list(tmp_path.glob(".*.tmp")), "temporary files left behind"


@pytest.mark.spec_decode
@pytest.mark.parametrize(
    "pair_name",
    [
        pytest.param("gemma4-e4b-mtp", id="gemma4-e4b-mtp-assistant", marks=pytest.mark.mtp),
        pytest.param("llama3-eagle", id="llama3-eagle-eagle"),
        pytest.param("qwen3-next-mtp", id="qwen3-next-mtp-mtp", marks=pytest.mark.mtp),
        pytest.param("qwen3-8b-draft-1.7b", id="qwen3-8b-draft-1.7b-draft-model"),
    ],
)
def test_drafts_after_partial_acceptance_equal_drafts_from_scratch(runners, pair_name: str) -> None:
    """Draft, verify, accept two of three drafts, draft again: the drafter must
    have caught up (own KV, target hidden states, state roll-back) exactly as a
    request that was prefilled with the same tokens and drafts once."""
    runner = runners(pair_name)
    prompt = [31, 8, 250, 77, 5]
    blocks = _blocks(runner, 20)
    first = _run(runner, "incremental", blocks, [(prompt, 0, "last")])[0]
    tokens = (*prompt, int(first[-1].argmax()))
    drafts = runner.propose(
        ProposeInput((ProposeRequest("incremental", tokens, blocks),)), 3
    ).draft_token_ids[0]
    verify = _run(
        runner, "incremental", blocks, [([tokens[-1], *drafts.tolist()], len(prompt), "all")]
    )[0]
    accepted = (*tokens, *drafts[:2].tolist(), int(verify[2].argmax()))

    def sampled(request_id: str, request_blocks) -> tuple[torch.Tensor, torch.Tensor]:
        request = ProposeRequest(request_id, accepted, request_blocks, temperature=1.0)
        out = runner.propose(ProposeInput((request,), torch.Generator().manual_seed(7)), 2)
        return out.draft_token_ids, out.draft_probs

    incremental_tokens, incremental_probs = sampled("incremental", blocks)
    fresh_blocks = _blocks(runner, 24)
    _run(runner, "fresh", fresh_blocks, [(list(accepted[:-1]), 0, "none")])
    fresh_tokens, fresh_probs = sampled("fresh", fresh_blocks)
    assert torch.equal(incremental_tokens, fresh_tokens)
    assert _relative_error(incremental_probs, fresh_probs) < 1e-4
