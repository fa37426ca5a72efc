"""The reference engine behind the adapter seam."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

import pytest

from attngroup.reference_engine.attention_groups import GroupingPolicy
from attngroup.reference_engine.grouping_plan import plan_grouping
from attngroup.reference_engine.kv_cache_groups import get_kv_cache_groups
from attngroup.reference_engine.kv_cache_spec import KVCacheGroupSpec, KVCacheSpec
from attngroup.suites.engines.base import (
    AttentionGroupView,
    EngineAdapter,
    GroupingOutcome,
    StartupRequest,
)


class ReferenceEngineAdapter(EngineAdapter):
    name = "reference"

    @property
    def version(self) -> str:
        try:
            return version("attention-grouping-conformance")
        except PackageNotFoundError:
            return "source"

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(policy.value for policy in GroupingPolicy)

    def expects_conformance(self, policy: str, pair_is_mixed: bool) -> bool:
        return not (GroupingPolicy(policy) is GroupingPolicy.LEGACY and pair_is_mixed)

    def kv_cache_groups(
        self, specs: Mapping[str, KVCacheSpec], kv_sharing: Mapping[str, str]
    ) -> list[KVCacheGroupSpec]:
        return get_kv_cache_groups(specs, kv_sharing)

    def start_up(self, request: StartupRequest) -> GroupingOutcome:
        plan = plan_grouping(request.layers, request.policy, request.block_size, request.dtype)
        views = tuple(
            tuple(
                AttentionGroupView(
                    backend=entry.group.backend.full_cls_name(),
                    layer_names=tuple(entry.group.layer_names),
                    kv_cache_spec=entry.group.kv_cache_spec,
                    kv_cache_group_id=entry.group.kv_cache_group_id,
                    num_heads_q=entry.group.num_heads_q,
                    builder_num_heads=entry.builder_num_heads,
                    builder_error=entry.builder_error_text,
                )
                for entry in row
            )
            for row in plan.attention_groups
        )
        return GroupingOutcome(plan.kv_cache_groups, views, plan.error)


def make_adapter(config: pytest.Config | None) -> EngineAdapter:
    return ReferenceEngineAdapter()
