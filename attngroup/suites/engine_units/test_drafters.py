"""The drafter interface (``attngroup.reference_engine.engine.spec_decode.drafter``) on stand-in models:
which tokens a drafter's catch-up pass runs, and how ``roll_back`` moves that point.

A drafter with its own KV cache runs, per call, the entries its cache does not
hold yet; ``roll_back`` (what the runner calls before drafting, with the tokens
the target validly cached) must bring that point back below rejected or
recomputed tokens, or the draft would attend over stale entries.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attngroup.reference_engine.engine.model_runner import DRAFTERS
from attngroup.reference_engine.engine.spec_decode.constant_position import ConstantPositionDrafter
from attngroup.reference_engine.engine.spec_decode.draft_model import DraftModelDrafter
from attngroup.reference_engine.engine.spec_decode.drafter import DraftInputs
from attngroup.reference_engine.engine.spec_decode.hidden_conditioned import (
    HiddenConditionedDrafter,
)
from attngroup.reference_engine.engine.spec_decode.hidden_states import HiddenStateBuffer
from attngroup.reference_engine.engine.step import ProposeRequest
from attngroup.reference_engine.engine.step_rows import StepRows
from attngroup.reference_engine.models import DraftKind
from attngroup.reference_engine.models.common import ForwardContext

pytestmark = pytest.mark.spec_decode

HIDDEN, VOCAB = 4, 7
BLOCKS = ((0, 1),)


class StandInDraft(nn.Module):
    """Any draft's call signature: (tokens, ctx) or (tokens, hidden, ctx); fixed logits."""

    def __init__(self, conditioned: bool) -> None:
        super().__init__()
        self.conditioned = conditioned

    def forward(self, token_ids, *rest):
        hidden = torch.ones(token_ids.shape[0], HIDDEN)
        return (hidden, hidden) if self.conditioned else hidden

    def compute_logits(self, hidden):
        return torch.arange(VOCAB, dtype=torch.float32).expand(hidden.shape[0], VOCAB)


@pytest.fixture
def passes() -> list[StepRows]:
    return []


def eager_decode_pass(model: nn.Module, forward_context):
    """``DraftInputs.decode_pass`` as the model runner serves it without CUDA graphs: one
    metadata build per decode pass, shared by the calls of that pass."""

    def decode_pass(rows: StepRows):
        contexts: list = []

        def step(token_ids, *extra):
            if not contexts:
                contexts.append(forward_context(rows))
            return model(token_ids, *extra, contexts[0])

        return step

    return decode_pass


def drafter(cls, passes: list[StepRows]):
    target_hidden = HiddenStateBuffer()
    target_hidden.write("r", 0, torch.zeros(16, HIDDEN))
    model = StandInDraft(conditioned=cls is not DraftModelDrafter)

    def forward_context(rows: StepRows) -> ForwardContext:
        """Records the pass; the stand-in draft reads nothing of its context."""
        passes.append(rows)
        return ForwardContext(torch.zeros(0, dtype=torch.int64), {}, {}, {})

    inputs = DraftInputs(
        model=model,
        device=torch.device("cpu"),
        forward_context=forward_context,
        target_hidden=target_hidden,
        decode_pass=eager_decode_pass(model, forward_context),
    )
    return cls(inputs)


def propose(drafter, num_tokens: int, k: int = 2):
    request = ProposeRequest("r", tuple(range(1, num_tokens + 1)), BLOCKS)
    drafter.roll_back("r", num_tokens - 1)
    return drafter.propose([request], k, None)


def test_every_draft_kind_has_a_drafter():
    assert set(DRAFTERS) == set(DraftKind)


@pytest.mark.parametrize(
    ("cls", "first", "after_roll_back"),
    [
        # token list of 6, then of 4: the draft model's entries 0..5 hold tokens 0..5;
        # 3 valid tokens leave entries 0..2, so the call reruns token 3 (seq_len 4).
        (DraftModelDrafter, (6, 6), (1, 4)),
        # EAGLE / MTP entry p pairs hidden p with token p + 1: entries 0..4 after 6
        # tokens; 3 valid tokens leave entries 0..1, so the call reruns entry 2 (seq_len 3).
        (HiddenConditionedDrafter, (5, 5), (1, 3)),
    ],
    ids=["draft-model", "eagle-mtp"],
)
def test_roll_back_moves_the_catch_up_below_invalid_tokens(passes, cls, first, after_roll_back):
    own_kv = drafter(cls, passes)
    propose(own_kv, 6)
    assert (passes[0].query_lens[0], passes[0].seq_lens[0]) == first
    passes.clear()
    propose(own_kv, 4)  # e.g. recomputed after preemption: only 3 tokens are valid
    assert (passes[0].query_lens[0], passes[0].seq_lens[0]) == after_roll_back


@pytest.mark.parametrize("cls", [DraftModelDrafter, HiddenConditionedDrafter], ids=["dm", "eagle"])
def test_remove_forgets_the_request(passes, cls):
    own_kv = drafter(cls, passes)
    propose(own_kv, 6)
    own_kv.remove("r")
    passes.clear()
    propose(own_kv, 6)
    assert passes[0].query_lens[0] == first_call_entries(cls, 6)


def first_call_entries(cls, num_tokens: int) -> int:
    return num_tokens if cls is DraftModelDrafter else num_tokens - 1


def test_constant_position_drafter_builds_metadata_once_for_k_steps(passes):
    assistant = drafter(ConstantPositionDrafter, passes)
    tokens, probs = propose(assistant, 6, k=3)
    assert len(passes) == 1
    assert (passes[0].seq_lens, passes[0].rope_positions.tolist()) == ((5,), [5])
    assert [int(t[0]) for t in tokens] == [VOCAB - 1] * 3
    assert all(float(p[0, VOCAB - 1]) == 1.0 for p in probs)
