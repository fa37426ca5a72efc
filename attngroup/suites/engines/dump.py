"""Write an engine's grouping outcomes for every pair, TP size and policy as
canonical JSON to a file.

Used by the determinism test, which runs it in fresh processes with
different hash seeds: ``python -m attngroup.suites.engines.dump ENGINE OUTPUT``. The
outcomes go to ``OUTPUT``, not to stdout: an engine may print its own log
lines there (vLLM prints timestamped warnings), and those must not decide
whether two groupings are equal.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from attngroup.reference_engine.model_pairs import MODEL_PAIRS
from attngroup.reference_engine.pairs.pair_options import pairs_file_from_env
from attngroup.reference_engine.pairs.pairs_file import register_pairs_file
from attngroup.suites.engines.base import EngineAdapter, GroupingOutcome


def outcome_as_json(outcome: GroupingOutcome) -> str:
    return json.dumps(
        {
            "kv_cache_groups": [
                {"layers": list(g.layer_names), "spec": g.kv_cache_spec.describe()}
                for g in outcome.kv_cache_groups
            ],
            "attention_groups": [
                [
                    {
                        "backend": g.backend,
                        "layers": list(g.layer_names),
                        "num_heads_q": g.num_heads_q,
                    }
                    for g in per_kv
                ]
                for per_kv in outcome.attention_groups
            ],
            "error": outcome.error,
        },
        sort_keys=True,
    )


def all_outcomes_as_json(adapter: EngineAdapter) -> str:
    return "\n".join(
        f"{name} tp{tp} {policy} {outcome_as_json(adapter.setup(pair.layers(tp), policy, pair=pair))}"
        for name, pair in MODEL_PAIRS.items()
        for tp in pair.supported_tp_sizes
        for policy in adapter.policies
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m attngroup.suites.engines.dump ENGINE OUTPUT", file=sys.stderr)
        return 2
    engine, output = argv
    pairs_file = pairs_file_from_env()
    if pairs_file is not None:
        register_pairs_file(pairs_file)
    adapter = importlib.import_module(f"attngroup.suites.engines.{engine}_adapter").make_adapter(
        None
    )
    text = all_outcomes_as_json(adapter)
    Path(output).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
