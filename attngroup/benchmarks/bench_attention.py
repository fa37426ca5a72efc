"""Decode, verify and draft attention on the GPU: our Triton kernel against its two peers.

Every case goes through the backends' own builders and implementations
(``attngroup.kernels.registry``; the peer "vllm-triton", vLLM 0.34.0's own Triton kernel
driven as vLLM's Triton backend drives it, from ``attngroup.benchmarks.vllm_triton_peer``),
on a bf16 paged KV cache with shuffled pages (page 16):

- decode: one new token per request, the target's query heads;
- verify: four tokens per request (three drafts plus the bonus), causal;
- draft: one token with the draft's 4 query heads on the pages of an 8-head target
  (Gemma 4 MTP);

for Gemma 4 shapes (head 256 and 512, 1 and 2 KV heads; sliding layers timed over
the whole context, as full attention) and Llama 3 (32 q / 8 kv / head 128), at
64 x 8k and 16 x 32k tokens of context. Per case every launch (each backend, each
FlashInfer configuration) is first run once and checked against the oracle, then all are
timed in interleaved rounds, the order rotated each round (``timing.time_interleaved``). It
prints, per case and backend, the
median latency over the timed runs (L2 flushed before each), the KV bytes read
per second and their fraction of the device-to-device copy bandwidth measured in
the same run, p10/p90, and Triton's latency over each peer's and over the
fastest peer's (``triton_over_best_peer``). FlashInfer is timed in every configuration
that can run the case (``attngroup.benchmarks.flashinfer_sweep``) and its fastest
correct one is the peer ``flashinfer``; ``--json``
writes the metrics as a list of ``{name, value, unit, samples, higher_is_better}``,
``--record`` as a run record for ``python -m attngroup.reports compare`` (``attngroup.benchmarks.run_record``).

``--dry-run`` runs every case once and checks it against the oracle without
timing; with ``--tiny`` (required on the CPU, where Triton runs under its
interpreter, on float32 caches: its ``tl.dot`` on bf16 is wrong) the contexts are small. Every run records each backend's relative
error against the oracle on the first requests. ``--cuda-graph`` (GPU) also
captures each backend's launch into a CUDA graph, checks the replay against the
oracle on a poisoned output (``graph_relative_error``) and times it beside the
eager launch (``graph_latency``): the kernel time without host launch work.

"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from attngroup.benchmarks.attention_cases import ALL_MODES, CONTEXTS, SHAPES, TINY_CONTEXTS
from attngroup.benchmarks.backend_names import BACKENDS
from attngroup.benchmarks.cli import argument_parser


def comma_list(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argument_parser("attngroup.benchmarks.bench_attention", __doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the metrics to this JSON file")
    parser.add_argument(
        "--record",
        type=Path,
        help="write a run record (python -m attngroup.reports compare --run PATH) to this file",
    )
    parser.add_argument("--quick", action="store_true", help="a small smoke subset")
    parser.add_argument(
        "--cuda-graph",
        action="store_true",
        help="also replay each backend's kernels from a CUDA graph: checked, and timed beside "
        "the eager launch (GPU only)",
    )
    parser.add_argument("--dry-run", action="store_true", help="validate cases, time nothing")
    parser.add_argument(
        "--tiny", action="store_true", help="small contexts (with --dry-run; needed on the CPU)"
    )
    parser.add_argument("--runs", type=int, default=50, help="timed runs per case (>= 20)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs first")
    parser.add_argument(
        "--backends",
        type=comma_list,
        default=list(BACKENDS),
        help=f"comma-separated, of {','.join(BACKENDS)} (default: all that can run)",
    )
    parser.add_argument(
        "--shapes",
        type=comma_list,
        default=list(SHAPES),
        help=f"comma-separated, of {', '.join(SHAPES)}",
    )
    parser.add_argument(
        "--contexts",
        type=comma_list,
        default=None,
        help=f"comma-separated, of {', '.join(CONTEXTS)} (default: all; with --tiny: {', '.join(TINY_CONTEXTS)})",
    )
    parser.add_argument(
        "--modes", type=comma_list, default=list(ALL_MODES), help=f"of {', '.join(ALL_MODES)}"
    )
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    args = parser.parse_args(argv)
    if args.runs < 20:
        parser.error(f"--runs must be at least 20, got {args.runs}")
    if args.warmup < 1:
        parser.error(f"--warmup must be at least 1, got {args.warmup}")
    unknown = [name for name in args.shapes if name not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    known_contexts = TINY_CONTEXTS if args.tiny else CONTEXTS
    unknown = [name for name in args.contexts or () if name not in known_contexts]
    unknown += [name for name in args.modes if name not in ALL_MODES]
    if unknown:
        parser.error(
            f"unknown contexts or modes {unknown}; known: {', '.join(known_contexts)}; "
            f"{', '.join(ALL_MODES)}"
        )
    bad_backends = [name for name in args.backends if name not in BACKENDS]
    if bad_backends:
        parser.error(f"unknown backends {bad_backends}; known: {', '.join(BACKENDS)}")
    if args.tiny and not args.dry_run:
        parser.error("--tiny is for --dry-run (tiny contexts say nothing about speed)")
    import torch  # only once the arguments are known to be well formed

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = torch.device(args.device).type == "cuda" and torch.cuda.is_available()
    if not args.dry_run and not on_gpu:
        parser.error("timing needs a CUDA device; on the CPU use --dry-run --tiny")
    if args.cuda_graph and not on_gpu:
        parser.error("--cuda-graph needs a CUDA device")
    if args.dry_run and not on_gpu and not args.tiny:
        parser.error("on the CPU --dry-run needs --tiny (full contexts take gigabytes)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from attngroup.benchmarks.attention_runner import (
        available,
        record_writer,
        run_cases,
        write_outputs,
    )

    device = torch.device(args.device)
    if not available(args.backends, device):
        print(f"none of the backends {args.backends} can run on {device}", file=sys.stderr)
        return 2
    record = record_writer(args.record, device)
    metrics, status = run_cases(args, device, record)
    write_outputs(args, metrics, record)
    if args.json is not None:
        print(f"wrote {len(metrics)} metrics to {args.json}")
    if args.record is not None:
        print(f"wrote the run record {args.record}")
    if status:
        print("some backends disagreed with the oracle (see above)", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
