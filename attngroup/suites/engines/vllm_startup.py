"""The installed vLLM release's grouping start-up, found by what the release contains.

``StartUp.discover`` reads the steps off the release itself, the way its own start-up
runs them, never off its version number:

- the engine core (``vllm.v1.engine.core``): whether it resolves a KV-cache layout before
  grouping (it imports ``resolve_kv_cache_layout``), and whether it groups globally
  (``get_global_kv_cache_groups``) or per worker (``kv_cache_utils.get_kv_cache_groups``,
  which its ``get_kv_cache_configs`` calls);
- the workers: the layouts they report (``WorkerBase.get_supported_kv_cache_layouts``);
- the runners: the V1 ``GPUModelRunner`` where the release has it, the V2
  ``attn_utils.init_attn_backend`` (its keywords read off its signature), and the rule
  that picks between them (``VllmConfig.use_v2_model_runner``).

An exception raised by vLLM's own code is a verdict (its text goes into the outcome);
one raised by the adapter, its stand-ins or a missing import becomes ``AdapterError``.
"""

from __future__ import annotations

import functools
import inspect
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from attngroup.suites.engines.base import AdapterError, EngineUnavailableError, format_error

V1, V2 = "v1", "v2"
RUNNER_NAMES = {V1: "V1 GPUModelRunner", V2: "V2 attn_utils"}
STAND_IN_MARK = "StandIn"  # every stand-in class name carries it (vllm_standins)
_ADAPTER_ROOT = Path(__file__).resolve().parents[2]  # the attngroup package
#: Builder attributes holding the query-head count, per backend family.
_BUILDER_HEAD_ATTRIBUTES = ("num_heads_q", "num_qo_heads", "num_heads")


class RunnerUnavailableError(EngineUnavailableError, ValueError):
    """The runner asked for is not in the installed release (e.g. V1 after its removal), or
    the release refuses the config on the runner its switch names."""


@dataclass(frozen=True)
class GroupBuilders:
    """What creating one attention group's builders gave."""

    num_heads: int | None
    error: str | None


def _owner(filename: str, vllm_root: Path | None) -> str | None:
    path = Path(filename).resolve()
    if path.is_relative_to(_ADAPTER_ROOT):
        return "adapter"
    if vllm_root is not None and path.is_relative_to(vllm_root):
        return "vllm"
    return None


def _vllm_root() -> Path | None:
    try:
        import vllm
    except ImportError:
        return None
    return Path(vllm.__file__).resolve().parent


def is_engine_error(error: BaseException) -> bool:
    """Whether vLLM's own code raised ``error`` from its own logic: the innermost frame
    of vLLM's or ours is vLLM's, it is no missing import, and it names no stand-in
    (vLLM reading something a stand-in lacks is the stand-in's fault)."""
    if isinstance(error, ImportError) or STAND_IN_MARK in str(error):
        return False
    vllm_root = _vllm_root()
    owners = [
        _owner(frame.filename, vllm_root) for frame in traceback.extract_tb(error.__traceback__)
    ]
    return next((owner for owner in reversed(owners) if owner), None) == "vllm"


def engine_error_text(error: BaseException, step: str) -> str:
    """The verdict text of vLLM's own error with the vLLM line that raised it
    (``... (vllm/x.py:12)``); raises ``AdapterError`` for any other."""
    if not is_engine_error(error):
        raise AdapterError.wrapping(error, step) from error
    vllm_root = _vllm_root()
    frames = traceback.extract_tb(error.__traceback__)
    site = next(f for f in reversed(frames) if _owner(f.filename, vllm_root) == "vllm")
    return f"{format_error(error)} ({source_site(site.filename, site.lineno)})"


def source_site(filename: str, line: int | None) -> str:
    """``vllm/v1/worker/utils.py:123`` for a file of the installed vLLM."""
    root = _vllm_root()
    path = Path(filename).resolve()
    shown = path.relative_to(root.parent) if root and path.is_relative_to(root) else path
    return f"{shown}:{line}"


def definition_site(function: Any, needle: str | None = None) -> str:
    """Where vLLM defines ``function``, or the first line of it containing ``needle``."""
    function = inspect.unwrap(function)
    lines, first = inspect.getsourcelines(function)
    offset = next((i for i, text in enumerate(lines) if needle and needle in text), 0)
    return source_site(inspect.getsourcefile(function) or "?", first + offset)


def raise_classified(error: BaseException, step: str) -> None:
    """Re-raise vLLM's own error as it is, anything else as ``AdapterError``."""
    if is_engine_error(error):
        raise error
    raise AdapterError.wrapping(error, step) from error


def is_state_spec(vllm_spec: Any) -> bool:
    return hasattr(vllm_spec, "mamba_type")


class StandInWorker:
    """What ``WorkerBase.get_supported_kv_cache_layouts`` reads of ``self``."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config


class StandInV1Runner:
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


class V1GroupingMethods(Protocol):
    """vLLM's ``GPUModelRunner`` class as start-up uses it: its grouping methods, called
    unbound on a ``StandInV1Runner`` with the ``KVCacheConfig``."""

    maybe_add_kv_sharing_layers_to_kv_cache_groups: Callable[[StandInV1Runner, Any], None]
    initialize_attn_backend: Callable[[StandInV1Runner, Any], None]


@dataclass(frozen=True)
class StartUp:
    """The grouping steps of the installed release, as callables of its own."""

    resolve_layout: Callable[..., Any] | None
    worker_layouts: Callable[[Any], list[str]] | None
    global_groups: Callable[..., list[Any]] | None
    worker_groups: Callable[..., list[Any]] | None
    add_kv_sharing_layers: Callable[[dict[str, str], list[Any]], None]
    kv_cache_config_class: type
    v1_runner: V1GroupingMethods | None
    v2_init_attn_backend: Callable[..., tuple[Any, ...]] | None
    runner_rule: Callable[[Any], bool] | None
    """Whether the release runs a config on the V2 runner, by its own rule: the
    ``VllmConfig.use_v2_model_runner`` property (0.22+), else the ``VLLM_USE_V2_MODEL_RUNNER``
    switch its GPU worker reads (0.20, 0.21; ``RunnerUnavailableError`` where the release
    refuses the config on V2); None where it has neither."""

    @classmethod
    def discover(cls) -> StartUp:
        from vllm.config import VllmConfig
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.engine import core
        from vllm.v1.kv_cache_interface import KVCacheConfig
        from vllm.v1.worker.utils import add_kv_sharing_layers_to_kv_cache_groups
        from vllm.v1.worker.worker_base import WorkerBase

        v1_runner = _optional_attribute("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
        init_attn_backend = _optional_attribute(
            "vllm.v1.worker.gpu.attn_utils", "init_attn_backend"
        )
        return cls(
            resolve_layout=getattr(core, "resolve_kv_cache_layout", None),
            worker_layouts=getattr(WorkerBase, "get_supported_kv_cache_layouts", None),
            global_groups=getattr(core, "get_global_kv_cache_groups", None),
            worker_groups=getattr(kv_cache_utils, "get_kv_cache_groups", None),
            add_kv_sharing_layers=add_kv_sharing_layers_to_kv_cache_groups,
            kv_cache_config_class=KVCacheConfig,
            v1_runner=v1_runner,
            v2_init_attn_backend=init_attn_backend,
            runner_rule=_runner_rule(VllmConfig),
        )

    @property
    def runners(self) -> tuple[str, ...]:
        return tuple(
            name
            for name, present in ((V1, self.v1_runner), (V2, self.v2_init_attn_backend))
            if present is not None
        )

    def choose_runner(self, requested: str, vllm_config: Any) -> str:
        """``requested`` if the release has it; for ``auto`` the runner vLLM's own rule
        picks for this config (the only one, where a release has one)."""
        if requested != "auto":
            if requested not in self.runners:
                raise RunnerUnavailableError(
                    f"this vLLM has no {RUNNER_NAMES[requested]} (it has "
                    f"{', '.join(RUNNER_NAMES[r] for r in self.runners)})"
                )
            return requested
        if len(self.runners) == 1:
            return self.runners[0]
        if self.runner_rule is None:
            raise AdapterError(
                "this vLLM has both runners but neither VllmConfig.use_v2_model_runner nor a "
                "VLLM_USE_V2_MODEL_RUNNER switch"
            )
        try:
            return V2 if self.runner_rule(vllm_config) else V1
        except RunnerUnavailableError:
            raise
        except Exception as error:
            raise AdapterError.wrapping(error, "asking vLLM's runner rule") from error

    def decision_sites(self, runner: str) -> dict[str, str]:
        """Per check, the vLLM code that decides what it judges (cited by a *fail* that
        no exception explains): the runner's grouping function, the builders' head
        count, the KV-sharing step."""
        from attngroup.suites.engines.vllm_standins import TRITON, attention_backend

        if runner == V1:
            assert self.v1_runner is not None, "choose_runner picks only a runner vLLM has"
            site = definition_site(self.v1_runner.initialize_attn_backend)
        else:
            site = definition_site(self.v2_init_attn_backend)
        builder = attention_backend(TRITON).get_builder_cls()
        return {
            "partition": site,
            "homogeneity": site,
            "minimality": site,
            "builder heads": definition_site(builder.__init__, "num_heads_q ="),
            "kv sharing": definition_site(self.add_kv_sharing_layers),
        }

    def kv_cache_groups(self, vllm_config: Any, vllm_specs: dict[str, Any]) -> list[Any]:
        """The KV-cache groups, as the engine core computes them, in its order. A layer
        set without any spec has nothing to lay out (vLLM's workers would pick a default
        backend from the model's head size, which a stand-in without layers lacks)."""
        if self.resolve_layout is not None and vllm_specs:
            if self.worker_layouts is None:
                raise AdapterError("the engine core resolves a layout but workers report none")
            layouts = self.worker_layouts(StandInWorker(vllm_config))
            self.resolve_layout(vllm_config, [layouts], list(vllm_specs.values()))
        if self.global_groups is not None:
            return self.global_groups(vllm_config, [vllm_specs])
        if self.worker_groups is None:
            raise AdapterError("this vLLM's engine core groups neither globally nor per worker")
        return self.worker_groups(vllm_config, vllm_specs)

    def kv_cache_config(self, groups: list[Any], vllm_config: Any) -> Any:
        """A ``KVCacheConfig`` for the groups (no tensors: nothing is allocated), with the
        resolved layout where the release's config carries one (as the core sets it)."""
        config = self.kv_cache_config_class(
            num_blocks=1, kv_cache_tensors=[], kv_cache_groups=groups
        )
        if hasattr(config, "kv_cache_layout"):
            config.kv_cache_layout = vllm_config.cache_config.kv_cache_layout
        return config

    def start_runner(
        self,
        runner: str,
        vllm_config: Any,
        kv_cache_config: Any,
        draft_names: set[str] | None,
        device: torch.device,
    ) -> tuple[list[list[Any]], dict[int, GroupBuilders]]:
        if runner == V1:
            return self._start_v1(vllm_config, kv_cache_config, device)
        return self._start_v2(vllm_config, kv_cache_config, draft_names, device)

    def _start_v1(
        self, vllm_config: Any, kv_cache_config: Any, device: torch.device
    ) -> tuple[list[list[Any]], dict[int, GroupBuilders]]:
        """``GPUModelRunner.initialize_kv_cache``'s grouping steps, in its order."""
        from vllm.v1.worker.utils import prepare_kernel_block_sizes

        assert self.v1_runner is not None
        shared = {
            name: layer.kv_sharing_target_layer_name
            for name, layer in vllm_config.compilation_config.static_forward_context.items()
            if getattr(layer, "kv_sharing_target_layer_name", None)
        }
        runner = StandInV1Runner(vllm_config, shared)
        self.v1_runner.maybe_add_kv_sharing_layers_to_kv_cache_groups(runner, kv_cache_config)
        self.v1_runner.initialize_attn_backend(runner, kv_cache_config)
        kernel_block_sizes = prepare_kernel_block_sizes(kv_cache_config, runner.attn_groups)
        # initialize_metadata_builders' loop, kept going past a failing group so
        # that every group reports its builders (the first error is start-up's).
        builders = {
            id(group): _create_builders(group, vllm_config, device, kernel_block_sizes[gid])
            for gid, per_kv in enumerate(runner.attn_groups)
            for group in per_kv
        }
        return runner.attn_groups, builders

    def _start_v2(
        self,
        vllm_config: Any,
        kv_cache_config: Any,
        draft_names: set[str] | None,
        device: torch.device,
    ) -> tuple[list[list[Any]], dict[int, GroupBuilders]]:
        """The V2 runner's ``init_attn_backend`` (it adds the KV-sharing layers itself and
        creates every group's builders). The runner passes its draft model's layer names
        where the function takes them; the groups are the first list it returns."""
        assert self.v2_init_attn_backend is not None
        keywords = {}
        if "draft_layer_names" in inspect.signature(self.v2_init_attn_backend).parameters:
            keywords["draft_layer_names"] = draft_names
        result = self.v2_init_attn_backend(kv_cache_config, vllm_config, device, **keywords)
        try:
            attn_groups = next(item for item in result if isinstance(item, list))
        except StopIteration:
            raise AdapterError(
                f"init_attn_backend returned no list of groups: {[type(r).__name__ for r in result]}"
            ) from None
        builders = {id(group): _builder_heads(group) for per_kv in attn_groups for group in per_kv}
        return attn_groups, builders


def _runner_rule(vllm_config_class: type) -> Callable[[Any], bool] | None:
    """The release's rule for the V2 runner (see ``StartUp.runner_rule``)."""
    rule = inspect.getattr_static(vllm_config_class, "use_v2_model_runner", None)
    if isinstance(rule, property) and rule.fget is not None:
        return rule.fget
    switches = _optional_attribute("vllm.envs", "environment_variables") or {}
    if "VLLM_USE_V2_MODEL_RUNNER" in switches:
        return functools.partial(_v2_switched_on, switches["VLLM_USE_V2_MODEL_RUNNER"])
    return None


def _v2_switched_on(switch: Callable[[], object], vllm_config: Any) -> bool:
    """The ``VLLM_USE_V2_MODEL_RUNNER`` rule (0.20, 0.21): V2 when the switch is on, where
    ``VllmConfig``'s own check of what V2 does not yet support (hybrid models, methods other
    than EAGLE and MTP) passes; a config it refuses never starts, so no runner judges it."""
    if not switch():
        return False
    validate = getattr(vllm_config, "_validate_v2_model_runner", None)
    if validate is not None:
        try:
            validate()
        except ValueError as error:
            raise RunnerUnavailableError(
                f"VLLM_USE_V2_MODEL_RUNNER=1 and vLLM refuses this config at start-up: {error}"
            ) from error
    return True


def _optional_attribute(module_name: str, name: str) -> Any:
    """A release's ``module.name``, None where the release has no such module."""
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            return None  # the release has no such module; a missing dependency still raises
        raise
    return getattr(module, name, None)


def _create_builders(
    group: Any, vllm_config: Any, device: torch.device, kernel_block_size: int
) -> GroupBuilders:
    try:
        group.create_metadata_builders(vllm_config, device, kernel_block_size)
    except Exception as error:
        return GroupBuilders(None, engine_error_text(error, "creating metadata builders"))
    return _builder_heads(group)


def _builder_heads(group: Any) -> GroupBuilders:
    """The query-head count the group's first builder was sized by (0 for
    state-layer builders, which have none)."""
    builder = group.get_metadata_builder()
    if is_state_spec(group.kv_cache_spec):
        return GroupBuilders(0, None)
    heads = next(
        (getattr(builder, name) for name in _BUILDER_HEAD_ATTRIBUTES if hasattr(builder, name)), 0
    )
    return GroupBuilders(int(heads), None)
