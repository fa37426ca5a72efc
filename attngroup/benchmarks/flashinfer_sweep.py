"""FlashInfer at its best: every wrapper configuration FlashInfer offers on sm90, per case.

The benchmark's FlashInfer peer is the fastest configuration that matches the oracle,
not only the one this project's backend chooses: a case is compared with what a user of
FlashInfer could get. Each configuration runs through the FlashInfer backend's own
builder and implementation (``wrapper_choice``), so the plan is the engine's; the
backend's table choice is among them, and its latency over the best's is reported.
"""

from __future__ import annotations

from attngroup.benchmarks.attention_cases import Case
from attngroup.kernels.backends.flashinfer_attn import (
    FA2_PREFILL,
    TENSOR_CORE_DECODE,
    VERIFY_DECODE,
    QueryShape,
    WrapperChoice,
    choose_wrapper,
)

FA3_PREFILL = WrapperChoice("prefill", prefill_backend="fa3")
CUDA_CORE_DECODE = WrapperChoice("decode", tensor_cores=False)
FLASHINFER_CONFIGS: tuple[WrapperChoice, ...] = (
    CUDA_CORE_DECODE,
    TENSOR_CORE_DECODE,
    VERIFY_DECODE,
    FA2_PREFILL,
    FA3_PREFILL,
)
"""BatchDecode on CUDA cores and on tensor cores (with ``q_len_per_req`` for verify), and
BatchPrefill on FA2 and FA3. Left out: BatchAttention (the persistent kernel, no head 512;
it left a sticky CUDA error at head 512 in 0.6.13), and the trtllm-gen, cute-dsl and cuDNN
backends (SM100 kernels; FlashInfer's ``auto`` takes cuDNN only on SM100)."""
FA3_MAX_HEAD_SIZE = 256  # FA3 builds no 512-wide head


def case_queries(case: Case) -> QueryShape:
    return "single" if case.query_len == 1 else "uniform"


def configs_for(case: Case) -> list[WrapperChoice]:
    """The configurations that can run a case: those serving its query shape, FA3 up to head 256."""
    queries = case_queries(case)
    return [
        config
        for config in FLASHINFER_CONFIGS
        if config.serves(queries)
        and not (config is FA3_PREFILL and case.shape.head_size > FA3_MAX_HEAD_SIZE)
    ]


def table_choice(case: Case) -> WrapperChoice:
    """What the FlashInfer backend's table runs for this case."""
    return choose_wrapper(case.shape.head_size, case_queries(case))


def config_slug(config: WrapperChoice) -> str:
    """A configuration's name inside a metric name (no dots): decode-tensor-cores-q_len_per_req."""
    return config.describe().replace("/", "-")
