"""The Gemma 4 assistant drafter (transformers' ``Gemma4AssistantForCausalLM``,
vLLM's ``Gemma4MTP``).

Every layer is Q-only: it reads the K/V the target's last non-shared layer of
its type wrote, and writes nothing. One draft step:

    x = pre_projection(cat(target_embed(token) * sqrt(backbone_hidden), h))
    x = layers(x); normed = norm(x)
    logits = lm_head(normed); h_next = post_projection(normed)

where ``h`` is the target's final-normed hidden state at the position before
``token`` for the first step and ``h_next`` of the previous step afterwards.
The token embedding is the *target's* (the assistant's own ``embed_tokens``
is a draft-width placeholder that vLLM replaces and we do not load).

What the engine computes for a draft query (decided here, documented in the
model runner): the query attends over the target's cache at positions
0 .. L-2 (everything the target has validly cached, L = tokens known incl. the
one just sampled; sliding layers: the last ``sliding_window`` of them), with
the constant RoPE position L-1 for all k steps, like transformers'
``Gemma4AssistantCandidateGenerator`` (``position_ids = input_ids.shape[1] - 1``).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Gemma4AssistantConfig

from attngroup.reference_engine.model_pairs import ModelPair
from attngroup.reference_engine.models.common import FamilyModels, ForwardContext, LanguageModel
from attngroup.reference_engine.models.gemma4 import Gemma4ForCausalLM, Gemma4Stack, Gemma4TextModel
from attngroup.reference_engine.models.parallel import SINGLE, TensorParallel


class Gemma4Assistant(LanguageModel):
    def __init__(
        self,
        config: Gemma4AssistantConfig,
        target_model: Gemma4TextModel,
        layer_prefix: str = "draft_model",
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        text = config.get_text_config()
        if getattr(config, "use_ordered_embeddings", False):
            raise ValueError(
                "Gemma 4 assistant with use_ordered_embeddings=True (centroid logits) is not supported"
            )
        if text.hidden_size_per_layer_input:
            raise ValueError(
                "the Gemma 4 assistant's text config must have hidden_size_per_layer_input=0"
            )
        if config.backbone_hidden_size != target_model.hidden_size:
            raise ValueError(
                f"assistant backbone_hidden_size {config.backbone_hidden_size} != target hidden size "
                f"{target_model.hidden_size}"
            )
        self.model = Gemma4Stack(text, layer_prefix, tp, all_kv_shared=True)
        self.pre_projection = nn.Linear(
            2 * config.backbone_hidden_size, text.hidden_size, bias=False
        )
        self.post_projection = nn.Linear(text.hidden_size, config.backbone_hidden_size, bias=False)
        self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        # Not a submodule: the target owns (and loads) its embedding.
        self._target_embed = target_model.embed

    def forward(
        self, token_ids: torch.Tensor, hidden: torch.Tensor, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (final-normed draft hidden for the logits, post-projected hidden fed back)."""
        x = self.pre_projection(torch.cat([self._target_embed(token_ids), hidden], dim=-1))
        normed = self.model.norm(self.model.run_layers(x, None, ctx))
        return normed, self.post_projection(normed)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


def build_gemma4_pair(pair: ModelPair, tp: TensorParallel) -> FamilyModels:
    """The family's builder: the target and its assistant, which embeds with the
    target's embedding (its own ``embed_tokens`` is a placeholder, not loaded)."""
    target = Gemma4ForCausalLM(pair.target_config(), "model", tp)
    draft = Gemma4Assistant(pair.draft_config(), target.model, "draft_model", tp)
    return FamilyModels(target, draft, draft_skips=("model.embed_tokens.",))
