"""A small stand-in vLLM package, written to disk with one release's shapes.

The adapter's seams are tested against it without vLLM: each ``ReleaseShape`` reproduces
what a real release range looks like where the adapter once went wrong (the engine core's
steps, the runners it has, ``init_attn_backend``'s signature and return, the class it
looks KV-sharing layers up by, the runner rule). The package is a real folder, so
tracebacks name its files as they name vLLM's, and the adapter tells its own errors from
"vLLM's" exactly as with the real package.
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ReleaseShape:
    """What differs between the release ranges the adapter must follow."""

    name: str
    resolves_layout: bool  # engine core resolves a KV-cache layout before grouping (0.29+)
    global_groups: bool  # engine core groups globally (kv_cache_planning, 0.33+)
    has_v1: bool  # the V1 GPUModelRunner exists (gone in 0.34)
    draft_keyword: bool  # init_attn_backend takes draft_layer_names (0.33+)
    returns_backends_first: bool  # init_attn_backend returns 4 items, backends first (0.22)
    runner_rule: str  # "env" (0.21: the VLLM_USE_V2_MODEL_RUNNER switch, off by default),
    # "architecture" (0.22: V2 for Qwen3 only), "default-v2", "none"


RELEASE_SHAPES = (
    ReleaseShape("0.21", False, False, True, False, True, "env"),
    ReleaseShape("0.22", False, False, True, False, True, "architecture"),
    ReleaseShape("0.29", True, False, True, False, False, "default-v2"),
    ReleaseShape("0.33", True, True, True, True, False, "default-v2"),
    ReleaseShape("0.34", True, True, False, True, False, "none"),
)

_FILES = {
    "__init__.py": """
        import json, pathlib
        SHAPE = json.loads((pathlib.Path(__file__).parent / "shape.json").read_text())
        __version__ = SHAPE["name"] + ".0"
        CALLS = []  # the steps vLLM ran, in order
    """,
    "config/__init__.py": """
        from dataclasses import dataclass, field
        from vllm import SHAPE

        @dataclass
        class ModelConfig:
            architectures: list = field(default_factory=list)
            enable_return_routed_experts: bool = False

        @dataclass
        class SpeculativeConfig:
            method: str = None
            parallel_drafting: bool = False

            def use_eagle(self):
                return self.method in ("eagle", "mtp")

        @dataclass
        class CompilationConfig:
            static_forward_context: dict = field(default_factory=dict)
            cudagraph_mode: object = None

        @dataclass
        class CacheConfig:
            kv_cache_layout: str = None

        @dataclass
        class ParallelConfig:
            tensor_parallel_size: int = 1

        @dataclass
        class SchedulerConfig:
            max_model_len: int = 0
            is_encoder_decoder: bool = False
            max_num_seqs: int = 1

        @dataclass
        class AttentionConfig:
            backend: str = None

        @dataclass
        class VllmConfig:
            watermark_config: object = None  # read from the field default by the view

            if SHAPE["runner_rule"] == "env":

                def _validate_v2_model_runner(self):  # run by __post_init__ when switched on
                    spec = self.speculative_config
                    if spec is not None and spec.method not in ("eagle", "eagle3", "mtp"):
                        raise ValueError(
                            "VLLM_USE_V2_MODEL_RUNNER does not yet support: "
                            f"speculative method '{spec.method}'"
                        )

            if SHAPE["runner_rule"] not in ("none", "env"):

                @property
                def use_v2_model_runner(self):
                    if self.watermark_config is not None:
                        return True
                    if SHAPE["runner_rule"] == "architecture":
                        return "Qwen3ForCausalLM" in self.model_config.architectures
                    spec = self.speculative_config
                    return spec is None or not spec.parallel_drafting
    """,
    "envs.py": """
        import os
        from vllm import SHAPE

        environment_variables = {}
        if SHAPE["runner_rule"] == "env":
            environment_variables["VLLM_USE_V2_MODEL_RUNNER"] = lambda: bool(
                int(os.getenv("VLLM_USE_V2_MODEL_RUNNER", "0"))
            )
    """,
    "config/compilation.py": """
        import enum

        class CUDAGraphMode(enum.Enum):
            NONE = 0
    """,
    "model_executor/__init__.py": "",
    "model_executor/layers/__init__.py": "",
    "model_executor/layers/attention_layer_base.py": """
        class AttentionLayerBase:
            pass
    """,
    "model_executor/layers/attention/__init__.py": """
        from torch import nn
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

        class Attention(nn.Module, AttentionLayerBase):
            def __init__(self):
                raise RuntimeError("a real Attention needs a real model")
    """,
    "v1/__init__.py": "",
    "v1/kv_cache_interface.py": """
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class FullAttentionSpec:
            block_size: int
            num_kv_heads: int
            head_size: int
            dtype: object
            sliding_window: int = None

        @dataclass(frozen=True)
        class SlidingWindowSpec(FullAttentionSpec):
            pass

        @dataclass
        class KVCacheGroupSpec:
            layer_names: list
            kv_cache_spec: object

        @dataclass
        class KVCacheConfig:
            num_blocks: int
            kv_cache_tensors: list
            kv_cache_groups: list
            kv_cache_layout: str = None
    """,
    "v1/attention/__init__.py": "",
    "v1/attention/backends/__init__.py": "",
    "v1/attention/backends/registry.py": """
        import enum

        class TritonAttentionMetadataBuilder:
            def __init__(self, num_heads):
                self.num_heads_q = num_heads

        class TritonAttentionBackend:
            @classmethod
            def full_cls_name(cls):
                return (cls.__module__, cls.__qualname__)

            @staticmethod
            def get_builder_cls():
                return TritonAttentionMetadataBuilder

        class AttentionBackendEnum(enum.Enum):
            TRITON_ATTN = "triton"

            def get_class(self):
                return TritonAttentionBackend
    """,
    "v1/attention/selector.py": """
        class Mamba2AttentionBackend:
            pass

        def get_mamba_attn_backend(mamba_type):  # 0.20: specs name their backend
            return {"mamba2": Mamba2AttentionBackend}[mamba_type]
    """,
    "v1/attention/backends/utils.py": """
        from vllm import CALLS

        def resolve_kv_cache_layout(vllm_config, supported_layouts, kv_cache_specs=None):
            CALLS.append("resolve_kv_cache_layout")
            vllm_config.cache_config.kv_cache_layout = supported_layouts[0][0]
            return vllm_config.cache_config.kv_cache_layout
    """,
    "v1/core/__init__.py": "",
    "v1/core/kv_cache_utils.py": """
        from vllm import CALLS, SHAPE
        from vllm.v1.kv_cache_interface import KVCacheGroupSpec

        def check_layout(vllm_config):
            if SHAPE["resolves_layout"] and vllm_config.cache_config.kv_cache_layout is None:
                raise ValueError("KV cache layout has not been resolved yet")

        def group_specs(specs):
            groups = {}
            for name, spec in specs.items():
                groups.setdefault(spec, []).append(name)
            return [KVCacheGroupSpec(names, spec) for spec, names in groups.items()]

        if not SHAPE["global_groups"]:

            def get_kv_cache_groups(vllm_config, kv_cache_spec):
                CALLS.append("get_kv_cache_groups")
                check_layout(vllm_config)
                return group_specs(kv_cache_spec)
    """,
    "v1/core/kv_cache_planning.py": """
        from vllm import CALLS
        from vllm.v1.core.kv_cache_utils import check_layout, group_specs

        def get_global_kv_cache_groups(vllm_config, kv_cache_specs):
            CALLS.append("get_global_kv_cache_groups")
            check_layout(vllm_config)
            return group_specs(kv_cache_specs[0])
    """,
    "v1/engine/__init__.py": "",
    "v1/engine/core.py": """
        from vllm import SHAPE

        if SHAPE["resolves_layout"]:
            from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
        if SHAPE["global_groups"]:
            from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups
    """,
    "v1/worker/__init__.py": "",
    "v1/worker/worker_base.py": """
        from vllm import CALLS

        class WorkerBase:
            def get_supported_kv_cache_layouts(self):
                CALLS.append("get_supported_kv_cache_layouts")
                assert self.vllm_config.compilation_config.static_forward_context
                return ["NHD", "HND"]
    """,
    "v1/worker/utils.py": """
        from vllm import CALLS
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

        KEY_ON_HEADS = True  # False: group as before the num_heads_q key (0.22)

        class AttentionGroup:
            def __init__(self, backend, layers, spec, group_id):
                self.backend, self.layers = backend, layers
                self.layer_names = [layer.layer_name for layer in layers]
                self.kv_cache_spec, self.kv_cache_group_id = spec, group_id

            def create_metadata_builders(self, vllm_config, device, kernel_block_size=None):
                heads = {layer.impl.num_heads for layer in self.layers}
                assert len(heads) == 1, f"All layers in one attention group must share num_heads; got {heads}"
                self.builder = self.backend.get_builder_cls()(heads.pop())

            def get_metadata_builder(self):
                return self.builder

        def layers_of(vllm_config, layer_type, names=None):
            context = vllm_config.compilation_config.static_forward_context
            names = context if names is None else names
            return {n: context[n] for n in names if isinstance(context.get(n), layer_type)}

        def add_kv_sharing_layers_to_kv_cache_groups(shared, groups):
            CALLS.append("add_kv_sharing_layers")
            for layer, target in shared.items():
                next(g for g in groups if target in g.layer_names).layer_names.append(layer)

        def attention_groups(vllm_config, kv_cache_config):
            rows = []
            for gid, group in enumerate(kv_cache_config.kv_cache_groups):
                by_key = {}
                for layer in layers_of(vllm_config, AttentionLayerBase, group.layer_names).values():
                    key = (layer.get_attn_backend(), layer.num_heads if KEY_ON_HEADS else 0)
                    by_key.setdefault(key, []).append(layer)
                rows.append([
                    AttentionGroup(key[0], members, group.kv_cache_spec, gid)
                    for key, members in by_key.items()
                ])
            return rows

        def prepare_kernel_block_sizes(kv_cache_config, attn_groups):
            return [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
    """,
    "v1/worker/gpu_model_runner.py": """
        from vllm import CALLS
        from vllm.v1.worker.utils import add_kv_sharing_layers_to_kv_cache_groups, attention_groups

        class GPUModelRunner:
            def maybe_add_kv_sharing_layers_to_kv_cache_groups(self, kv_cache_config):
                add_kv_sharing_layers_to_kv_cache_groups(
                    self.shared_kv_cache_layers, kv_cache_config.kv_cache_groups
                )

            def initialize_attn_backend(self, kv_cache_config, is_profiling=False):
                CALLS.append("v1 initialize_attn_backend")
                self.attn_groups = attention_groups(self.vllm_config, kv_cache_config)
    """,
    "v1/worker/gpu/__init__.py": "",
    "v1/worker/gpu/attn_utils.py": """
        from vllm import CALLS, SHAPE
        from vllm.model_executor.layers.attention import Attention
        from vllm.v1.worker.utils import (
            add_kv_sharing_layers_to_kv_cache_groups, attention_groups, layers_of,
        )

        def get_shared_kv_cache_layers(vllm_config):
            # Looked up by the concrete class: a stand-in that is only an
            # AttentionLayerBase is not found, and its layers vanish.
            return {
                name: layer.kv_sharing_target_layer_name
                for name, layer in layers_of(vllm_config, Attention).items()
                if layer.kv_sharing_target_layer_name
            }

        def _init(kv_cache_config, vllm_config, device):
            CALLS.append("v2 init_attn_backend")
            add_kv_sharing_layers_to_kv_cache_groups(
                get_shared_kv_cache_layers(vllm_config), kv_cache_config.kv_cache_groups
            )
            rows = attention_groups(vllm_config, kv_cache_config)
            for row in rows:
                for group in row:
                    group.create_metadata_builders(vllm_config, device)
            return rows

        if SHAPE["draft_keyword"]:

            def init_attn_backend(
                kv_cache_config, vllm_config, device, active_layer_names=None,
                draft_layer_names=None,
            ):
                CALLS.append(f"draft_layer_names={sorted(draft_layer_names or ())}")
                return _init(kv_cache_config, vllm_config, device), None, []

        elif SHAPE["returns_backends_first"]:

            def init_attn_backend(kv_cache_config, vllm_config, device, active_layer_names=None):
                return {}, _init(kv_cache_config, vllm_config, device), None, []

        else:

            def init_attn_backend(kv_cache_config, vllm_config, device, active_layer_names=None):
                return _init(kv_cache_config, vllm_config, device), None, []
    """,
}


def write_fake_vllm(root: Path, shape: ReleaseShape) -> Path:
    """The package ``vllm`` under ``root`` (put ``root`` on ``sys.path``)."""
    package = root / "vllm"
    for relative, text in _FILES.items():
        if relative == "v1/worker/gpu_model_runner.py" and not shape.has_v1:
            continue  # the release removed it
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    for folder in [p for p in package.rglob("*") if p.is_dir()]:
        (folder / "__init__.py").touch()
    (package / "shape.json").write_text(json.dumps(asdict(shape)))
    return package


def forget_vllm() -> None:
    """Drop every imported ``vllm`` module (the next import reads the new package)."""
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
