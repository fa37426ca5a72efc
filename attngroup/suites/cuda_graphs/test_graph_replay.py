"""Captured steps replay what the eager steps compute, for every pair, backend and bucket.

Per case, twin runners (``harness``) run the same prefill, then two rounds of verify
(q_len 1 + K) and drafting at other sequence lengths, so the second round replays graphs
whose metadata and plans were refilled for new lengths (vLLM #46329: full-decode graphs
replayed stale plan data). A batch of 3 runs the bucket of 4 with one padding request,
a batch of 4 fills it exactly, a batch of 1 the smallest bucket. Checked: verify logits
and every draft step's logits against eager within ``RTOL``, the same drafted tokens
(fp32), the KV caches (every block no request owns, the null block included, bit for bit
as poisoned: padding requests write nothing), and that graphs did run. A verify whose
context outgrows the captured capacity runs eagerly and one that fills it replays, both
equal to eager (vLLM #9285: sequences past max_seq_len_to_capture replayed the graphs).

On the CPU the same code replays through ``HostReplay`` (Triton under its interpreter:
one pair there, the rest on the GPU; FlashInfer through the kernel suite's stand-in).
"""

from __future__ import annotations

import pytest
import torch

from attngroup.kernels.backends.flashinfer_attn import FlashInferBackend
from attngroup.reference_engine.engine.cuda_graphs.capture_plan import StepKind
from attngroup.reference_engine.model_pairs import MODEL_PAIRS, get_model_pair
from attngroup.suites.cuda_graphs.harness import (
    DEVICE,
    ON_GPU,
    RTOL,
    K,
    TwinRunners,
    check_caches,
    make_batch,
    make_twins,
    poison,
    prefill,
    propose,
    relative_error,
    verify,
)

CPU_CASE = ("gemma4-e2b-mtp", "triton", "fp32")


def _cases() -> list:
    cases = []
    for pair in MODEL_PAIRS:
        for backend, dtype in (("triton", "fp32"), ("triton", "bf16"), ("flashinfer", "bf16")):
            marks = [pytest.mark.case(pair=pair, backend=backend, dtype=dtype, k=K)]
            if (pair, backend, dtype) != CPU_CASE:
                marks.append(pytest.mark.gpu)
                if not ON_GPU:
                    marks.append(pytest.mark.skip(reason="GPU case (CUDA graphs)"))
            if backend == "flashinfer" and ON_GPU and not FlashInferBackend.is_available(DEVICE):
                marks.append(pytest.mark.skip(reason="flashinfer-python is not installed"))
            cases.append(
                pytest.param(pair, backend, dtype, marks=marks, id=f"{pair}-{backend}-{dtype}")
            )
    return cases


_TWINS: dict[tuple[str, str, str], TwinRunners] = {}


def twins_for(pair: str, backend: str, dtype: str) -> TwinRunners:
    key = (pair, backend, dtype)
    if key not in _TWINS:
        _TWINS.clear()  # one pair's runners at a time: the GPU suite walks every pair
        _TWINS[key] = make_twins(pair, backend, dtype)
    return _TWINS[key]


def run_rounds(twins: TwinRunners, pair: str, num_reqs: int, seed: int) -> dict[str, dict]:
    """Prefill, then two verify + propose rounds at different lengths, in both runners."""
    batch = make_batch(pair, num_reqs, (9, 17, 30, 5), seed, tag=f"s{seed}-n{num_reqs}")
    chunk_gen = torch.Generator().manual_seed(seed + 1)
    vocab = max(max(prompt) for prompt in batch.prompts) + 1
    chunks = torch.randint(0, vocab, (2, num_reqs, K + 1), generator=chunk_gen).tolist()
    results = {}
    for name, runner in twins.both:
        record: dict = {"verify": [], "drafts": []}
        prefill(runner, batch)
        history = [list(prompt) for prompt in batch.prompts]
        for round_index in range(2):
            tokens = chunks[round_index]
            # After the prefill every token is cached; later the sampled token is not.
            starts = [len(h) - (1 if round_index else 0) for h in history]
            record["verify"].append(verify(runner, batch, tokens, starts))
            # The chunk's first token and a different number of accepted drafts per request
            # (lengths change between rounds), then the token the target sampled.
            for i, sequence in enumerate(history):
                accepted = tokens[i][: 1 + (i + round_index) % (K + 1)]
                sequence[len(sequence) - (1 if round_index else 0) :] = accepted
                sequence.append(tokens[i][-1])
            record["drafts"].append(propose(runner, batch, history))
        runner.remove_requests(batch.ids)
        results[name] = record
    return results


# The Triton interpreter takes minutes per case on the CPU: the padded bucket runs there by default.
CPU_SLOW = [] if ON_GPU else [pytest.mark.slow]


@pytest.mark.parametrize(
    "num_reqs",
    [
        pytest.param(1, id="bucket1", marks=CPU_SLOW),
        pytest.param(3, id="padded3of4"),
        pytest.param(4, id="bucket4", marks=CPU_SLOW),
    ],
)
@pytest.mark.parametrize(("pair", "backend", "dtype"), _cases())
def test_replay_equals_eager(pair: str, backend: str, dtype: str, num_reqs: int, request) -> None:
    if backend == "flashinfer" and not ON_GPU:
        request.getfixturevalue("flashinfer_standin_module")
    twins = twins_for(pair, backend, dtype)
    before = poison(twins, seed=num_reqs)
    counts_before = dict(twins.graph_steps.counts)
    for name in ("eager", "graph"):
        twins.draft_logits[name].clear()

    results = run_rounds(twins, pair, num_reqs, seed=num_reqs)

    counts = twins.graph_steps.counts
    plan = twins.graph_steps.plan
    for kind in (StepKind.VERIFY, StepKind.DRAFT):
        step = plan.step(kind)
        if step is not None and step.bucket_for(num_reqs) is not None:
            ran = counts[kind.value, "graph"] - counts_before.get((kind.value, "graph"), 0)
            assert ran > 0, f"no {kind.value} step ran from a graph"
    bound = RTOL[dtype]
    for round_index, (eager, graph) in enumerate(
        zip(results["eager"]["verify"], results["graph"]["verify"], strict=True)
    ):
        for request_index, (e, g) in enumerate(zip(eager, graph, strict=True)):
            error = relative_error(g, e)
            assert error <= bound, (
                f"verify round {round_index} request {request_index}: {error:.2e}"
            )
    eager_drafts, graph_drafts = twins.draft_logits["eager"], twins.draft_logits["graph"]
    assert len(eager_drafts) == len(graph_drafts) > 0
    for step_index, (e, g) in enumerate(zip(eager_drafts, graph_drafts, strict=True)):
        error = relative_error(g, e)
        assert error <= bound, f"draft logits call {step_index}: {error:.2e}"
    if dtype == "fp32":
        assert results["graph"]["drafts"] == results["eager"]["drafts"]
    check_caches(twins, before, num_reqs, bound)


SHORT_CAPACITY = 32  # context tokens the captured steps of the capacity test hold


@pytest.fixture(scope="module")
def short_capacity_twins() -> TwinRunners:
    """The CPU case's twins, the graph runner capturing steps that hold 32 context tokens."""
    return make_twins(*CPU_CASE, max_model_len=SHORT_CAPACITY)


@pytest.mark.parametrize(
    ("lengths", "expect_graph"),
    [
        # verify seq_len = prompt + K + 1: 29 + 3 = 32 fills the capacity exactly
        pytest.param((29, 9), True, id="longest-reaches-the-capacity-replays"),
        pytest.param((30, 9), False, id="longest-one-past-the-capacity-runs-eagerly"),
        pytest.param((40, 9), False, id="longest-far-past-the-capacity-runs-eagerly"),
    ],
)
@pytest.mark.case(pair=CPU_CASE[0], backend=CPU_CASE[1], dtype=CPU_CASE[2], k=K)
def test_a_context_past_the_captured_capacity_runs_eagerly(
    short_capacity_twins: TwinRunners, lengths: tuple[int, ...], expect_graph: bool
) -> None:
    """A captured step holds block tables ``capacity`` tokens wide and a launch plan made for
    that length: a verify whose context outgrows it must run eagerly, one that fits replays
    (vLLM #9285: sequences longer than max_seq_len_to_capture still replayed the graphs)."""
    twins = short_capacity_twins
    pair = CPU_CASE[0]
    seed = sum(lengths)
    poison(twins, seed=seed)
    batch = make_batch(pair, len(lengths), lengths, seed=seed, tag=f"capacity-{lengths[0]}")
    vocab = get_model_pair(pair).target_config().vocab_size
    generator = torch.Generator().manual_seed(seed + 1)
    chunks = torch.randint(0, vocab, (len(lengths), K + 1), generator=generator).tolist()
    starts = [len(prompt) for prompt in batch.prompts]  # every prompt token cached
    assert (max(starts) + K + 1 <= SHORT_CAPACITY) == expect_graph, "the case's lengths"
    counts = twins.graph_steps.counts  # the graph runner's passes
    before = {mode: counts[StepKind.VERIFY.value, mode] for mode in ("graph", "eager")}
    logits = {}
    for name, runner in twins.both:
        prefill(runner, batch)
        logits[name] = verify(runner, batch, chunks, starts)
        runner.remove_requests(batch.ids)
    ran = {mode: counts[StepKind.VERIFY.value, mode] - n for mode, n in before.items()}

    for request_index, (e, g) in enumerate(zip(logits["eager"], logits["graph"], strict=True)):
        error = relative_error(g, e)
        assert error <= RTOL["fp32"], (
            f"request {request_index} (context {starts[request_index]} + {K + 1}, capacity "
            f"{SHORT_CAPACITY}): graph-runner verify logits differ from eager by {error:.2e}"
        )
    expected = {"graph": 1, "eager": 0} if expect_graph else {"graph": 0, "eager": 1}
    assert ran == expected, (
        f"verify of contexts {starts} + {K + 1} at capacity {SHORT_CAPACITY}: ran {ran}"
    )


@pytest.mark.parametrize(
    ("pair", "backend", "dtype"), [pytest.param(*CPU_CASE, id="-".join(CPU_CASE))]
)
@pytest.mark.mtp
@pytest.mark.parametrize("slow", [pytest.param(None, id="cpu-slow", marks=CPU_SLOW)])
def test_groups_are_captured_with_their_own_head_counts(
    slow, pair: str, backend: str, dtype: str
) -> None:
    """Every captured step's group metadata serves its own layers' head count: the draft's
    4-head groups and the target's 8-head groups each with their own scratch or plan."""
    twins = twins_for(pair, backend, dtype)
    poison(twins, seed=7)
    run_rounds(twins, pair, 2, seed=7)
    captured = twins.graph_steps._captured
    assert {kind for kind, _ in captured} >= {StepKind.VERIFY, StepKind.DRAFT}
    heads_seen = set()
    for step in captured.values():
        for group, builder in step.groups:
            layer_heads = {twins.graph.layers[name].num_heads_q for name in group.layer_names}
            own = getattr(builder, "plan", builder)
            heads = getattr(own, "num_qo_heads", getattr(builder, "num_heads_q", None))
            assert {heads} == layer_heads, (
                f"{group.name}: metadata for {heads} heads serves {layer_heads}"
            )
            heads_seen.add(heads)
    assert len(heads_seen) > 1, "expected the draft's and the target's head counts"
