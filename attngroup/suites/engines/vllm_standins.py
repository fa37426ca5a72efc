"""Light stand-ins for what vLLM's grouping code reads of a model: its layers
and its config (the way vLLM's own CPU tests do it).

Layers are real subclasses of vLLM's ``AttentionLayerBase`` registered in the
real ``CompilationConfig.static_forward_context``, so vLLM's own
``get_layers_from_vllm_config`` finds them without patching. Attention layers
get vLLM's real ``TRITON_ATTN`` backend (the backend Gemma 4 forces, and the
one whose builders construct on a CPU), or a subclass of it named after the
layer's own backend (see ``attention_backend``); state layers get the backend
of their spec's ``mamba_type``.

The config is a namespace of vLLM's real sub-configs (cache, parallel,
scheduler, compilation, attention) plus a model-config stand-in answering the
model-wide questions builders ask when a version has no per-group helper.
vLLM is imported lazily, inside the functions.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from attngroup.reference_engine.layers import LayerDescription, Role

#: Small, so that builders' persistent buffers stay small on a CPU.
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 4096
MAMBA_CHUNK_SIZE = 256
TRITON = "triton"


@dataclass(frozen=True)
class ModelWideCounts:
    """What a ``ModelConfig`` reports model-wide, per TP rank. A real config
    has one count per model; the target's first attention layer stands for
    it (for the pairs here all target layers agree on query and KV heads)."""

    num_heads_q: int
    num_kv_heads: int
    head_size: int

    @classmethod
    def of_target(cls, layers: Sequence[LayerDescription]) -> ModelWideCounts | None:
        """The target's first attention layer (any attention layer when the
        set has no target); None for a model without attention."""
        attention = [layer for layer in layers if layer.is_attention]
        targets = [layer for layer in attention if layer.role is Role.TARGET]
        first = next(iter(targets or attention), None)
        if first is None:
            return None
        return cls(first.num_heads_q, first.num_kv_heads, first.head_size)


class StandInModelConfig:
    """The questions vLLM's builders and runner ask a ``ModelConfig``."""

    max_model_len = MAX_MODEL_LEN
    supports_kv_cache_grouping = False
    use_mla = False
    is_encoder_decoder = False
    rswa_window = None  # no residual sliding-window prefix

    def __init__(self, counts: ModelWideCounts | None) -> None:
        self._counts = counts

    @property
    def counts(self) -> ModelWideCounts:
        if self._counts is None:
            raise RuntimeError("model-wide head counts were asked of a config built without layers")
        return self._counts

    def get_num_attention_heads(self, parallel_config: Any) -> int:
        return self.counts.num_heads_q

    def get_num_kv_heads(self, parallel_config: Any) -> int:
        return self.counts.num_kv_heads

    def get_head_size(self) -> int:
        return self.counts.head_size

    def get_mamba_chunk_size(self) -> int:
        """Mamba-2's chunk size (state builders size their chunk tables by it)."""
        return MAMBA_CHUNK_SIZE


def make_vllm_config(
    counts: ModelWideCounts | None, forward_context: Mapping[str, Any]
) -> SimpleNamespace:
    """A ``VllmConfig`` stand-in: vLLM's real sub-configs, no speculative
    config (the draft layers are registered like any other layer, as the
    runner sees them), CUDA graphs off (nothing is captured on a CPU)."""
    from vllm import config
    from vllm.config.compilation import CUDAGraphMode

    compilation = config.CompilationConfig()
    compilation.cudagraph_mode = CUDAGraphMode.NONE
    compilation.static_forward_context.update(forward_context)
    return SimpleNamespace(
        model_config=StandInModelConfig(counts),
        cache_config=config.CacheConfig(),
        parallel_config=config.ParallelConfig(),
        scheduler_config=config.SchedulerConfig(
            max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False, max_num_seqs=MAX_NUM_SEQS
        ),
        compilation_config=compilation,
        attention_config=config.AttentionConfig(),
        speculative_config=None,
        num_speculative_tokens=0,
        use_flashinfer_replayssm=False,
        kv_transfer_config=None,
        lora_config=None,
        num_prefill_lookahead_tokens=1,
    )


@functools.cache
def stand_in_layer_class() -> type:
    """A subclass of vLLM's ``AttentionLayerBase`` built from a ``LayerDescription``."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    class StandInLayer(AttentionLayerBase):
        def __init__(self, layer: LayerDescription, backend: type, spec: Any) -> None:
            self.layer_name = layer.name
            self.backend = backend
            self.spec = spec
            self.kv_sharing_target_layer_name = layer.kv_sharing_target
            self.is_draft_layer = layer.is_draft
            if layer.is_attention:
                # The runner keys on ``layer.num_heads``; the strict helper reads
                # ``layer.impl.num_heads``: both are per-rank counts.
                self.num_heads = layer.num_heads_q
                self.num_kv_heads = layer.num_kv_heads
                self.head_size = layer.head_size
                self.sliding_window = layer.sliding_window
                self.impl = SimpleNamespace(
                    num_heads=layer.num_heads_q,
                    num_kv_heads=layer.num_kv_heads,
                    head_size=layer.head_size,
                    scale=layer.sm_scale,
                    sliding_window=layer.sliding_window,
                    logits_soft_cap=layer.logits_soft_cap,
                )

        def get_attn_backend(self) -> type:
            return self.backend

        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            return self.spec

        def __repr__(self) -> str:
            return f"StandInLayer({self.layer_name})"

    return StandInLayer


def attention_backend(name: str) -> type:
    """The vLLM backend class for a layer whose backend is ``name``.

    ``triton`` is vLLM's Triton backend itself, resolved through its registry.
    Any other name gets a subclass of it named after the backend (as vLLM
    makes dynamic backend subclasses, e.g. ``FastPrefill``): vLLM keys groups
    on the class's full name, so each backend keeps its own identity, while
    the builders stay Triton's, which construct on a CPU and read the head
    count from the same source as FlashInfer's in every version judged here.
    """
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    triton = AttentionBackendEnum.TRITON_ATTN.get_class()
    return triton if name == TRITON else _named_subclass(triton, name)


@functools.cache
def _named_subclass(base: type, name: str) -> type:
    if not name.isidentifier():
        raise ValueError(f"backend name {name!r} is not an identifier")
    qualname = f"{name.title()}AsTritonBackend"
    return type(qualname, (base,), {"__module__": __name__, "__qualname__": qualname})


def state_backend(vllm_spec: Any) -> type:
    """The backend vLLM pairs with a state spec (its ``mamba_type``)."""
    return vllm_spec.mamba_type.get_class()
