"""Token sampling from logits: greedy (temperature 0) or from softmax(logits / T).

One ``torch.Generator`` drives every random draw of an engine, so a run is
reproducible from its seed.
"""

from __future__ import annotations

import torch


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float32; one-hot on the argmax for T == 0."""
    logits = logits.float()
    if temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``probs`` [..., vocab] (rows need not be normalised)."""
    flat = probs.reshape(-1, probs.shape[-1])
    tokens = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return tokens.reshape(probs.shape[:-1])


def sample(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """Tokens for logits [..., vocab]: argmax when greedy, else a draw at ``temperature``."""
    if temperature == 0.0:
        return logits.argmax(-1)
    return sample_from_probs(probs_from_logits(logits, temperature), generator)
