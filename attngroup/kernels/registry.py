"""Backend registry: a name for each backend, resolved lazily to its class.

Backends load by dotted path (the way vLLM's registry does), so importing the
registry never imports a backend's heavy dependencies (FlashInfer, Triton).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names below load without torch, for the command lines
    from attngroup.kernels.backend import AttentionBackend, StateBackend

BACKEND_PATHS: dict[str, str] = {
    "torch": "attngroup.kernels.backends.torch_ref.TorchReferenceBackend",
    "triton": "attngroup.kernels.backends.triton_attn.TritonAttentionBackend",
    "flashinfer": "attngroup.kernels.backends.flashinfer_attn.FlashInferBackend",
    "mamba": "attngroup.kernels.backends.mamba_state.MambaStateBackend",
}
STATE_BACKENDS = frozenset({"mamba"})  # they serve state layers, never attention layers
ATTENTION_BACKENDS = tuple(sorted(set(BACKEND_PATHS) - STATE_BACKENDS))


class UnknownBackendError(KeyError):
    def __str__(self) -> str:
        return (
            f"unknown attention backend {self.args[0]!r}; known: {', '.join(sorted(BACKEND_PATHS))}"
        )


class NotAnAttentionBackendError(ValueError):
    """A state backend named for attention layers."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"backend {name!r} serves state layers, not attention layers; "
            f"attention backends: {', '.join(ATTENTION_BACKENDS)}"
        )


class NotAStateBackendError(ValueError):
    """An attention backend named for state layers."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"backend {name!r} serves attention layers, not state layers; "
            f"state backends: {', '.join(sorted(STATE_BACKENDS))}"
        )


def check_attention_backend(name: str) -> str:
    """``name`` if it is a registered attention backend; raises otherwise."""
    if name in STATE_BACKENDS:
        raise NotAnAttentionBackendError(name)
    if name not in BACKEND_PATHS:
        raise UnknownBackendError(name)
    return name


def get_backend(name: str) -> type[AttentionBackend]:
    """The attention backend registered under ``name``; a state backend's name is refused."""
    from attngroup.kernels.backend import AttentionBackend

    backend = _load(check_attention_backend(name))
    if not issubclass(backend, AttentionBackend):
        raise NotAnAttentionBackendError(name)
    return backend


def get_state_backend(name: str) -> type[StateBackend]:
    """The state backend registered under ``name``; an attention backend's name is refused."""
    from attngroup.kernels.backend import StateBackend

    backend = _load(name)
    if not issubclass(backend, StateBackend):
        raise NotAStateBackendError(name)
    return backend


def _load(name: str) -> type:
    try:
        path = BACKEND_PATHS[name]
    except KeyError:
        raise UnknownBackendError(name) from None
    module_name, _, class_name = path.rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)
