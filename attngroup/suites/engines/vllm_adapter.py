"""The vLLM adapter: the grouping suites judge vLLM's own code.

``--engine vllm`` runs, in the installed vLLM, the code an engine start-up runs for
grouping, in that release's own order, with light stand-ins for layers and config
(``attngroup.suites.engines.vllm_standins``). Which steps a release has is read off the
release itself (``vllm_startup``): the functions its engine core imports, the methods
and signatures of its runners; never its version number.

1. KV-cache groups as the engine core computes them (layout resolution first where
   the core resolves one, then its global or per-worker grouping).
2. The runner vLLM would use for the model (``VllmConfig.use_v2_model_runner`` asked
   of a config naming the pair's architecture and speculative method) or the one
   ``--runner``/``$AGC_VLLM_RUNNER`` asks for: the V1 ``GPUModelRunner``'s grouping
   methods or the V2 ``attn_utils.init_attn_backend``.
3. Each group's builder head count is read off the real builder vLLM made.

vLLM's errors are verdicts (start-up failed); an error of the adapter, its stand-ins or
a missing import is raised as ``AdapterError``, never reported as vLLM's. Nothing here
imports vLLM at module import: the adapter's own tests run without it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch

from attngroup.reference_engine.kv_cache_spec import KVCacheGroupSpec, KVCacheSpec, MambaSpec
from attngroup.reference_engine.layers import LayerDescription
from attngroup.reference_engine.model_pairs import ModelPair
from attngroup.suites.engines.base import (
    AdapterError,
    AttentionGroupView,
    EngineAdapter,
    GroupingOutcome,
    StartupRequest,
)
from attngroup.suites.engines.verdict_states import RUNNER_CHOICES
from attngroup.suites.engines.vllm_specs import from_vllm_group, from_vllm_spec, to_vllm_spec
from attngroup.suites.engines.vllm_standins import (
    ModelIdentity,
    ModelWideCounts,
    attention_backend,
    make_vllm_config,
    spec_only_layer,
    stand_in_layer,
    state_backend,
)
from attngroup.suites.engines.vllm_startup import (
    GroupBuilders,
    StartUp,
    engine_error_text,
    raise_classified,
)

NATIVE = "native"
INSTALL_HINT = (
    "--engine vllm needs vLLM importable (`nox -s vllm_conformance` builds one venv per "
    "release; see noxfile_vllm.py)"
)
RUNNER_ENV = "AGC_VLLM_RUNNER"
#: The Hugging Face architecture of each pair family's target, as vLLM's rules read it.
FAMILY_ARCHITECTURES = {
    "gemma4": "Gemma4ForConditionalGeneration",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
}


def has_module(name: str) -> bool:
    """Whether ``name`` imports here (False when a parent package is missing)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def requested_runner(value: str | None = None) -> str:
    """``auto`` (vLLM's own rule), ``v1`` or ``v2``: ``value``, else ``$AGC_VLLM_RUNNER``."""
    runner = (value or os.environ.get(RUNNER_ENV) or "auto").lower()
    if runner not in RUNNER_CHOICES:
        raise ValueError(f"runner {runner!r} is not one of {', '.join(RUNNER_CHOICES)}")
    return runner


def model_identity(pair: ModelPair | None, layers: Sequence[LayerDescription]) -> ModelIdentity:
    """What vLLM's runner rule reads of the model the layers come from."""
    has_state = any(not layer.is_attention for layer in layers)
    if pair is None:
        return ModelIdentity(architectures=(), spec_method=None, has_inner_state=has_state)
    return ModelIdentity(
        architectures=(FAMILY_ARCHITECTURES[pair.family],),
        spec_method=pair.spec_method.value,
        has_inner_state=has_state,
    )


class VllmEngineAdapter(EngineAdapter):
    """vLLM's own grouping code behind the adapter seam."""

    name = "vllm"

    def __init__(self, device: torch.device | str = "cpu", runner: str | None = None) -> None:
        self.device = torch.device(device)
        self.requested_runner = requested_runner(runner)
        self._startup: StartUp | None = None

    @property
    def startup(self) -> StartUp:
        """The installed release's start-up steps (found once, on first use)."""
        if self._startup is None:
            try:
                self._startup = StartUp.discover()
            except Exception as error:
                raise AdapterError.wrapping(error, "finding vLLM's start-up steps") from error
        return self._startup

    @property
    def version(self) -> str:
        import vllm

        return vllm.__version__

    def kv_cache_groups(
        self, specs: Mapping[str, KVCacheSpec], kv_sharing: Mapping[str, str]
    ) -> list[KVCacheGroupSpec]:
        _refuse_shared_layers_with_specs(specs, kv_sharing)
        try:
            vllm_specs = {name: to_vllm_spec(spec) for name, spec in pad_state_pages(specs).items()}
            forward_context = {
                name: spec_only_layer(name, spec) for name, spec in vllm_specs.items()
            }
            vllm_config = make_vllm_config(None, forward_context)
            startup = self.startup
        except Exception as error:
            raise AdapterError.wrapping(error, "building the stand-ins") from error
        try:
            groups = startup.kv_cache_groups(vllm_config, vllm_specs)
            startup.add_kv_sharing_layers(dict(kv_sharing), groups)
        except Exception as error:  # vLLM's own error is the finding; ours is not
            raise_classified(error, "KV-cache grouping")
        return [from_vllm_group(group) for group in groups]

    def start_up(self, request: StartupRequest) -> GroupingOutcome:
        if request.policy != NATIVE:
            raise ValueError(
                f"vLLM runs only its own grouping policy {NATIVE!r}, not {request.policy!r}"
            )
        specs = {
            layer.name: spec
            for layer in request.layers
            if (spec := layer.kv_cache_spec(request.block_size, request.dtype)) is not None
        }
        padded = pad_state_pages(specs)
        try:
            vllm_specs = {name: to_vllm_spec(spec) for name, spec in padded.items()}
            forward_context = {layer.name: _stand_in(layer, vllm_specs) for layer in request.layers}
            vllm_config = make_vllm_config(
                ModelWideCounts.of_target(request.layers),
                forward_context,
                model_identity(request.pair, request.layers),
            )
            startup = self.startup
        except Exception as error:
            raise AdapterError.wrapping(error, "building the stand-ins") from error
        runner = startup.choose_runner(self.requested_runner, vllm_config)
        try:
            groups = startup.kv_cache_groups(vllm_config, vllm_specs)
        except Exception as error:  # start-up failed before any attention group existed
            return GroupingOutcome((), (), engine_error_text(error, "KV-cache grouping"), runner)
        kv_cache_config = startup.kv_cache_config(groups, vllm_config)
        draft_names = {layer.name for layer in request.layers if layer.is_draft}
        uses_draft_model = (
            request.pair is not None and request.pair.spec_method.value == "draft_model"
        )
        try:
            attn_groups, builders = startup.start_runner(
                runner, vllm_config, kv_cache_config, draft_names if uses_draft_model else None,
                self.device,
            )  # fmt: skip
        except Exception as error:
            return GroupingOutcome(
                _converted(kv_cache_config), (), engine_error_text(error, "attention grouping"),
                runner,
            )  # fmt: skip
        # The runner has appended the KV-sharing layers to their targets' groups.
        try:
            views = tuple(
                tuple(_view(group, builders[id(group)], forward_context) for group in per_kv)
                for per_kv in attn_groups
            )
            kv_cache_groups = _converted(kv_cache_config)
        except Exception as error:
            raise AdapterError.wrapping(error, "reading vLLM's groups") from error
        first_error = next(
            (view.builder_error for row in views for view in row if view.builder_error), None
        )
        return GroupingOutcome(kv_cache_groups, views, first_error, runner)


def pad_state_pages(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """State pages padded to the largest attention page, as vLLM's config
    step for hybrid models (``HybridAttentionMambaModelConfig``) sets
    ``mamba_page_size_padded`` before any spec reaches grouping. That step
    needs the model class, so it is the one step done here, not by vLLM."""
    attention_pages = [s.page_size_bytes for s in specs.values() if not isinstance(s, MambaSpec)]
    if not attention_pages:
        return dict(specs)
    page = max(attention_pages)
    padded = {}
    for name, spec in specs.items():
        if isinstance(spec, MambaSpec) and spec.page_size_padded is None:
            if spec.page_size_bytes > page:
                raise ValueError(
                    f"layer {name}: its state ({spec.page_size_bytes} bytes) exceeds the attention "
                    f"page ({page} bytes); vLLM would raise the attention block size: pass a "
                    "larger block_size"
                )
            spec = replace(spec, page_size_padded=page)
        padded[name] = spec
    return padded


def _refuse_shared_layers_with_specs(
    specs: Mapping[str, KVCacheSpec], kv_sharing: Mapping[str, str]
) -> None:
    """In vLLM a KV-sharing layer owns no cache (``get_kv_cache_spec`` skips
    it), so a layer with both cannot be built; say so rather than double-place it."""
    both = sorted(set(specs) & set(kv_sharing))
    if both:
        raise ValueError(
            f"layers {both} both share another layer's KV cache and have a KV-cache spec; "
            "in vLLM a KV-sharing layer owns no cache: drop its spec or its kv_sharing entry"
        )


def _stand_in(layer: LayerDescription, vllm_specs: Mapping[str, Any]) -> Any:
    spec = vllm_specs.get(layer.name)
    backend = attention_backend(layer.backend) if layer.is_attention else state_backend(spec)
    return stand_in_layer(layer, backend, spec)


def _converted(kv_cache_config: Any) -> tuple[KVCacheGroupSpec, ...]:
    return tuple(from_vllm_group(group) for group in kv_cache_config.kv_cache_groups)


def _view(
    group: Any, builders: GroupBuilders, forward_context: Mapping[str, Any]
) -> AttentionGroupView:
    """One vLLM ``AttentionGroup`` as the seam's view. ``num_heads_q`` is the
    head count vLLM's key reads (``getattr(layer, "num_heads", 0)``) of the
    group's first layer: a version keyed without it may mix counts, which the
    suites find by checking every layer against it."""
    return AttentionGroupView(
        backend=".".join(group.backend.full_cls_name()),
        layer_names=tuple(group.layer_names),
        kv_cache_spec=from_vllm_spec(group.kv_cache_spec),
        kv_cache_group_id=group.kv_cache_group_id,
        num_heads_q=getattr(forward_context[group.layer_names[0]], "num_heads", 0),
        builder_num_heads=builders.num_heads,
        builder_error=builders.error,
    )


def make_adapter(config: pytest.Config | None) -> EngineAdapter:
    """The adapter for ``--engine vllm`` (``config`` None outside pytest)."""
    if not has_module("vllm"):
        raise pytest.UsageError(INSTALL_HINT)
    device = config.getoption("device") if config is not None else None
    try:
        return VllmEngineAdapter(device or "cpu")
    except ValueError as error:
        raise pytest.UsageError(f"${RUNNER_ENV}: {error}") from None
