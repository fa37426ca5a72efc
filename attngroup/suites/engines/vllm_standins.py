"""Light stand-ins for what vLLM's grouping code reads of a model: its layers
and its config (the way vLLM's own CPU tests do it).

Layers are registered in the real ``CompilationConfig.static_forward_context``, so
vLLM's own ``get_layers_from_vllm_config`` finds them without patching: attention
layers are subclasses of vLLM's concrete ``Attention`` (releases look KV-sharing layers
up by it), state layers of ``AttentionLayerBase``. Attention layers get vLLM's real
``TRITON_ATTN`` backend (the backend Gemma 4 forces, and the one whose builders
construct on a CPU), or a subclass of it named after the layer's own backend (see
``attention_backend``); state layers get the backend of their spec's ``mamba_type``.
Every stand-in class name carries ``StandIn``: an error naming one is the adapter's.

The config is a ``ConfigView`` of ``VllmConfig`` over vLLM's real sub-configs (cache,
parallel, scheduler, compilation, attention), a model-config view answering the
model-wide questions builders ask when a version has no per-group helper, and a
speculative-config view naming the pair's method, so that vLLM's own properties (the
runner rule) run on them. vLLM is imported lazily, inside the functions.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol, cast

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


class ConfigView:
    """A vLLM config class answered from explicit values, then from the class itself.

    A real ``VllmConfig``/``ModelConfig`` needs a model checkpoint; the grouping code only
    reads a few fields and asks a few questions (``use_v2_model_runner``, ``use_eagle()``).
    A view holds the fields given, runs the class's own properties and methods on itself
    (so vLLM's own rule decides, with the values given), and reads any other field's
    declared default. A field without a default is an ``AttributeError`` naming the
    class and the field: the stand-in lacks something this release reads.
    """

    def __init__(self, config_class: type, **values: Any) -> None:
        object.__setattr__(self, "_config_class", config_class)
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        config_class = object.__getattribute__(self, "_config_class")
        try:
            attribute = inspect.getattr_static(config_class, name)
        except AttributeError:
            attribute = _MISSING
        if isinstance(attribute, property) and attribute.fget is not None:
            return attribute.fget(self)
        if isinstance(attribute, functools.cached_property):
            return attribute.func(self)
        if isinstance(attribute, staticmethod | classmethod):
            return attribute.__get__(self, config_class)
        if inspect.isfunction(attribute):
            return types.MethodType(attribute, self)
        default = _field_default(config_class, name)
        if default is not _MISSING:
            return default
        raise AttributeError(
            f"the StandIn view of {config_class.__name__} has no {name!r} (vLLM reads it "
            "here; the adapter must give it)",
            name=name,
            obj=self,
        )

    def __repr__(self) -> str:
        return f"ConfigView({object.__getattribute__(self, '_config_class').__name__})"


_MISSING = object()


def _field_default(config_class: type, name: str) -> Any:
    fields = getattr(config_class, "__dataclass_fields__", {})
    field = fields.get(name)
    if field is None:
        return _MISSING
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return _MISSING


@dataclass(frozen=True)
class ModelIdentity:
    """What vLLM's runner rule reads of a model and its speculative method: the target's
    architectures, the method as vLLM names it after its own normalisation, and whether
    the model keeps recurrent state (``ModelConfig.has_inner_state``)."""

    architectures: tuple[str, ...]
    spec_method: str | None
    has_inner_state: bool = False


class StandInModelConfig(ConfigView):
    """The questions vLLM's builders and runner ask a ``ModelConfig``."""

    def __init__(self, counts: ModelWideCounts | None, identity: ModelIdentity | None) -> None:
        from vllm.config import ModelConfig

        identity = identity or ModelIdentity(architectures=(), spec_method=None)
        super().__init__(
            ModelConfig,
            max_model_len=MAX_MODEL_LEN,
            supports_kv_cache_grouping=False,
            use_mla=False,
            is_encoder_decoder=False,
            rswa_window=None,  # no residual sliding-window prefix
            runner_type="generate",
            architectures=list(identity.architectures),
            architecture=next(iter(identity.architectures), None),
            has_inner_state=identity.has_inner_state,
            is_hybrid=identity.has_inner_state,
            is_moe=False,
            is_quantized=False,
            hf_config=SimpleNamespace(architectures=list(identity.architectures)),
            _counts=counts,
        )

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
    counts: ModelWideCounts | None,
    forward_context: Mapping[str, Any],
    identity: ModelIdentity | None = None,
) -> ConfigView:
    """A ``VllmConfig`` view over vLLM's real sub-configs: a speculative config naming the
    pair's method (the draft layers are registered like any other layer, as the runner
    sees them), CUDA graphs off (nothing is captured on a CPU)."""
    from vllm import config
    from vllm.config.compilation import CUDAGraphMode

    compilation = config.CompilationConfig()
    compilation.cudagraph_mode = CUDAGraphMode.NONE
    compilation.static_forward_context.update(forward_context)
    method = identity.spec_method if identity else None
    speculative = (
        ConfigView(
            config.SpeculativeConfig,
            method=method,
            num_speculative_tokens=1,
            parallel_drafting=False,
            use_heterogeneous_vocab=False,
        )
        if method
        else None
    )
    return ConfigView(
        config.VllmConfig,
        model_config=StandInModelConfig(counts, identity),
        cache_config=config.CacheConfig(),
        parallel_config=config.ParallelConfig(),
        scheduler_config=config.SchedulerConfig(
            max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False, max_num_seqs=MAX_NUM_SEQS
        ),
        compilation_config=compilation,
        attention_config=config.AttentionConfig(),
        speculative_config=speculative,
        num_speculative_tokens=0,
        use_flashinfer_replayssm=False,
        kv_transfer_config=None,
        lora_config=None,
        reasoning_config=None,
        num_prefill_lookahead_tokens=1,
    )


@functools.cache
def stand_in_layer_classes() -> tuple[type, type]:
    """The stand-in attention and state layer classes.

    Attention layers subclass vLLM's concrete ``Attention`` (releases look KV-sharing
    layers up by it, ``get_layers_from_vllm_config(vllm_config, Attention)``), state
    layers its ``AttentionLayerBase`` (what the group discovery filters by). Neither runs
    vLLM's ``__init__``, which builds a real attention implementation."""
    from torch import nn
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    class StandInAttention(_StandInLayer, Attention):
        def __init__(self, name: str, backend: type, spec: Any, layer: LayerDescription) -> None:
            nn.Module.__init__(self)
            _describe(self, name, backend, spec, layer)

    class StandInStateLayer(_StandInLayer, AttentionLayerBase):
        def __init__(
            self, name: str, backend: type, spec: Any, layer: LayerDescription | None
        ) -> None:
            _describe(self, name, backend, spec, layer)

    return StandInAttention, StandInStateLayer


def stand_in_layer(layer: LayerDescription, backend: type, spec: Any) -> Any:
    attention_class, state_class = stand_in_layer_classes()
    layer_class = attention_class if layer.is_attention else state_class
    return layer_class(layer.name, backend, spec, layer)


def spec_only_layer(name: str, spec: Any) -> Any:
    """A layer known only by its spec (``kv_cache_groups`` gets no layers): what the
    layout step reads of it is its backend."""
    backend = state_backend(spec) if hasattr(spec, "mamba_type") else attention_backend(TRITON)
    return stand_in_layer_classes()[1](name, backend, spec, None)


class _StandInLayer:
    """What both stand-in layers answer vLLM: the backend and spec they were described with."""

    layer_name: str
    backend: type
    spec: Any

    def get_attn_backend(self) -> type:
        return self.backend

    def get_kv_cache_spec(self, vllm_config: Any) -> Any:
        return self.spec

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.layer_name})"


def _describe(
    target: Any, name: str, backend: type, spec: Any, layer: LayerDescription | None
) -> None:
    target.layer_name = name
    target.backend = backend
    target.spec = spec
    target.kv_sharing_target_layer_name = layer.kv_sharing_target if layer else None
    target.is_draft_layer = layer.is_draft if layer else False
    if layer is not None and layer.is_attention:
        # The runner keys on ``layer.num_heads``; the strict helper reads
        # ``layer.impl.num_heads``: both are per-rank counts.
        target.num_heads = layer.num_heads_q
        target.num_kv_heads = layer.num_kv_heads
        target.head_size = layer.head_size
        target.sliding_window = layer.sliding_window
        target.impl = SimpleNamespace(
            num_heads=layer.num_heads_q,
            num_kv_heads=layer.num_kv_heads,
            head_size=layer.head_size,
            scale=layer.sm_scale,
            sliding_window=layer.sliding_window,
            logits_soft_cap=layer.logits_soft_cap,
        )


class AttentionBackendClass(Protocol):
    """What the adapter asks of a vLLM attention backend class besides vLLM's own uses."""

    @staticmethod
    def get_builder_cls() -> type[object]: ...


def attention_backend(name: str) -> type[AttentionBackendClass]:
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
def _named_subclass(base: type[AttentionBackendClass], name: str) -> type[AttentionBackendClass]:
    if not name.isidentifier():
        raise ValueError(f"backend name {name!r} is not an identifier")
    qualname = f"{name.title()}AsTritonBackend"
    subclass = type(qualname, (base,), {"__module__": __name__, "__qualname__": qualname})
    # type() with a base is typed plain ``type``; the class it makes is a subclass of base.
    return cast(type[AttentionBackendClass], subclass)


def state_backend(vllm_spec: Any) -> type:
    """The backend vLLM pairs with a state spec (its ``mamba_type``): an enum member that
    names its class from 0.21 on, a name vLLM's selector resolves before (0.20)."""
    mamba_type = vllm_spec.mamba_type
    if isinstance(mamba_type, str):
        from vllm.v1.attention.selector import get_mamba_attn_backend

        return get_mamba_attn_backend(mamba_type)
    return mamba_type.get_class()
