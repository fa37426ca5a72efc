"""Triton ops behind the backends: the unified attention kernel, its launch plan and the KV-cache write."""

from collections.abc import Mapping
from types import MappingProxyType

COMPILER_OPTIONS: Mapping[str, bool] = MappingProxyType({"enable_fp_fusion": True})
"""Triton compiler options every op launches with, stated instead of left to Triton's default.
FP fusion (``a * b + c`` as one FMA) is what the kernels were tuned and oracle-checked with;
Triton 3.9 warns on a launch that leaves it unset, as its default turns to off in 3.10."""
