"""``python -m attngroup.reference_engine inspect PAIR``: show how a pair is grouped.

Prints the KV-cache groups with their attention groups (layers, spec, query
heads, backend). Under LEGACY grouping of a mixed pair it marks the group
that mixes head counts and prints the exact error an engine hits (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from attngroup.kernels.registry import ATTENTION_BACKENDS
from attngroup.reference_engine.grouping_policy import GroupingPolicy
from attngroup.reference_engine.model_pairs import ModelPair, get_model_pair
from attngroup.reference_engine.pairs.pair_options import add_pair_options, pair_name_from_args

if TYPE_CHECKING:  # grouping loads torch and the backends: imported when a command runs
    from attngroup.reference_engine.grouping_plan import GroupingPlan


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("inspect", help="show a pair's KV-cache and attention groups")
    parser.add_argument(
        "pair", nargs="?", help="model pair name (see `python -m attngroup.reference_engine pairs`)"
    )
    add_pair_options(parser)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (per-rank heads)")
    parser.add_argument("--policy", choices=[p.value for p in GroupingPolicy], default="split")
    parser.add_argument(
        "--backend",
        choices=ATTENTION_BACKENDS,
        default=None,
        help="attention backend (default: the pair's)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def plan_as_dict(pair: ModelPair, tp: int, policy: str, plan: GroupingPlan) -> dict:
    report = {
        "pair": pair.name,
        "tp": tp,
        "policy": policy,
        "kv_cache_groups": [
            {
                "spec": kv_group.kv_cache_spec.describe(),
                "layers": list(kv_group.layer_names),
                "attention_groups": [
                    {
                        "backend": entry.group.backend.name,
                        "backend_class": entry.group.backend.full_cls_name(),
                        "num_heads_q": entry.builder_num_heads,
                        "layers": list(entry.group.layer_names),
                    }
                    for entry in row
                ],
            }
            for kv_group, row in zip(plan.kv_cache_groups, plan.attention_groups, strict=True)
        ],
        "error": plan.error,
    }
    if pair.scaling:  # a pair from real configs: what the tiny pair changed
        report["scaling"] = [
            {"model": model, "field": name, "real": real, "tiny": tiny}
            for model, name, real, tiny in pair.scaling
        ]
    return report


def _spec_line(spec: dict) -> str:
    fields = [f"block {spec['block_size']}"]
    fields += [
        f"{key.replace('_', ' ')} {spec[key]}"
        for key in ("num_kv_heads", "head_size", "sliding_window")
        if spec.get(key)
    ]
    return f"{spec['type']}({', '.join(fields)}; {spec['page_size_bytes']} B/page)"


def format_table(pair: ModelPair, tp: int, policy: str, plan: GroupingPlan) -> str:
    heads_of = {layer.name: layer.num_heads_q for layer in pair.layers(tp)}
    roles = {
        name: role
        for role, names in pair.layer_roles(tp).items()
        for name in names
        if role != "kv_shared"
    }
    shared = set(pair.layer_roles(tp)["kv_shared"])
    lines = [f"{pair.name}: tp={tp} policy={policy} ({pair.description})", ""]
    for kv_id, (kv_group, row) in enumerate(
        zip(plan.kv_cache_groups, plan.attention_groups, strict=True)
    ):
        lines.append(f"KV-cache group {kv_id}: {_spec_line(kv_group.kv_cache_spec.describe())}")
        for attn_id, entry in enumerate(row):
            heads = sorted({heads_of[n] for n in entry.group.layer_names}, reverse=True)
            label = (
                f"{heads[0]} q heads"
                if len(heads) == 1
                else f"{'+'.join(map(str, heads))} q heads  <-- COLLISION"
            )
            lines.append(
                f"  attention group {kv_id}.{attn_id}: backend {entry.group.backend.name}, {label}"
            )
            for name in entry.group.layer_names:
                tags = [roles.get(name, "target")] + (["kv-shared"] if name in shared else [])
                lines.append(f"      {name:<44} {heads_of[name]:>3} q  [{', '.join(tags)}]")
        lines.append("")
    if pair.scaling:
        lines.append(
            "scaled from the real configs (heads, head sizes, layer pattern, sharing kept):"
        )
        lines += [f"  {m:<6} {name:<28} {real} -> {tiny}" for m, name, real, tiny in pair.scaling]
        lines.append("")
    lines.append(
        f"error: {plan.error}"
        if plan.error
        else "ok: every attention group has one query-head count"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from attngroup.reference_engine.grouping_plan import plan_grouping
    from attngroup.reference_engine.pairs.pair_configs import PairConfigError

    try:
        pair = get_model_pair(pair_name_from_args(args))
    except PairConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    plan = plan_grouping(pair.layers(args.tp, args.backend), args.policy)
    if args.json:
        print(json.dumps(plan_as_dict(pair, args.tp, args.policy, plan), indent=2))
    else:
        print(format_table(pair, args.tp, args.policy, plan))
    return 1 if plan.error else 0
