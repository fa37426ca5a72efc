"""Model pairs (target + speculative draft) built from real transformers configs.

Each pair is a tiny model (hidden <= 256, vocab <= 1024, few layers) that keeps
the real head structure of the model it stands for: query and KV heads, head
size per layer type, the sliding-window pattern, KV sharing and the draft's
layers. Grouping only ever sees per-rank ``LayerDescription``s derived from the
configs here, so a pair is exactly as hard to group as the real model.

Sliding windows are scaled down with the model (32 tokens instead of 512) so
that short CPU runs cross the window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attngroup.kernels.registry import check_attention_backend
from attngroup.reference_engine.families.dense import LLAMA, QWEN3
from attngroup.reference_engine.families.family import SpecMethod
from attngroup.reference_engine.families.gemma4 import GEMMA4
from attngroup.reference_engine.families.qwen3_next import QWEN3_NEXT
from attngroup.reference_engine.layers import LayerDescription, Role

if TYPE_CHECKING:  # transformers (and torch under it) load when a config is first made
    from transformers import (
        Gemma4AssistantConfig,
        Gemma4TextConfig,
        LlamaConfig,
        PretrainedConfig,
        Qwen3Config,
        Qwen3NextConfig,
    )

TINY_VOCAB = 512
TINY_WINDOW = 32
CANDIDATE_TP_SIZES = (1, 2, 4, 8)


class UnknownModelPairError(KeyError):
    def __str__(self) -> str:
        return f"unknown model pair {self.args[0]!r}; known pairs: {', '.join(MODEL_PAIRS)}"


@dataclass(frozen=True)
class ModelPair:
    """A target model and its speculative-decoding draft.

    ``target_config`` and ``draft_config`` are factories: transformers configs
    are mutable, so every caller gets its own. ``describe_layers`` turns the
    configs into per-rank layer descriptions (its family's, ``attngroup.reference_engine.families``).
    """

    name: str
    description: str
    family: str
    spec_method: SpecMethod
    target_config: Callable[[], PretrainedConfig] = field(repr=False)
    draft_config: Callable[[], PretrainedConfig] = field(repr=False)
    describe_layers: Callable[
        [PretrainedConfig, PretrainedConfig, int, str], list[LayerDescription]
    ] = field(repr=False)
    default_backend: str = "triton"
    #: (model, field, real value, tiny value) for a pair scaled down from real configs
    scaling: tuple[tuple[str, str, object, object], ...] = field(default=(), repr=False)

    def layers(self, tp: int = 1, backend: str | None = None) -> list[LayerDescription]:
        """Target layers then draft layers, on one rank of ``tp``; ``backend`` serves the
        attention layers, so a state backend or an unknown name raises."""
        return self.describe_layers(
            self.target_config(),
            self.draft_config(),
            tp,
            check_attention_backend(backend or self.default_backend),
        )

    @property
    def supported_tp_sizes(self) -> tuple[int, ...]:
        """TP sizes over which every layer's heads divide (the rest raise)."""
        supported = []
        for tp in CANDIDATE_TP_SIZES:
            try:
                self.layers(tp)
            except ValueError:
                continue
            supported.append(tp)
        return tuple(supported)

    @property
    def is_mixed(self) -> bool:
        """True when attention layers of the pair differ in query-head count
        (the case the LEGACY grouping gets wrong)."""
        return len({layer.num_heads_q for layer in self.layers() if layer.is_attention}) > 1

    @property
    def is_mtp(self) -> bool:
        return self.spec_method is SpecMethod.MTP

    def layer_roles(self, tp: int = 1) -> dict[str, list[str]]:
        """Layer names by role: target, draft, and KV-shared (reads another layer's cache)."""
        layers = self.layers(tp)
        return {
            "target": [layer.name for layer in layers if layer.role is Role.TARGET],
            "draft": [layer.name for layer in layers if layer.role is Role.DRAFT],
            "kv_shared": [layer.name for layer in layers if layer.kv_sharing_target],
        }


# --- the registry -------------------------------------------------------------------------------


def _gemma4_target(
    num_kv_heads: int, num_layers: int, num_shared: int
) -> Callable[[], Gemma4TextConfig]:
    def make() -> Gemma4TextConfig:
        from transformers import Gemma4TextConfig

        pattern = ["sliding_attention"] * 4 + ["full_attention"]
        return Gemma4TextConfig(
            vocab_size=TINY_VOCAB,
            vocab_size_per_layer_input=TINY_VOCAB,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=num_layers,
            num_attention_heads=8,
            num_key_value_heads=num_kv_heads,
            head_dim=256,
            global_head_dim=512,
            sliding_window=TINY_WINDOW,
            hidden_size_per_layer_input=16,  # 0 breaks KV sharing in transformers' forward
            num_kv_shared_layers=num_shared,
            layer_types=(pattern * num_layers)[:num_layers],
        )

    return make


def _gemma4_assistant(num_kv_heads: int) -> Callable[[], Gemma4AssistantConfig]:
    def make() -> Gemma4AssistantConfig:
        from transformers import Gemma4AssistantConfig

        return Gemma4AssistantConfig(
            text_config=dict(
                vocab_size=TINY_VOCAB,
                hidden_size=128,
                intermediate_size=256,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=num_kv_heads,
                head_dim=256,
                global_head_dim=512,
                sliding_window=TINY_WINDOW,
                layer_types=["sliding_attention"] * 3 + ["full_attention"],
                hidden_size_per_layer_input=0,
                vocab_size_per_layer_input=0,
            ),
            backbone_hidden_size=256,
        )

    return make


def _llama(num_layers: int) -> Callable[[], LlamaConfig]:
    def make() -> LlamaConfig:
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=TINY_VOCAB,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=num_layers,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
        )

    return make


def _qwen3(num_heads_q: int, num_layers: int) -> Callable[[], Qwen3Config]:
    def make() -> Qwen3Config:
        from transformers import Qwen3Config

        return Qwen3Config(
            vocab_size=TINY_VOCAB,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads_q,
            num_key_value_heads=8,
            head_dim=128,
        )

    return make


def _qwen3_next(layer_types: list[str]) -> Callable[[], Qwen3NextConfig]:
    def make() -> Qwen3NextConfig:
        from transformers import Qwen3NextConfig

        return Qwen3NextConfig(
            vocab_size=TINY_VOCAB,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=len(layer_types),
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=256,
            linear_num_key_heads=4,
            linear_num_value_heads=8,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            layer_types=layer_types,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
        )

    return make


_PAIRS = (
    ModelPair(
        name="gemma4-e2b-mtp",
        description="Gemma 4 E2B + its MTP assistant: target 8 q / 1 kv heads (head 256 sliding, 512 full), "
        "assistant 4 q heads on Q-only layers reading the target's KV pages",
        family=GEMMA4.name,
        spec_method=SpecMethod.MTP,
        target_config=_gemma4_target(num_kv_heads=1, num_layers=15, num_shared=5),
        draft_config=_gemma4_assistant(num_kv_heads=1),
        describe_layers=GEMMA4.describe_layers,
    ),
    ModelPair(
        name="gemma4-e4b-mtp",
        description="Gemma 4 E4B + its MTP assistant: target 8 q / 2 kv heads, assistant 4 q / 2 kv",
        family=GEMMA4.name,
        spec_method=SpecMethod.MTP,
        target_config=_gemma4_target(num_kv_heads=2, num_layers=10, num_shared=4),
        draft_config=_gemma4_assistant(num_kv_heads=2),
        describe_layers=GEMMA4.describe_layers,
    ),
    ModelPair(
        name="llama3-eagle",
        description="Llama 3 (32 q / 8 kv / head 128) + one EAGLE layer with its own KV of the same spec "
        "(uniform control)",
        family=LLAMA.name,
        spec_method=SpecMethod.EAGLE,
        target_config=_llama(num_layers=4),
        draft_config=_llama(num_layers=1),
        describe_layers=LLAMA.describe_layers,
        default_backend="flashinfer",
    ),
    ModelPair(
        name="qwen3-8b-draft-1.7b",
        description="Qwen3-8B-like target (32 q / 8 kv / head 128) drafted by a Qwen3-1.7B-like model "
        "(16 q / 8 kv / head 128): same KV spec, fewer query heads, own KV layers",
        family=QWEN3.name,
        spec_method=SpecMethod.DRAFT_MODEL,
        target_config=_qwen3(num_heads_q=32, num_layers=4),
        draft_config=_qwen3(num_heads_q=16, num_layers=2),
        describe_layers=QWEN3.describe_layers,
        default_backend="flashinfer",
    ),
    ModelPair(
        name="qwen3-next-mtp",
        description="Qwen3-Next-like hybrid: gated linear-attention (Mamba-like) layers 3 : 1 full attention "
        "(16 q / 2 kv / head 256), plus an MTP layer of full attention",
        family=QWEN3_NEXT.name,
        spec_method=SpecMethod.MTP,
        target_config=_qwen3_next((["linear_attention"] * 3 + ["full_attention"]) * 2),
        draft_config=_qwen3_next(["full_attention"]),
        describe_layers=QWEN3_NEXT.describe_layers,
    ),
    ModelPair(
        name="qwen3-mtp",
        description="Qwen3-0.6B-like target (16 q / 8 kv / head 128) with an MTP layer equal to its own layers "
        "(DeepSeek / MiMo style, non-MLA): uniform",
        family=QWEN3.name,
        spec_method=SpecMethod.MTP,
        target_config=_qwen3(num_heads_q=16, num_layers=4),
        draft_config=_qwen3(num_heads_q=16, num_layers=1),
        describe_layers=QWEN3.describe_layers,
    ),
)

MODEL_PAIRS: dict[str, ModelPair] = {pair.name: pair for pair in _PAIRS}
BUILTIN_PAIR_NAMES = tuple(MODEL_PAIRS)


def register_pairs(pairs: list[ModelPair]) -> None:
    """Add user pairs (a pairs file) beside the registered ones; names must be new."""
    for pair in pairs:
        if pair.name in MODEL_PAIRS and MODEL_PAIRS[pair.name] is not pair:
            raise ValueError(f"model pair {pair.name!r} is already defined")
        MODEL_PAIRS[pair.name] = pair


def get_model_pair(name: str) -> ModelPair:
    try:
        return MODEL_PAIRS[name]
    except KeyError:
        raise UnknownModelPairError(name) from None
