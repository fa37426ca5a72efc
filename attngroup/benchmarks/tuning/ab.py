"""Same-process A/B of the Triton kernel's launch variants on the benchmark's cases.

Each variant is the launcher's heuristic config with a few fields replaced (segments still
fitted to whole waves of the variant's compiled kernel); ``current`` is the launcher's own
choice, as the engine runs it. Per case every variant is checked against the float32 oracle
on a NaN-poisoned output, then all are timed in interleaved rounds (cold L2, as
``attngroup.benchmarks.timing``), so slow drift of the machine hits every variant alike.
Printed per variant: median with p10 / p90, ratio to ``current``, registers per thread and
shared memory of the compiled attention kernel. The last lines name, per kind of case
(padded head size, one or several query tokens per request), the variant faster than
``current`` on every case of that kind, if any: the candidates for
``triton_launch_config.TUNED_BANDWIDTH_OPTIONS``.

    python -m attngroup.benchmarks.tuning.ab --cases verify.gemma4-e2b-sliding-d256.b16x32k --json out/ab.json

``--compile-workers N`` compiles the variants first in N processes (Triton's on-disk cache
then serves the timing process), which shortens a GPU call with many variants;
``--compile-only`` stops there (to compile while something else runs, then time alone).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attngroup.benchmarks.cli import argument_parser

if TYPE_CHECKING:  # torch, triton and the kernels load after the arguments are parsed
    from attngroup.benchmarks.attention_cases import Case
    from attngroup.kernels.ops.triton_launch_config import LaunchConfig, LaunchKind

CURRENT = "current"
FASTER_BY = 0.995
"""A variant is a candidate for a kind of case when its median is at most this fraction of
``current``'s on every case of the kind (half a percent: above the spread of two timings of
one variant in one process, about 0.3 % on the H200)."""


@dataclass(frozen=True)
class Variant:
    """Fields replaced in the heuristic's config; ``tile_divisor`` divides its tile size;
    ``path`` forces the launch kind (None: the launcher's for the case). A variant with a
    forced path is never a candidate: the path is ``select_path``'s decision, not an option
    of the tuned tables."""

    name: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    tile_divisor: int = 1
    path: LaunchKind | None = None

    def launch_path(self, case: Case) -> LaunchKind:
        from attngroup.benchmarks.case_launch import triton_path

        return self.path or triton_path(case)

    def config(self, heuristic: LaunchConfig) -> LaunchConfig | None:
        """The variant's config (None for ``current``: the launcher's own choice)."""
        if self.name == CURRENT:
            return None
        tile_size = max(16, heuristic.tile_size // self.tile_divisor)
        return replace(heuristic, **{"num_segments": None, "tile_size": tile_size, **self.fields})


PREFETCH_3 = {"prefetch_block_table": True, "num_stages": 3}
TMA_PREFETCH = {"tma_kv": True, "prefetch_block_table": True}
TMA_PREFETCH_3 = {**TMA_PREFETCH, "num_stages": 3}
VARIANTS = (
    Variant(CURRENT),
    Variant("value-split-2", {"value_splits": 2}),
    Variant("value-split-4", {"value_splits": 4}),
    Variant("stages-3", {"num_stages": 3}),
    Variant("prefetch-stages-3", PREFETCH_3),
    Variant("prefetch-stages-3-half-tile", PREFETCH_3, tile_divisor=2),
    Variant("value-split-2-prefetch-stages-3", {"value_splits": 2, **PREFETCH_3}),
    Variant("value-split-2-half-tile", {"value_splits": 2}, tile_divisor=2),
    Variant("half-tile", tile_divisor=2),
    # Verify at 8 query heads per KV head: two programs per request (their K/V reads meet in L2).
    Variant("rows-16", {"block_m": 16}),
    Variant("rows-16-prefetch-stages-3-half-tile", {"block_m": 16, **PREFETCH_3}, tile_divisor=2),
    # Tensor-descriptor (TMA) loads of K and V, one 16-key page per tile.
    *(
        Variant(f"tma-stages-{stages}", {"tma_kv": True, "num_stages": stages}, tile_divisor=4)
        for stages in (2, 3, 4)
    ),
    Variant("tma-stages-3-warps-8", {"tma_kv": True, "num_stages": 3, "num_warps": 8}, 4),
    # The same with the page numbers read one tile ahead: num_stages - 1 buffers.
    *(
        Variant(f"tma-prefetch-stages-{stages}", {**TMA_PREFETCH, "num_stages": stages}, 4)
        for stages in (2, 3, 4, 6)
    ),
    # Head 512 on tensor descriptors: 255 registers on four warps (184 bytes spilled offline).
    Variant("tma-prefetch-stages-3-warps-8", {**TMA_PREFETCH_3, "num_warps": 8}, 4),
    # One wave where MIN_SEGMENTS_3D takes two: the e4b's 128 (request, KV head) programs at
    # 64 x 8k hold 2 segments each in one wave at head 512 (2 programs per SM) and 3 at head
    # 256 (the tensor-descriptor entry, 3 per SM); FlashInfer launches one wave there.
    *(Variant(f"segments-{segments}", {"num_segments": segments}) for segments in (2, 3)),
    # Head 512 on eight warps: the accumulator split over twice the threads leaves room for
    # two buffers of 16-key tiles (offline sm_90 compile, Triton 3.6: e2b verify 128 registers
    # against 255, e4b decode 94 against 224, 82-99 KiB, no spill).
    Variant("warps-8-prefetch-stages-3-half-tile", {"num_warps": 8, **PREFETCH_3}, tile_divisor=2),
    *(
        Variant(
            f"tma-prefetch-stages-3-segments-{segments}",
            {**TMA_PREFETCH_3, "num_segments": segments},
            4,
        )
        for segments in (2, 3)
    ),
    # A register cap for one more program per SM: the e4b head-256 draft (two query heads per
    # KV head) compiles to 195 registers on the tensor-descriptor entry, 2 programs per SM,
    # where its decode (four per KV head) takes 168, 3 per SM.
    *(
        Variant(
            f"tma-prefetch-stages-3-registers-{cap}", {**TMA_PREFETCH_3, "max_registers": cap}, 4
        )
        for cap in (168, 128)
    ),
    # No split: one program per (q-block, KV head) over the whole range, no merge kernel and
    # no scratch, where the 2D grid has about one program per SM (the e4b at 64 x 8k and
    # Llama at 16 x 32k: 128); a single program per SM leaves shared memory for more stages.
    Variant("2d", path="2d"),
    Variant("2d-stages-4", {"num_stages": 4}, path="2d"),
    *(
        Variant(f"tma-prefetch-stages-{stages}-2d", {**TMA_PREFETCH, "num_stages": stages}, 4, "2d")
        for stages in (3, 4, 5)
    ),
)
WORST_CASES = (
    "verify.gemma4-e2b-sliding-d256.b16x32k",
    "decode.gemma4-e2b-sliding-d256.b64x8k",
    "decode.gemma4-e4b-sliding-d256.b64x8k",
    "verify.gemma4-e4b-sliding-d256.b64x8k",
    "verify.gemma4-e2b-full-d512.b64x8k",
    "draft.gemma4-e4b-full-d512.b16x32k",
    "decode.gemma4-e4b-full-d512.b64x8k",
)
"""The cases furthest behind FlashInfer 0.7.4 at each head size and query kind, and the e4b
head-256 decode and verify (close to copy bandwidth: a variant must not cost them)."""


def case_kind(case: Case) -> tuple[int, bool]:
    """The kind a case's candidate is named under: (padded head size, several tokens), the
    key of ``TUNED_BANDWIDTH_OPTIONS`` for any group size (an entry for one group size is set
    from the per-case rows)."""
    from attngroup.kernels.ops.triton_launch_config import dot_head_size

    return dot_head_size(case.shape.head_size), case.query_len > 1


def find_case(name: str) -> Case:
    from attngroup.benchmarks.attention_cases import SHAPES, cases

    for case in cases(quick=False, tiny=False, shape_names=list(SHAPES)):
        if case.name == name:
            return case
    raise ValueError(f"no benchmark case named {name!r}")


class CaseBench:
    """One case's cache, query, metadata and split-KV scratch, and a launch per config."""

    def __init__(self, case: Case, device) -> None:
        import torch

        from attngroup.benchmarks.attention_runner import DTYPE, KVCache, step_metadata
        from attngroup.kernels.ops.split_kv_scratch import SplitKVScratch
        from attngroup.kernels.ops.triton_launch_config import DEFAULT_NUM_SEGMENTS

        self.case = case
        self.cache = KVCache.random(case, device)
        self.common = step_metadata(case, self.cache.block_table, device)
        generator = torch.Generator(device=device).manual_seed(1)
        tokens = case.batch_size * case.query_len
        shape = (tokens, case.num_heads_q, case.shape.head_size)
        self.query = torch.randn(shape, generator=generator, device=device, dtype=DTYPE)
        self.output = torch.full_like(self.query, float("nan"))
        self.scratch = SplitKVScratch.allocate(
            tokens, case.num_heads_q, DEFAULT_NUM_SEGMENTS, case.shape.head_size, device
        )

    def heuristic(self) -> LaunchConfig:
        from attngroup.benchmarks.case_launch import heuristic_launch_config

        return heuristic_launch_config(self.case)

    @cached_property
    def tensors(self):
        """The launch's tensors, built once: every plan of the case launches on the same ones."""
        from attngroup.kernels.ops.triton_launch_plan import AttentionTensors

        common, cache = self.common, self.cache
        return AttentionTensors(
            self.query,
            cache.key_cache,
            cache.value_cache,
            self.output,
            common.query_start_loc,
            common.seq_lens,
            common.block_table,
            self.scratch,
        )

    def plan(self, variant: Variant):
        """The launcher's plan for ``variant`` (planned once, as a captured step would)."""
        from functools import partial

        from attngroup.kernels.ops.triton_launch_plan import plan_launch
        from attngroup.kernels.ops.triton_unified_attention import wave_slots_of

        case, tensors = self.case, self.tensors
        return plan_launch(
            tensors,
            max_query_len=case.query_len,
            max_seq_len=case.context_len,
            sm_scale=case.shape.head_size**-0.5,
            wave_slots=partial(wave_slots_of, tensors),
            path=variant.launch_path(case),
            config=variant.config(self.heuristic()),
        )

    def launcher(self, plan):
        """The launch of one plan."""
        from attngroup.kernels.ops.triton_unified_attention import launch

        tensors = self.tensors
        return lambda: launch(plan, tensors)

    def error(self, run) -> float:
        from attngroup.benchmarks.attention_runner import BackendRun, check_against_oracle

        self.output.fill_(float("nan"))
        run()
        if self.output.isnan().any():
            return math.inf
        backend_run = BackendRun("triton", run, self.output, "")
        return check_against_oracle(backend_run, self.case, self.common, self.cache, self.query)


def compile_variant(case_name: str, variant_name: str) -> None:
    """Worker: run one variant of one case once, filling Triton's on-disk cache."""
    import torch

    bench = CaseBench(find_case(case_name), torch.device("cuda"))
    variant = next(variant for variant in VARIANTS if variant.name == variant_name)
    try:
        bench.launcher(bench.plan(variant))()
        torch.cuda.synchronize()
    except Exception as error:  # refused configs are reported by the timing process
        print(f"compile {case_name} {variant_name}: {type(error).__name__}", file=sys.stderr)


def precompile(case_names: Sequence[str], variants: Sequence[Variant], workers: int) -> None:
    """Every (case, variant) compiled in ``workers`` spawned processes. The worker function is
    taken from the imported module, never ``__main__``, so it pickles under ``python -m``."""
    import importlib
    import multiprocessing

    module = importlib.import_module("attngroup.benchmarks.tuning.ab")
    jobs = [(name, variant.name) for name in case_names for variant in variants]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.starmap(module.compile_variant, jobs, chunksize=1)


def ab_case(case: Case, variants: Sequence[Variant], rounds: int, runs: int, flush) -> list[dict]:
    """Every variant of one case: oracle error, resources, and timings in interleaved rounds."""
    import torch

    from attngroup.benchmarks.backend_names import MAX_RELATIVE_ERROR
    from attngroup.benchmarks.timing import ROUND_WARMUP, time_interleaved
    from attngroup.kernels.ops.triton_unified_attention import kernel_resources

    bench = CaseBench(case, torch.device("cuda"))
    runnable = {}
    rows: dict[str, dict[str, object]] = {}  # variant name -> its JSON row
    for variant in variants:
        try:
            plan = bench.plan(variant)
            run = bench.launcher(plan)
            error = bench.error(run)
        except Exception as exc:  # a config the compiler or the smem budget refuses
            rows[variant.name] = {"variant": variant.name, "refused": f"{type(exc).__name__}"}
            continue
        registers, shared = kernel_resources(plan, bench.tensors)
        rows[variant.name] = {
            "variant": variant.name,
            "path": plan.path,
            "config": plan.config.__dict__,
            "registers": registers,
            "shared_bytes": shared,
            "relative_error": error,
            "correct": error < MAX_RELATIVE_ERROR,
        }
        if error < MAX_RELATIVE_ERROR:
            runnable[variant.name] = run
    timings = time_interleaved(
        runnable, total_runs=rounds * runs, warmup=ROUND_WARMUP, flush=flush, rounds=rounds
    )
    current = timings[CURRENT].median_us if CURRENT in timings else math.nan
    for name, timing in timings.items():
        rows[name].update(
            median_us=timing.median_us,
            p10_us=timing.percentile_us(10),
            p90_us=timing.percentile_us(90),
            over_current=timing.median_us / current,
            tb_per_s=case.kv_bytes / (timing.median_us * 1e-6) / 1e12,
        )
    return [rows[variant.name] for variant in variants]


TUNED_FIELDS = (
    "tile_size",
    "num_warps",
    "num_stages",
    "value_splits",
    "prefetch_block_table",
    "tma_kv",
)


ROW_FIELDS = ("block_m", "max_registers")
"""Fields a candidate's entry carries only where its variant sets them: rows per program
depend on the group size, so they are never taken from one case for a whole kind; a register
cap is not a tuned field of every entry."""


def candidates(report: Mapping[str, list[dict]]) -> list[dict]:
    """Per kind of case, the variant at most ``FASTER_BY`` of ``current`` on every case of
    that kind (the lowest geometric mean of those ratios), else ``current``; with the
    variant's ``TUNED_FIELDS`` as its compiled config had them (the table's entry for any
    group size, ``group_size`` None). Where that is ``current`` and the kind's cases have
    several group sizes, the same rule per group size too (the table's entries for one)."""
    kinds: dict[tuple[int, bool], list[str]] = {}
    for name in report:
        kinds.setdefault(case_kind(find_case(name)), []).append(name)
    chosen = []
    for (head, several), names in sorted(kinds.items()):
        groups: dict[int | None, list[str]] = {None: names}
        entry = _best_variant(report, names)
        by_group: dict[int, list[str]] = {}
        for name in names:
            case = find_case(name)
            by_group.setdefault(case.num_heads_q // case.shape.num_kv_heads, []).append(name)
        if entry[0] == CURRENT and len(by_group) > 1:
            groups.update(sorted(by_group.items()))
        for group_size, group_names in groups.items():
            variant, mean, options = _best_variant(report, group_names)
            chosen.append(
                {
                    "head_size_padded": head,
                    "several_tokens": several,
                    "group_size": group_size,
                    "variant": variant,
                    "geomean_over_current": mean,
                    "options": options,
                }
            )
    return chosen


def _best_variant(report: Mapping[str, list[dict]], names: list[str]) -> tuple[str, float, dict]:
    """The variant at most ``FASTER_BY`` of ``current`` on every one of ``names`` with the
    lowest geometric mean of its ratios, that mean and its options; else ``current``."""
    best, best_mean, options = CURRENT, 1.0, {}
    variants = {row["variant"] for name in names for row in report[name]}
    forced_paths = {v.name for v in VARIANTS if v.path is not None}
    for variant in sorted(variants - {CURRENT} - forced_paths):
        rows = [row for name in names for row in report[name] if row["variant"] == variant]
        ratios = [row.get("over_current", math.inf) for row in rows if row.get("correct")]
        if len(ratios) != len(names) or max(ratios) > FASTER_BY:
            continue
        mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
        if mean < best_mean:
            best, best_mean = variant, mean
            fields = [*TUNED_FIELDS, *(key for key in ROW_FIELDS if key in _fields_of(variant))]
            options = {key: rows[0]["config"][key] for key in fields}
    return best, best_mean, options


def _fields_of(variant: str) -> Mapping[str, Any]:
    return next((v.fields for v in VARIANTS if v.name == variant), {})


def print_case(name: str, rows: list[dict]) -> None:
    print(name, flush=True)
    for row in rows:
        if "refused" in row:
            print(f"   {row['variant']:<34} refused ({row['refused']})")
        elif "median_us" not in row:
            print(f"   {row['variant']:<34} WRONG (relative error {row['relative_error']:.2e})")
        else:
            print(
                f"   {row['variant']:<34} {row['median_us']:8.1f} us  p10 {row['p10_us']:8.1f}"
                f"  p90 {row['p90_us']:8.1f}  {row['over_current']:5.3f}x  "
                f"{row['tb_per_s']:4.2f} TB/s  {row['registers']:3d} regs "
                f"{row['shared_bytes'] // 1024:3d} KiB  err {row['relative_error']:.1e}",
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser("attngroup.benchmarks.tuning.ab", __doc__)
    parser.add_argument("--cases", default=",".join(WORST_CASES), help="comma-separated names")
    parser.add_argument(
        "--variants", default=None, help="comma-separated (default: all; current always runs)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10, help="timed runs per variant per round")
    parser.add_argument("--compile-workers", type=int, default=0)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    by_name = {variant.name: variant for variant in VARIANTS}
    wanted = args.variants.split(",") if args.variants else list(by_name)
    unknown = sorted(set(wanted) - set(by_name))
    case_names = args.cases.split(",")
    try:
        for name in case_names:
            find_case(name)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if unknown:
        print(f"error: unknown variants {unknown}; known: {sorted(by_name)}", file=sys.stderr)
        return 2
    variants = [by_name[CURRENT]] + [by_name[name] for name in wanted if name != CURRENT]
    import torch

    if not torch.cuda.is_available():
        print("error: the A/B needs a CUDA device", file=sys.stderr)
        return 2
    from attngroup.benchmarks.timing import l2_flush_buffer
    from attngroup.reports.atomic import write_text_atomic

    if args.compile_workers > 0 or args.compile_only:
        precompile(case_names, variants, max(args.compile_workers, 1))
    if args.compile_only:
        return 0
    flush = l2_flush_buffer(torch.device("cuda"))
    report = {}
    status = 0
    for name in case_names:
        rows = ab_case(find_case(name), variants, args.rounds, args.runs, flush)
        report[name] = rows
        print_case(name, rows)
        status = status or int(any(row.get("correct") is False for row in rows))
    chosen = candidates(report)
    for entry in chosen:
        tokens = "several tokens" if entry["several_tokens"] else "one token"
        if entry["group_size"] is not None:
            tokens += f", {entry['group_size']} query heads per KV head"
        print(
            f"candidate for head {entry['head_size_padded']}, {tokens}: {entry['variant']} "
            f"(geomean {entry['geomean_over_current']:.3f}x current) {entry['options']}"
        )
    if args.json:
        output = {"cases": report, "candidates": chosen, "device": torch.cuda.get_device_name()}
        write_text_atomic(args.json, json.dumps(output, indent=1))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
