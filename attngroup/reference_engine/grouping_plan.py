"""The grouping an engine start-up decides for a set of layers, with the
error its strict check raises (rather than raising it), so that tools can
show the collision next to the groups that caused it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attngroup.reference_engine.attention_groups import (
    AttentionGroup,
    GroupingPolicy,
    get_num_attention_heads_from_layers,
    group_attention_layers,
)
from attngroup.reference_engine.kv_cache_groups import get_kv_cache_groups
from attngroup.reference_engine.kv_cache_spec import KVCacheGroupSpec
from attngroup.reference_engine.kv_sharing import kv_cache_owners_of, with_kv_cache_owners
from attngroup.reference_engine.layers import LayerDescription


@dataclass(frozen=True)
class GroupPlanEntry:
    group: AttentionGroup
    builder_num_heads: int | None  # what the group's builders are sized by; None when refused
    builder_error: AssertionError | None  # the strict check's error

    @property
    def builder_error_text(self) -> str | None:
        """The error as a traceback's last line reads."""
        return None if self.builder_error is None else f"AssertionError: {self.builder_error}"


@dataclass(frozen=True)
class GroupingPlan:
    # The layers as planned: every KV-sharing layer carries its cache owner (``kv_cache_owner``).
    layers: tuple[LayerDescription, ...]
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    attention_groups: tuple[tuple[GroupPlanEntry, ...], ...]

    @property
    def first_error(self) -> GroupPlanEntry | None:
        """The entry whose error start-up would raise first, None when it would succeed."""
        return next((e for row in self.attention_groups for e in row if e.builder_error), None)

    @property
    def error(self) -> str | None:
        return self.first_error.builder_error_text if self.first_error else None

    def raise_on_error(self) -> None:
        """Fail as an engine start-up does when a group mixes head counts."""
        first = self.first_error
        if first is not None and first.builder_error is not None:
            raise first.builder_error


def plan_grouping(
    layers: Sequence[LayerDescription],
    policy: GroupingPolicy | str = GroupingPolicy.SPLIT_BY_Q_HEADS,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
) -> GroupingPlan:
    """Specs, KV-cache groups and attention groups for ``layers``, and for
    each attention group the head count its builders' strict check yields.

    KV-sharing chains are resolved here, once: the plan's layers carry each
    sharing layer's owner, which the groupings and the runner read."""
    layers = with_kv_cache_owners(layers)
    specs = {
        layer.name: spec
        for layer in layers
        if (spec := layer.kv_cache_spec(block_size, dtype)) is not None
    }
    kv_groups = get_kv_cache_groups(specs, kv_cache_owners_of(layers))
    by_name = {layer.name: layer for layer in layers}
    rows = tuple(
        tuple(_plan_entry(group, by_name) for group in per_kv)
        for per_kv in group_attention_layers(kv_groups, by_name, GroupingPolicy(policy))
    )
    return GroupingPlan(tuple(layers), tuple(kv_groups), rows)


def _plan_entry(group: AttentionGroup, by_name: dict[str, LayerDescription]) -> GroupPlanEntry:
    attention = [
        by_name[n].attention_params() for n in group.layer_names if by_name[n].is_attention
    ]
    if not attention:
        return GroupPlanEntry(group, 0, None)  # state layers have no query heads
    try:
        return GroupPlanEntry(group, get_num_attention_heads_from_layers(attention), None)
    except AssertionError as error:
        return GroupPlanEntry(group, None, error)
