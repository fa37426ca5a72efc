"""The README's performance table and the issue's target checks, from a ``bench_attention`` JSON.

Everything is derived from one run's metrics, so the ratios compare timings
taken side by side: verify / decode and draft / target (decode) per shape and
context, Triton / FlashInfer per case. A run with ``--cuda-graph`` adds Triton's
graph-replay latency and the same ratio to decode from the replays (kernel time
without the host's launch work).

    python -m benchmarks.table benchmarks/results/h200-2026-12-02-graph-matrix.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CaseResult:
    """One (mode, shape, context) case of a run: Triton's numbers and FlashInfer's latency."""

    mode: str
    shape: str
    context: str
    triton_us: float
    triton_tb_per_s: float
    fraction_of_copy: float
    flashinfer_us: float | None
    triton_graph_us: float | None = None


def load_cases(metrics: Sequence[dict]) -> list[CaseResult]:
    """Cases in run order; raises ValueError naming a metric the table needs but lacks."""
    values = {metric["name"]: metric["value"] for metric in metrics}
    keys = dict.fromkeys(
        name.rsplit(".", 2)[0] for name in values if name.endswith(".triton.latency")
    )
    results = []
    for key in keys:
        mode, shape, context = key.split(".")
        try:
            results.append(
                CaseResult(
                    mode,
                    shape,
                    context,
                    values[f"{key}.triton.latency"],
                    values[f"{key}.triton.kv_read_bandwidth"],
                    values[f"{key}.triton.fraction_of_copy_bandwidth"],
                    values.get(f"{key}.flashinfer.latency"),
                    values.get(f"{key}.triton.graph_latency"),
                )
            )
        except KeyError as missing:
            raise ValueError(f"{key}: the run lacks metric {missing}") from None
    return results


def _microseconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _ratio(numerator: float | None, denominator: float | None) -> str:
    return "—" if numerator is None or denominator is None else f"{numerator / denominator:.2f}"


def markdown_table(results: Sequence[CaseResult]) -> str:
    by_key = {(r.mode, r.shape, r.context): r for r in results}
    graphs = any(r.triton_graph_us is not None for r in results)
    header = (
        "| case | Triton us | TB/s | % of copy | FlashInfer us | Triton / FlashInfer | vs decode |"
    )
    if graphs:
        header += " Triton graph us | graph vs decode |"
    lines = [header, "|" + " --- |" * (header.count("|") - 1)]
    for r in results:
        decode = by_key.get(("decode", r.shape, r.context))
        versus_decode = r.mode != "decode" and decode is not None
        line = (
            f"| {r.mode} {r.shape} {r.context} | {r.triton_us:.1f} | {r.triton_tb_per_s:.2f} | "
            f"{100 * r.fraction_of_copy:.1f} % | {_microseconds(r.flashinfer_us)} | "
            f"{_ratio(r.triton_us, r.flashinfer_us)} | "
            f"{_ratio(r.triton_us, decode.triton_us) if versus_decode else ''} |"
        )
        if graphs:
            graph_versus = (
                _ratio(r.triton_graph_us, decode.triton_graph_us) if versus_decode else ""
            )
            line += f" {_microseconds(r.triton_graph_us)} | {graph_versus} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.table", description=__doc__)
    parser.add_argument("run", type=Path, help="a JSON file written by bench_attention --json")
    args = parser.parse_args(argv)
    try:
        metrics = json.loads(args.run.read_text())
        results = load_cases(metrics)
    except (OSError, json.JSONDecodeError, ValueError, KeyError, TypeError) as error:
        print(f"error: {args.run}: {error}", file=sys.stderr)
        return 2
    if not results:
        print(f"error: {args.run}: no Triton latency metrics", file=sys.stderr)
        return 2
    print(markdown_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
