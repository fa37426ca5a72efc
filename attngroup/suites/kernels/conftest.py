"""Fixtures of the kernel suites: the FlashInfer stand-in for CPU planning checks."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest
import torch

from attngroup.kernels.backends import flashinfer_attn
from attngroup.suites.kernels import flashinfer_standin

STANDIN_WORKSPACE_BYTES = 4096
"""The stand-in never touches the workspace; 128 MiB per builder would only cost memory."""


_real_is_available = flashinfer_attn.FlashInferBackend.is_available


def _standin_serves(cls: type, device: torch.device | str) -> bool:
    """FlashInfer's availability while the stand-in is installed: its CPU, besides the GPU."""
    return torch.device(device).type == "cpu" or _real_is_available(device)


@pytest.fixture
def flashinfer_standin_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``attngroup.suites.kernels.flashinfer_standin`` installed as ``flashinfer`` for one test.

    The FlashInfer backend then runs on the CPU through its usual code path (builder,
    plans, impl), and the stand-in records every wrapper, plan and run. The backend is
    told here, for this test only, that the CPU serves: FlashInfer itself needs CUDA.
    """
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer_standin)
    monkeypatch.setattr(
        flashinfer_attn.FlashInferBackend, "is_available", classmethod(_standin_serves)
    )
    monkeypatch.setattr(flashinfer_attn, "WORKSPACE_BYTES", STANDIN_WORKSPACE_BYTES)
    monkeypatch.setattr(flashinfer_standin, "WRAPPERS", [])
    return flashinfer_standin
