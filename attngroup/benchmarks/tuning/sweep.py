"""Sweep the Triton kernel's launch parameters on the GPU for the benchmark's
decode, verify and draft cases, and print the fastest configurations next to
the heuristic's choice (``choose_launch_config``).

    python -m attngroup.benchmarks.tuning.sweep --shapes gemma4-e2b-sliding-d256 --json out/tune.json

Used to set the heuristic; the benchmark (``attngroup.benchmarks.bench_attention``) is
what reports performance.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from attngroup.benchmarks.cli import argument_parser

if TYPE_CHECKING:  # torch, triton and the kernels load after the arguments are parsed
    import torch

    from attngroup.benchmarks.attention_cases import Case
    from attngroup.kernels.ops.triton_launch_config import LaunchConfig


@dataclass(frozen=True)
class SweepSpace:
    """The launch parameters a sweep tries (segments only on the split-KV path; no
    ``block_m`` means the heuristic's rows per program)."""

    block_m: tuple[int, ...] = ()
    tile_sizes: tuple[int, ...] = (32, 64, 128)
    num_warps: tuple[int, ...] = (4, 8)
    num_stages: tuple[int, ...] = (2, 3, 4)
    num_segments: tuple[int, ...] = (16, 32, 64)


def sweep(case: Case, device: torch.device, runs: int, space: SweepSpace) -> list[dict]:
    import torch

    from attngroup.benchmarks.attention_runner import KVCache, step_metadata
    from attngroup.benchmarks.case_launch import heuristic_launch_config, triton_path
    from attngroup.benchmarks.timing import l2_flush_buffer, time_cuda
    from attngroup.kernels.ops.split_kv_scratch import SplitKVScratch
    from attngroup.kernels.ops.triton_launch_config import (
        DEFAULT_NUM_SEGMENTS,
        LaunchConfig,
    )
    from attngroup.kernels.ops.triton_unified_attention import unified_attention

    cache = KVCache.random(case, device)
    common = step_metadata(case, cache.block_table, device)
    query = torch.randn(
        common.num_actual_tokens,
        case.num_heads_q,
        case.shape.head_size,
        device=device,
        dtype=cache.key_cache.dtype,
    )
    output = torch.empty_like(query)
    path = triton_path(case)
    scratch = SplitKVScratch.allocate(
        common.num_actual_tokens,
        case.num_heads_q,
        max(*space.num_segments, DEFAULT_NUM_SEGMENTS),
        case.shape.head_size,
        device,
    )
    heuristic = heuristic_launch_config(case)
    flush = l2_flush_buffer(device)
    results: list[dict[str, object]] = []  # JSON rows
    segments = space.num_segments if path == "3d" else (1,)
    grid = itertools.product(
        space.block_m or (heuristic.block_m,),
        space.tile_sizes,
        space.num_warps,
        space.num_stages,
        segments,
    )
    swept = [
        LaunchConfig(block_m, tile, warps, stages, segs, heuristic.merge_heads_per_program)
        for block_m, tile, warps, stages, segs in grid
    ]
    for config in [None, *swept]:  # None: the launcher's own choice, as the engine runs it

        def run(config=config) -> None:
            unified_attention(
                query,
                cache.key_cache,
                cache.value_cache,
                output,
                query_start_loc=common.query_start_loc,
                seq_lens=common.seq_lens,
                block_table=common.block_table,
                max_query_len=case.query_len,
                max_seq_len=case.context_len,
                sm_scale=case.shape.head_size**-0.5,
                scratch=scratch,
                path=path,
                config=config,
            )

        try:
            timing = time_cuda(run, warmup=3, runs=runs, flush=flush)
        except Exception as error:  # a config the compiler or the smem budget refuses
            results.append({"config": describe(config), "error": type(error).__name__})
            continue
        results.append(
            {
                "config": describe(config),
                "median_us": timing.median_us,
                "tb_per_s": case.kv_bytes / (timing.median_us * 1e-6) / 1e12,
                "heuristic": config is None,
            }
        )
    return results


def describe(config: LaunchConfig | None) -> dict | str:
    return "heuristic (unified_attention's own choice)" if config is None else config.__dict__


def int_list(text: str) -> tuple[int, ...]:
    """``"16,32"`` -> ``(16, 32)``."""
    try:
        return tuple(int(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers; got {text!r}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser("attngroup.benchmarks.tuning.sweep", __doc__)
    parser.add_argument(
        "--shapes", default=None, help="comma-separated (default: every benchmark shape)"
    )
    parser.add_argument("--modes", default="decode,verify,draft")
    parser.add_argument("--contexts", default="b64x8k")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", type=Path)
    defaults = SweepSpace()
    for field in fields(SweepSpace):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=int_list, default=getattr(defaults, field.name))
    args = parser.parse_args(argv)
    space = SweepSpace(**{field.name: getattr(args, field.name) for field in fields(SweepSpace)})
    import torch

    if not torch.cuda.is_available():
        print("error: the sweep needs a CUDA device", file=sys.stderr)
        return 2
    from attngroup.benchmarks.attention_cases import SHAPES, cases
    from attngroup.reports.atomic import write_text_atomic

    shape_names = args.shapes.split(",") if args.shapes else list(SHAPES)
    device = torch.device("cuda")
    modes = set(args.modes.split(","))
    report = {}
    for case in cases(quick=True, tiny=False, shape_names=shape_names) + cases(
        quick=False, tiny=False, shape_names=shape_names
    ):
        if (
            case.mode not in modes
            or case.context_name not in args.contexts.split(",")
            or case.name in report
        ):
            continue
        results = [r for r in sweep(case, device, args.runs, space) if "median_us" in r]
        results.sort(key=lambda r: r["median_us"])
        report[case.name] = results
        chosen = next((r for r in results if r["heuristic"]), None)
        print(f"{case.name}: heuristic {chosen['median_us'] if chosen else float('nan'):.1f} us")
        for r in results[:4]:
            print(f"   {r['median_us']:8.1f} us {r['tb_per_s']:5.2f} TB/s  {r['config']}")
        sys.stdout.flush()
    if args.json:
        write_text_atomic(args.json, json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
