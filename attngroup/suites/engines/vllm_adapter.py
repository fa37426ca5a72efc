"""The vLLM adapter: the grouping suites judge vLLM's own code.

``--engine vllm`` runs, in the installed vLLM, the code an engine start-up
runs for grouping, with light stand-ins for layers and config
(``attngroup.suites.engines.vllm_standins``):

1. KV-cache groups: ``get_global_kv_cache_groups`` (``kv_cache_planning``,
   after ``resolve_kv_cache_layout``, as the engine core does) where it
   exists, else ``kv_cache_utils.get_kv_cache_groups``; KV-sharing layers
   then join their target's group through ``add_kv_sharing_layers_to_kv_cache_groups``.
2. Attention groups and builders, in the runner the version uses by default:
   the V1 ``GPUModelRunner`` (``maybe_add_kv_sharing_layers_to_kv_cache_groups``,
   ``initialize_attn_backend`` called unbound on a stand-in runner,
   ``prepare_kernel_block_sizes``, then each group's real
   ``create_metadata_builders`` as ``initialize_metadata_builders`` does),
   or, where the V1 runner is gone, the V2 ``attn_utils.init_attn_backend``.
3. Each group's builder head count is read off the real builder vLLM made
   (Triton's ``num_heads_q``): the strict per-group helper where the version
   has it, the model-wide ``ModelConfig.get_num_attention_heads`` otherwise.
   A builder that raises (the strict check) is reported with its error.

Nothing here imports vLLM at module import: the adapter's own tests run
without it, and ``make_adapter`` says how to install it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch

from attngroup.reference_engine.kv_cache_spec import KVCacheGroupSpec, KVCacheSpec, MambaSpec
from attngroup.reference_engine.layers import LayerDescription
from attngroup.suites.engines.base import (
    AttentionGroupView,
    EngineAdapter,
    GroupingOutcome,
    format_error,
)
from attngroup.suites.engines.vllm_specs import from_vllm_group, from_vllm_spec, to_vllm_spec
from attngroup.suites.engines.vllm_standins import (
    TRITON,
    ModelWideCounts,
    attention_backend,
    make_vllm_config,
    stand_in_layer_class,
    state_backend,
)

NATIVE = "native"
INSTALL_HINT = (
    "--engine vllm needs vLLM importable (install it without its dependency list plus a few light "
    "packages, as `nox -s vllm_conformance` does; see noxfile_vllm.py)"
)
#: Builder attributes holding the query-head count, per backend family.
_BUILDER_HEAD_ATTRIBUTES = ("num_heads_q", "num_qo_heads", "num_heads")


def has_module(name: str) -> bool:
    """Whether ``name`` imports here (False when a parent package is missing)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def uses_v1_runner() -> bool:
    """The V1 ``GPUModelRunner`` where the version has it (0.22/0.24 start it
    for Gemma 4; they default a few architectures, e.g. Qwen3 and Llama with
    EAGLE, to V2), unless vLLM's own switch ``VLLM_USE_V2_MODEL_RUNNER=1``
    asks for V2; 0.34 removed V1."""
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").lower() in ("1", "true"):
        return False
    return has_module("vllm.v1.worker.gpu_model_runner")


@dataclass
class _GroupBuilders:
    """What creating one attention group's builders gave."""

    num_heads: int | None
    error: str | None


class VllmEngineAdapter(EngineAdapter):
    """vLLM's own grouping code behind the adapter seam."""

    name = "vllm"

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    @property
    def version(self) -> str:
        import vllm

        return vllm.__version__

    @property
    def runner(self) -> str:
        """Which runner's attention grouping is judged."""
        return "v1-gpu-model-runner" if uses_v1_runner() else "v2-attn-utils"

    def kv_cache_groups(
        self, specs: Mapping[str, KVCacheSpec], kv_sharing: Mapping[str, str]
    ) -> list[KVCacheGroupSpec]:
        from vllm.v1.worker.utils import add_kv_sharing_layers_to_kv_cache_groups

        _refuse_shared_layers_with_specs(specs, kv_sharing)
        vllm_config = make_vllm_config(None, {})
        vllm_specs = {name: to_vllm_spec(spec) for name, spec in pad_state_pages(specs).items()}
        groups = _vllm_kv_cache_groups(vllm_config, vllm_specs)
        add_kv_sharing_layers_to_kv_cache_groups(dict(kv_sharing), groups)
        return [from_vllm_group(group) for group in groups]

    def setup(
        self,
        layers: Sequence[LayerDescription],
        policy: str,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
    ) -> GroupingOutcome:
        if policy != NATIVE:
            raise ValueError(f"vLLM runs only its own grouping policy {NATIVE!r}, not {policy!r}")
        specs = {
            layer.name: spec
            for layer in layers
            if (spec := layer.kv_cache_spec(block_size, dtype)) is not None
        }
        vllm_specs = {name: to_vllm_spec(spec) for name, spec in pad_state_pages(specs).items()}
        forward_context = {layer.name: _stand_in(layer, vllm_specs) for layer in layers}
        vllm_config = make_vllm_config(ModelWideCounts.of_target(layers), forward_context)
        shared = {
            layer.name: layer.kv_sharing_target for layer in layers if layer.kv_sharing_target
        }
        draft_names = {layer.name for layer in layers if layer.is_draft}
        try:
            kv_cache_config = _kv_cache_config(_vllm_kv_cache_groups(vllm_config, vllm_specs))
        except Exception as error:  # start-up failed before any attention group existed
            return GroupingOutcome((), (), format_error(error))
        start_up = _start_v1_runner if uses_v1_runner() else _start_v2_runner
        try:
            attn_groups, builders = start_up(
                vllm_config, kv_cache_config, shared, draft_names, self.device
            )
        except Exception as error:
            return GroupingOutcome(_converted(kv_cache_config), (), format_error(error))
        # The runner has appended the KV-sharing layers to their targets' groups.
        kv_cache_groups = _converted(kv_cache_config)
        views = tuple(
            tuple(_view(group, builders[id(group)], forward_context) for group in per_kv)
            for per_kv in attn_groups
        )
        first_error = next(
            (view.builder_error for row in views for view in row if view.builder_error), None
        )
        return GroupingOutcome(kv_cache_groups, views, first_error)


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
    return stand_in_layer_class()(layer, backend, spec)


def _vllm_kv_cache_groups(vllm_config: Any, vllm_specs: dict[str, Any]) -> list[Any]:
    """KV-cache groups as the installed vLLM's engine core computes them."""
    if has_module("vllm.v1.core.kv_cache_planning"):
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            resolve_kv_cache_layout,
        )
        from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups

        backends = {_backend_for_spec(spec) for spec in vllm_specs.values()}
        layouts = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
        resolve_kv_cache_layout(vllm_config, [layouts], list(vllm_specs.values()))
        return get_global_kv_cache_groups(vllm_config, [vllm_specs])
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups

    return get_kv_cache_groups(vllm_config, vllm_specs)


def _is_state_spec(vllm_spec: Any) -> bool:
    return hasattr(vllm_spec, "mamba_type")


def _backend_for_spec(vllm_spec: Any) -> type:
    return state_backend(vllm_spec) if _is_state_spec(vllm_spec) else attention_backend(TRITON)


def _converted(kv_cache_config: Any) -> tuple[KVCacheGroupSpec, ...]:
    return tuple(from_vllm_group(group) for group in kv_cache_config.kv_cache_groups)


def _kv_cache_config(groups: list[Any]) -> Any:
    """A ``KVCacheConfig`` for the groups (no tensors: nothing is allocated)."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    return KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=groups)


class _V1RunnerStandIn:
    """The state ``GPUModelRunner``'s grouping methods read of ``self``."""

    def __init__(self, vllm_config: Any, shared: Mapping[str, str]) -> None:
        self.vllm_config = vllm_config
        self.cache_config = vllm_config.cache_config
        self.attn_groups: list[list[Any]] = []
        self.shared_kv_cache_layers = dict(shared)
        self.runner_only_attn_layers: set[str] = set()
        self.kv_sharing_fast_prefill_eligible_layers: set[str] = set()

    def _check_and_update_cudagraph_mode(self, *args: Any, **kwargs: Any) -> None:
        """CUDA-graph mode resolution needs a capture dispatcher and decides
        nothing about grouping; on a CPU nothing is captured."""


def _start_v1_runner(
    vllm_config: Any,
    kv_cache_config: Any,
    shared: Mapping[str, str],
    draft_names: set[str],
    device: torch.device,
) -> tuple[list[list[Any]], dict[int, _GroupBuilders]]:
    """``GPUModelRunner.initialize_kv_cache``'s grouping steps, in its order."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.utils import prepare_kernel_block_sizes

    runner = _V1RunnerStandIn(vllm_config, shared)
    GPUModelRunner.maybe_add_kv_sharing_layers_to_kv_cache_groups(runner, kv_cache_config)
    GPUModelRunner.initialize_attn_backend(runner, kv_cache_config)
    kernel_block_sizes = prepare_kernel_block_sizes(kv_cache_config, runner.attn_groups)
    # initialize_metadata_builders' loop, kept going past a failing group so
    # that every group reports its builders (the first error is start-up's).
    builders = {
        id(group): _create_builders(group, vllm_config, device, kernel_block_sizes[gid])
        for gid, per_kv in enumerate(runner.attn_groups)
        for group in per_kv
    }
    return runner.attn_groups, builders


def _create_builders(
    group: Any, vllm_config: Any, device: torch.device, kernel_block_size: int
) -> _GroupBuilders:
    try:
        group.create_metadata_builders(vllm_config, device, kernel_block_size)
    except Exception as error:
        return _GroupBuilders(None, format_error(error))
    return _builder_heads(group)


def _start_v2_runner(
    vllm_config: Any,
    kv_cache_config: Any,
    shared: Mapping[str, str],
    draft_names: set[str],
    device: torch.device,
) -> tuple[list[list[Any]], dict[int, _GroupBuilders]]:
    """The V2 runner's ``init_attn_backend`` (it adds the KV-sharing layers
    itself and creates every group's builders)."""
    from vllm.v1.worker.gpu.attn_utils import init_attn_backend

    attn_groups, _, _ = init_attn_backend(
        kv_cache_config, vllm_config, device, draft_layer_names=draft_names
    )
    builders = {id(group): _builder_heads(group) for per_kv in attn_groups for group in per_kv}
    return attn_groups, builders


def _builder_heads(group: Any) -> _GroupBuilders:
    """The query-head count the group's first builder was sized by (0 for
    state-layer builders, which have none)."""
    builder = group.get_metadata_builder()
    if _is_state_spec(group.kv_cache_spec):
        return _GroupBuilders(0, None)
    heads = next(
        (getattr(builder, name) for name in _BUILDER_HEAD_ATTRIBUTES if hasattr(builder, name)), 0
    )
    return _GroupBuilders(int(heads), None)


def _view(
    group: Any, builders: _GroupBuilders, forward_context: Mapping[str, Any]
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
    return VllmEngineAdapter(device or "cpu")
