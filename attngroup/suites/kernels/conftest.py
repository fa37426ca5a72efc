"""Fixtures of the kernel suites: the FlashInfer stand-in for CPU planning checks."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest

from attngroup.kernels.backends import flashinfer_attn
from attngroup.suites.kernels import flashinfer_standin

STANDIN_WORKSPACE_BYTES = 4096
"""The stand-in never touches the workspace; 128 MiB per builder would only cost memory."""


@pytest.fixture
def flashinfer_standin_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``attngroup.suites.kernels.flashinfer_standin`` installed as ``flashinfer`` for one test.

    The FlashInfer backend then runs on the CPU through its usual code path (builder,
    plans, impl), and the stand-in records every wrapper, plan and run.
    """
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer_standin)
    monkeypatch.setattr(flashinfer_attn, "WORKSPACE_BYTES", STANDIN_WORKSPACE_BYTES)
    monkeypatch.setattr(flashinfer_standin, "WRAPPERS", [])
    return flashinfer_standin
