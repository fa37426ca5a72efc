"""Speculative-decoding verification: which drafts to keep, and the token after them.

Output is [batch, k + 1]: the emitted tokens of each request, left-aligned,
then ``PLACEHOLDER_TOKEN_ID`` (-1), as vLLM's rejection sampler returns.

- Greedy: emit argmax(target) position by position; stop after the first
  position where the draft differs; when all k drafts match, the bonus token
  argmax(target at k) follows.
- Random (Leviathan et al.): accept draft ``x`` at position j when
  ``u <= p_j(x) / q_j(x)``, ``u ~ U(0, 1)``; at the first rejection emit a
  token from ``normalise(max(p_j - q_j, 0))`` and stop; when all are accepted
  emit a bonus token from ``p_k``. The emitted tokens then follow the target
  distribution exactly, whatever the draft.
"""

from __future__ import annotations

import torch

from attngroup.reference_engine.engine.sampler import sample_from_probs

PLACEHOLDER_TOKEN_ID = -1


def _emit(accepted_len: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Keep ``tokens[:, : accepted_len + 1]`` per row, placeholders after."""
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    keep = positions[None, :] <= accepted_len[:, None]
    return torch.where(keep, tokens, torch.full_like(tokens, PLACEHOLDER_TOKEN_ID))


def _accepted_prefix_len(accepted: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True per row of [batch, k]."""
    return accepted.long().cumprod(dim=1).sum(dim=1)


def greedy_rejection_sample(
    draft_token_ids: torch.Tensor, target_logits: torch.Tensor
) -> torch.Tensor:
    """draft_token_ids [B, k], target_logits [B, k + 1, vocab] -> [B, k + 1]."""
    _check_shapes(draft_token_ids, target_logits)
    target_argmax = target_logits.argmax(dim=-1)
    k = draft_token_ids.shape[1]
    accepted_len = _accepted_prefix_len(draft_token_ids == target_argmax[:, :k])
    return _emit(accepted_len, target_argmax)


def random_rejection_sample(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """draft_token_ids [B, k], draft_probs [B, k, vocab], target_probs [B, k + 1, vocab] -> [B, k + 1]."""
    _check_shapes(draft_token_ids, target_probs)
    batch, k = draft_token_ids.shape
    if draft_probs.shape != (batch, k, target_probs.shape[-1]):
        raise ValueError(
            f"draft_probs must be [{batch}, {k}, {target_probs.shape[-1]}], got {tuple(draft_probs.shape)}"
        )
    index = draft_token_ids.unsqueeze(-1)
    p_draft = target_probs[:, :k].gather(-1, index).squeeze(-1)
    q_draft = draft_probs.gather(-1, index).squeeze(-1)
    uniform = torch.rand((batch, k), generator=generator, device=draft_probs.device)
    accepted = (q_draft > 0) & (uniform * q_draft <= p_draft)
    accepted_len = _accepted_prefix_len(accepted)

    residual = (target_probs[:, :k] - draft_probs).clamp_min(0)
    # Where p <= q everywhere (p == q) rejection has probability 0; fall back to p to stay defined.
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, target_probs[:, :k], residual)
    recovered = sample_from_probs(residual, generator)
    bonus = sample_from_probs(target_probs[:, k], generator)
    # Position j < accepted_len keeps the draft; position accepted_len takes the recovered
    # token (or the bonus token when j == k); later positions become placeholders.
    resampled = torch.cat([recovered, bonus[:, None]], dim=1)
    drafts_padded = torch.cat([draft_token_ids, bonus[:, None]], dim=1)
    positions = torch.arange(k + 1, device=draft_token_ids.device)
    tokens = torch.where(positions[None, :] < accepted_len[:, None], drafts_padded, resampled)
    return _emit(accepted_len, tokens)


def num_emitted(output: torch.Tensor) -> torch.Tensor:
    """Emitted tokens per row of a rejection sampler's output."""
    return (output != PLACEHOLDER_TOKEN_ID).sum(dim=1)


def _check_shapes(draft_token_ids: torch.Tensor, target: torch.Tensor) -> None:
    if draft_token_ids.ndim != 2 or draft_token_ids.shape[1] < 1:
        raise ValueError(
            f"draft_token_ids must be [batch, k >= 1], got {tuple(draft_token_ids.shape)}"
        )
    batch, k = draft_token_ids.shape
    if target.ndim != 3 or target.shape[:2] != (batch, k + 1):
        raise ValueError(f"target must be [{batch}, {k + 1}, vocab], got {tuple(target.shape)}")
