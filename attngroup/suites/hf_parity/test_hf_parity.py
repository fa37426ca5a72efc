"""The engine's logits against transformers' own forward, in float32.

For every pair whose models transformers implements, the reference engine
(``ModelRunner`` on the paged KV cache, attention through the backends) must
give the logits of transformers' forward over the whole sequence within 1e-4
relative error, at prefill and at every decode step. The batch mixes a prompt
longer than the pair's smallest sliding window, a prompt prefilled in two chunks,
and decodes that run next to a prefill chunk.

Drafts: the Qwen3 draft model and the Gemma 4 assistant are transformers
models too, so their draft distributions (drafting at temperature 1, where the
runner returns softmax(logits)) are compared with transformers' at every draft
step. The assistant's reference is transformers' ``Gemma4AssistantForCausalLM``
driven as its candidate generator drives it (target embedding of the last
token + the target's last hidden state, constant position L - 1, the target's
K/V as ``shared_kv_states``), on contexts within the sliding window: over
longer contexts transformers' bidirectional sliding mask admits W + 1 keys
where the engine (like vLLM) keeps the target layer's window of W.

Not compared: EAGLE / MTP input projections (transformers has no such model;
their decoder layers are the family's, checked through the targets), and the
``qwen3-next-mtp`` pair: its state layers are the engine's Mamba-like gated
linear attention, not transformers' Gated DeltaNet (see
``attngroup.reference_engine.models.qwen3_next``); its engine-side consistency is tested
in ``attngroup/suites/engine_runner``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from attngroup.kernels.registry import get_backend
from attngroup.reference_engine.engine.model_runner import ModelRunner
from attngroup.reference_engine.engine.step import (
    ProposeInput,
    ProposeRequest,
    ScheduledChunk,
    StepBatch,
)
from attngroup.reference_engine.families import family_named
from attngroup.reference_engine.model_pairs import MODEL_PAIRS, ModelPair, SpecMethod
from attngroup.reference_engine.models import DraftKind, draft_kind_of
from attngroup.reference_engine.models.weights import (
    ReferenceModels,
    reference_models,
    save_pair_weights,
)
from attngroup.reference_engine.pairs.pairs_file import load_pairs_file

pytestmark = pytest.mark.hf_parity

RTOL = 1e-4
SEED = 0
BLOCKS_PER_REQUEST = 8
NUM_DECODE_STEPS = 2
NUM_DRAFT_STEPS = 3
#: pairs from small user configs that once ran wrongly (Qwen3's ignored window, Qwen2 /
#: Mistral's missing attention_bias); built from their config files as a user's pairs are
REGRESSION_PAIRS = load_pairs_file(Path(__file__).parents[1] / "data" / "regression_pairs.yaml")


def _backends(device: torch.device) -> tuple[str, ...]:
    """The CPU runs the torch backend (the engine's CPU default; Triton's
    interpreter is far too slow here); a GPU runs every available backend."""
    if device.type == "cpu":
        return ("torch",)
    return tuple(
        name for name in ("torch", "triton", "flashinfer") if get_backend(name).is_available(device)
    )


def _pair_params(predicate, backends: tuple[str, ...], device: torch.device) -> list:
    return [
        pytest.param(
            pair,
            backend,
            id=f"{pair.name}-{backend}-fp32-tp1",
            marks=[pytest.mark.mtp] if pair.is_mtp else [],
        )
        for pair in (*MODEL_PAIRS.values(), *REGRESSION_PAIRS)
        if family_named(pair.family).parity_gap is None and predicate(pair)
        for backend in backends
        if _runs(pair, backend, device)
    ]


def _runs(pair: ModelPair, backend: str, device: torch.device) -> bool:
    """Whether ``backend`` supports every attention layer of ``pair`` in float32."""
    return all(
        get_backend(backend).unsupported_reason(layer.head_size, torch.float32, 16, device) is None
        for layer in pair.layers(1, backend)
        if layer.is_attention
    )


#: which pairs each test runs on
PAIRS_OF_TEST = {
    "test_target_logits_match_transformers": lambda pair: True,
    "test_draft_model_probs_match_transformers": lambda pair: (
        pair.spec_method is SpecMethod.DRAFT_MODEL
    ),
    "test_gemma4_assistant_probs_match_transformers": lambda pair: (
        draft_kind_of(pair) is DraftKind.CONSTANT_POSITION
    ),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    chosen = metafunc.config.getoption("device")
    device = torch.device(chosen or ("cuda" if torch.cuda.is_available() else "cpu"))
    predicate = PAIRS_OF_TEST[metafunc.function.__name__]
    metafunc.parametrize(("pair", "backend"), _pair_params(predicate, _backends(device), device))


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    return float((actual - expected).norm() / expected.norm())


@dataclass
class Setup:
    pair: ModelPair
    runner: ModelRunner
    hf: ReferenceModels
    next_block: int = 0

    def blocks(self) -> tuple[tuple[int, ...], ...]:
        """A fresh set of blocks for one request (the same ids in every KV-cache group)."""
        ids = tuple(range(self.next_block, self.next_block + BLOCKS_PER_REQUEST))
        self.next_block += BLOCKS_PER_REQUEST
        return (ids,) * len(self.runner.kv_cache_groups)


@pytest.fixture(scope="module")
def setups(device, tmp_path_factory):
    """One runner and one set of transformers models per pair, shared by the
    tests of this module; the runner loads the files written from those models."""
    cache: dict[tuple[str, str], Setup] = {}
    models: dict[str, tuple[ReferenceModels, Path]] = {}

    def get(pair: ModelPair, backend: str) -> Setup:
        if pair.name not in models:
            hf = reference_models(pair, SEED)
            weights_dir = tmp_path_factory.mktemp(pair.name)
            save_pair_weights(pair, SEED, weights_dir, hf)
            models[pair.name] = (hf, weights_dir)
        if (pair.name, backend) not in cache:
            hf, weights_dir = models[pair.name]
            runner = ModelRunner(
                pair,
                backend=backend,
                device=device,
                num_blocks=64,
                seed=SEED,
                num_spec_tokens=NUM_DRAFT_STEPS,
                weights_dir=weights_dir,
            )
            cache[pair.name, backend] = Setup(pair, runner, hf)
        return cache[pair.name, backend]

    return get


def _prompts(pair: ModelPair, generator: torch.Generator) -> list[list[int]]:
    # With sliding layers, one prompt crosses the smallest window.
    windows = [layer.sliding_window for layer in pair.layers() if layer.sliding_window]
    lengths = (min(windows) + 2, 3, 7) if windows else (3, 5, 7)
    return [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]


@torch.no_grad()
def _hf_logits(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([token_ids])).logits[0].float()


def test_target_logits_match_transformers(setups, pair: ModelPair, backend: str) -> None:
    """Step 1: prompts 0 and 1 whole, the first 4 tokens of prompt 2; step 2:
    decodes of 0 and 1 beside the rest of prompt 2; then decodes of all."""
    setup = setups(pair, backend)
    runner, hf = setup.runner, setup.hf.target.eval()
    prompts = _prompts(setup.pair, torch.Generator().manual_seed(1))
    ids = [f"parity-{i}" for i in range(len(prompts))]
    blocks = [setup.blocks() for _ in prompts]
    sequences = [list(p) for p in prompts]
    split = 4
    first = [
        ScheduledChunk(ids[0], tuple(prompts[0]), 0, blocks[0], "all"),
        ScheduledChunk(ids[1], tuple(prompts[1]), 0, blocks[1], "all"),
        ScheduledChunk(ids[2], tuple(prompts[2][:split]), 0, blocks[2], "all"),
    ]
    out = runner.execute_target(StepBatch(tuple(first)))
    for index, logits in enumerate(out.logits):
        expected = _hf_logits(hf, list(first[index].token_ids))
        assert logits.shape == expected.shape
        assert relative_error(logits, expected) < RTOL, f"prefill of {ids[index]}"
    for sequence, logits in zip(sequences[:2], out.logits[:2], strict=True):
        sequence.append(int(logits[-1].argmax()))
    batch = [
        ScheduledChunk(ids[0], (sequences[0][-1],), len(sequences[0]) - 1, blocks[0], "last"),
        ScheduledChunk(ids[1], (sequences[1][-1],), len(sequences[1]) - 1, blocks[1], "last"),
        ScheduledChunk(ids[2], tuple(prompts[2][split:]), split, blocks[2], "all"),
    ]
    for step in range(NUM_DECODE_STEPS + 1):
        out = runner.execute_target(StepBatch(tuple(batch)))
        for index, logits in enumerate(out.logits):
            expected = _hf_logits(hf, sequences[index])[-logits.shape[0] :]
            assert relative_error(logits, expected) < RTOL, f"step {step + 2} of {ids[index]}"
            sequences[index].append(int(logits[-1].argmax()))
        batch = [
            ScheduledChunk(ids[i], (sequences[i][-1],), len(sequences[i]) - 1, blocks[i], "last")
            for i in range(len(prompts))
        ]


def _prefilled_requests(setup: Setup, lengths: tuple[int, ...]) -> list[ProposeRequest]:
    """Prompts prefilled on the target, each followed by the target's greedy token."""
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]
    blocks = [setup.blocks() for _ in prompts]
    ids = [f"draft-{setup.next_block}-{i}" for i in range(len(prompts))]
    out = setup.runner.execute_target(
        StepBatch(
            tuple(
                ScheduledChunk(i, tuple(p), 0, b, "last")
                for i, p, b in zip(ids, prompts, blocks, strict=True)
            )
        )
    )
    return [
        ProposeRequest(i, (*p, int(logits[-1].argmax())), b, temperature=1.0)
        for i, p, b, logits in zip(ids, prompts, blocks, out.logits, strict=True)
    ]


def test_draft_model_probs_match_transformers(setups, pair: ModelPair, backend: str) -> None:
    setup = setups(pair, backend)
    requests = _prefilled_requests(setup, (3, 6))
    drafts = setup.runner.propose(
        ProposeInput(tuple(requests), torch.Generator().manual_seed(3)), NUM_DRAFT_STEPS
    )
    for row, request in enumerate(requests):
        sequence = list(request.token_ids) + drafts.draft_token_ids[row].tolist()
        expected = torch.softmax(_hf_logits(setup.hf.draft, sequence[:-1]), dim=-1)
        expected = expected[len(request.token_ids) - 1 :]
        assert relative_error(drafts.draft_probs[row], expected) < RTOL, request.request_id


@torch.no_grad()
def test_gemma4_assistant_probs_match_transformers(setups, pair: ModelPair, backend: str) -> None:
    setup = setups(pair, backend)
    assert setup.runner.draft_kind is DraftKind.CONSTANT_POSITION
    requests = _prefilled_requests(setup, (3, 9))  # contexts within the sliding window
    drafts = setup.runner.propose(
        ProposeInput(tuple(requests), torch.Generator().manual_seed(3)), NUM_DRAFT_STEPS
    )
    target, assistant = setup.hf.target, setup.hf.draft
    for row, request in enumerate(requests):
        context = torch.tensor([request.token_ids[:-1]])
        out = target(context, output_hidden_states=True, return_shared_kv_states=True)
        hidden = out.hidden_states[-1][:, -1:]
        token = torch.tensor([[request.token_ids[-1]]])
        position = torch.tensor([[len(request.token_ids) - 1]])
        for step in range(NUM_DRAFT_STEPS):
            embeds = torch.cat([target.get_input_embeddings()(token), hidden], dim=-1)
            step_out = assistant(
                inputs_embeds=embeds, position_ids=position, shared_kv_states=out.shared_kv_states
            )
            expected = torch.softmax(step_out.logits[0, -1].float(), dim=-1)
            actual = drafts.draft_probs[row, step]
            assert relative_error(actual, expected) < RTOL, f"{request.request_id} step {step}"
            hidden = step_out.last_hidden_state
            token = drafts.draft_token_ids[row, step].view(1, 1)
