"""The words a vLLM verdict file uses, apart from the code that judges: the timeline reads
and renders verdict files without importing torch or the adapter."""

from __future__ import annotations

PASS, FAIL, ADAPTER_ERROR, UNAVAILABLE = "pass", "fail", "adapter error", "unavailable"
VERDICTS = (PASS, FAIL, ADAPTER_ERROR, UNAVAILABLE)
#: The exit status of a run with any adapter error (a harness failure, never a verdict).
ADAPTER_ERROR_EXIT = 3
#: ``auto``: the model runner vLLM itself picks for a pair; ``v1``/``v2`` force one.
RUNNER_CHOICES = ("auto", "v1", "v2")
