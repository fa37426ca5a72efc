"""Sweep the Triton kernel's launch parameters on the GPU for the benchmark's
decode, verify and draft cases, and print the fastest configurations next to
the heuristic's choice (``choose_launch_config``).

    python -m benchmarks.tune_attention --shapes gemma4-e2b-sliding-d256 --json out/tune.json

Used to set the heuristic; the benchmark (``benchmarks.bench_attention``) is
what reports performance.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.bench_attention import SHAPES, Case, KVCache, cases, step_metadata
from benchmarks.timing import l2_flush_buffer, time_cuda
from kernels.triton_unified_attention import (
    LaunchConfig,
    SplitKVScratch,
    choose_launch_config,
    select_path,
    unified_attention,
)

TILE_SIZES = (32, 64, 128)
NUM_WARPS = (4, 8)
NUM_STAGES = (2, 3, 4)
NUM_SEGMENTS = (16, 32, 64)


def sweep(case: Case, device: torch.device, runs: int) -> list[dict]:
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
    path = select_path(
        num_seqs=case.batch_size,
        max_query_len=case.query_len,
        num_heads_q=case.num_heads_q,
        num_kv_heads=case.shape.num_kv_heads,
        head_size=case.shape.head_size,
        has_scratch=True,
    )
    scratch = SplitKVScratch.allocate(
        common.num_actual_tokens, case.num_heads_q, max(NUM_SEGMENTS), case.shape.head_size, device
    )
    heuristic = choose_launch_config(
        num_heads_q=case.num_heads_q,
        num_kv_heads=case.shape.num_kv_heads,
        head_size=case.shape.head_size,
        num_seqs=case.batch_size,
        max_query_len=case.query_len,
        max_seq_len=case.context_len,
        path=path,
    )
    flush = l2_flush_buffer(device)
    results = []
    segments = NUM_SEGMENTS if path == "3d" else (1,)
    for tile, warps, stages, segs in itertools.product(TILE_SIZES, NUM_WARPS, NUM_STAGES, segments):
        config = LaunchConfig(
            heuristic.block_m, tile, warps, stages, segs, heuristic.merge_heads_per_program
        )

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
            results.append({"config": config.__dict__, "error": type(error).__name__})
            continue
        results.append(
            {
                "config": config.__dict__,
                "median_us": timing.median_us,
                "tb_per_s": case.kv_bytes / (timing.median_us * 1e-6) / 1e12,
                "heuristic": config == heuristic,
            }
        )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--modes", default="decode,verify,draft")
    parser.add_argument("--contexts", default="b64x8k")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the sweep needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    modes = set(args.modes.split(","))
    report = {}
    for case in cases(quick=True, tiny=False, shape_names=args.shapes.split(",")) + cases(
        quick=False, tiny=False, shape_names=args.shapes.split(",")
    ):
        if (
            case.mode not in modes
            or case.context_name not in args.contexts.split(",")
            or case.name in report
        ):
            continue
        results = [r for r in sweep(case, device, args.runs) if "median_us" in r]
        results.sort(key=lambda r: r["median_us"])
        report[case.name] = results
        chosen = next((r for r in results if r["heuristic"]), None)
        print(f"{case.name}: heuristic {chosen['median_us'] if chosen else float('nan'):.1f} us")
        for r in results[:4]:
            print(f"   {r['median_us']:8.1f} us {r['tb_per_s']:5.2f} TB/s  {r['config']}")
        sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
