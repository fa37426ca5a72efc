"""The kernel suite's FlashInfer stand-in fixture, for the CPU cases of the CUDA-graph suite."""

from attngroup.suites.kernels.conftest import flashinfer_standin_module

__all__ = ["flashinfer_standin_module"]
