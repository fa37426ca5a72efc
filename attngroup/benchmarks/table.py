"""The README's performance table, from a ``bench_attention`` metric list (``--json``).

Everything is derived from one run's metrics, so the ratios compare timings
taken side by side: verify / decode and draft / target (decode) per shape and
context; per case, each peer's latency (FlashInfer's fastest correct
configuration, named beside it; vLLM's own Triton kernel) and Triton's latency over the fastest peer's
("vs best peer"). A run with ``--cuda-graph`` adds Triton's graph-replay
latency and the same ratio to decode from the replays (kernel time without the
host's launch work). A run record (``--record``, a JSON object) is refused with
exit 2: it leaves the ratios out; give the metric list it was made from.

    python -m attngroup.benchmarks.table attngroup/benchmarks/results/h200-2026-12-03-best-peer-matrix.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attngroup.benchmarks.cli import argument_parser


@dataclass(frozen=True)
class CaseResult:
    """One (mode, shape, context) case of a run: Triton's numbers and FlashInfer's latency."""

    mode: str
    shape: str
    context: str
    triton_us: float
    triton_tb_per_s: float
    fraction_of_copy: float
    peer_us: dict[str, float]  # peer backend -> latency, for the peers this case ran
    triton_graph_us: float | None = None
    flashinfer_config: str | None = None  # the fastest correct FlashInfer configuration

    @property
    def best_peer(self) -> str | None:
        return min(self.peer_us, key=self.peer_us.__getitem__) if self.peer_us else None


PEER_COLUMNS = {"flashinfer": "FlashInfer", "vllm-triton": "vLLM Triton"}


class NotAMetricListError(ValueError):
    """The file is JSON but not a bench_attention metric list (e.g. a run record)."""


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
                    {
                        peer: values[f"{key}.{peer}.latency"]
                        for peer in PEER_COLUMNS
                        if f"{key}.{peer}.latency" in values
                    },
                    values.get(f"{key}.triton.graph_latency"),
                    _fastest_config(values, key),
                )
            )
        except KeyError as missing:
            raise ValueError(f"{key}: the run lacks metric {missing}") from None
    return results


def _fastest_config(values: dict[str, float], key: str) -> str | None:
    """The FlashInfer configuration whose latency is the case's FlashInfer latency (the sweep
    reports its fastest correct configuration as ``flashinfer``)."""
    best = values.get(f"{key}.flashinfer.latency")
    prefix, suffix = f"{key}.flashinfer.config_", "_latency"
    for name, value in values.items():
        if name.startswith(prefix) and name.endswith(suffix) and value == best:
            return name.removeprefix(prefix).removesuffix(suffix)
    return None


def _microseconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _ratio(numerator: float | None, denominator: float | None) -> str:
    return "—" if numerator is None or denominator is None else f"{numerator / denominator:.2f}"


def _peer_cell(result: CaseResult, peer: str) -> str:
    cell = _microseconds(result.peer_us.get(peer))
    if peer == "flashinfer" and result.flashinfer_config is not None:
        cell += f" ({result.flashinfer_config})"
    return cell


def markdown_table(results: Sequence[CaseResult]) -> str:
    by_key = {(r.mode, r.shape, r.context): r for r in results}
    graphs = any(r.triton_graph_us is not None for r in results)
    peers = [peer for peer in PEER_COLUMNS if any(peer in r.peer_us for r in results)]
    header = "| case | Triton us | TB/s | % of copy |"
    header += "".join(f" {PEER_COLUMNS[peer]} us |" for peer in peers)
    header += " vs best peer | vs decode |"
    if graphs:
        header += " Triton graph us | graph vs decode |"
    lines = [header, "|" + " --- |" * (header.count("|") - 1)]
    for r in results:
        decode = None if r.mode == "decode" else by_key.get(("decode", r.shape, r.context))
        best = r.best_peer
        versus_best = "—" if best is None else f"{r.triton_us / r.peer_us[best]:.2f} ({best})"
        line = (
            f"| {r.mode} {r.shape} {r.context} | {r.triton_us:.1f} | {r.triton_tb_per_s:.2f} | "
            f"{100 * r.fraction_of_copy:.1f} % |"
            + "".join(f" {_peer_cell(r, peer)} |" for peer in peers)
            + f" {versus_best} | "
            f"{'' if decode is None else _ratio(r.triton_us, decode.triton_us)} |"
        )
        if graphs:
            graph_versus = (
                "" if decode is None else _ratio(r.triton_graph_us, decode.triton_graph_us)
            )
            line += f" {_microseconds(r.triton_graph_us)} | {graph_versus} |"
        lines.append(line)
    return "\n".join(lines)


def read_metric_list(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        raise NotAMetricListError(
            "this is a run record (a JSON object; it leaves the per-case ratios out), not a "
            "bench_attention metric list: give the --json file it was made from (the committed "
            "runs keep it beside the record, NAME.json for NAME.record.json)"
        )
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise NotAMetricListError("expected a JSON list of metric objects (bench_attention --json)")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(
        "attngroup.benchmarks.table",
        __doc__,
        "exit status: 0 ok; 2 bad input (a missing or unreadable file, not a metric list)",
    )
    parser.add_argument("run", type=Path, help="a JSON file written by bench_attention --json")
    args = parser.parse_args(argv)
    try:
        results = load_cases(read_metric_list(args.run))
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
