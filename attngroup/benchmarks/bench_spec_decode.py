"""End-to-end speculative-decoding step time: draft, verify and metadata building per step.

The reference engine is built once for a pair, backend and dtype, with a fixed
batch of ``--batch`` requests (random prompts of ``--prompt-len`` tokens, and
``max_tokens`` long enough that none finishes during the run). It steps until
every request decodes with ``k`` drafts, runs ``--warmup`` such steps untimed
(Triton compiles, caches and pools reach their steady size), then times
``--steps`` steps. Each is one speculative step for every request, as
``LLMEngine.step`` runs it: one target verify forward over ``1 + k`` tokens per
request, rejection sampling, and the draft's proposal of ``k`` tokens for the
next step. A step that is anything else (a request finished, preempted or
verified fewer drafts) stops the run with an error.

Per step it records: ``draft_ms`` and ``verify_ms`` (the runner's forward
timings; on CUDA they wait for the device before the clock stops, so they are
kernel-complete; a state-layer pair's replay of the accepted tokens falls in
the draft), ``metadata_ms`` (host time of the step's metadata builds, part of
draft and verify), ``sampling_ms`` (rejection sampling and emission),
``step_ms`` (the whole ``LLMEngine.step``, synchronised on CUDA),
``pipelined_step_ms`` (another ``--steps`` steps run back to back without that
synchronisation: the time between consecutive steps' returns, what a serving loop sees
when the engine launches a step before it reads the one before),
``tokens_per_s`` (tokens emitted in the step over its time) and
``accepted_length`` (tokens emitted per request). It prints medians with
p10 / p90 and writes the metric list (``--json``), each metric's ``samples``
the per-step values, named ``spec_decode.<pair>.<backend>.<dtype>.b<B>.k<K>.<metric>``.
Python's garbage collector is paused during the timed steps (as ``timeit`` does).

``--cuda-graph`` runs the same batch twice in one process, eagerly and then with
the runner's captured steps (``attngroup.reference_engine.engine.cuda_graphs.graph_steps``: verify and
draft decode steps replayed per batch-size bucket), and names the metrics
``...k<K>.eager.<metric>`` and ``...k<K>.graph.<metric>``. On CUDA each mode then
profiles ``--profile-steps`` more steps and adds ``kernel_ms``: the device time of
every kernel and copy of a step (torch.profiler, summed, per step), the floor a
host-bound step approaches; ``device_span_ms`` (first kernel's start to last one's end:
the kernels and the device's gaps between them) and ``kernels`` (how many); ``graph_over_kernels`` is the graph step's median over
the eager step's kernel sum, ``graph_over_own_kernels`` over the graph step's own, and
``pipelined_over_own_kernels`` the graph mode's ``pipelined_step_ms`` over its own. In
graph mode ``metadata_ms`` counts only the passes that still build eagerly (prefill and
catch-up); a replay's in-place fill is part of ``draft_ms`` and ``verify_ms``. A greedy
batch of the Gemma 4 assistant runs on the engine's device loop
(``attngroup.reference_engine.engine.spec_decode.device_loop``): each step is one graph
launched before the host reads the step before it, so ``draft_ms`` and ``verify_ms`` are
zero, ``sampling_ms`` is the host's bookkeeping of the step before and ``wait_ms`` the
part of it spent waiting for that step's result; the device loop's counts are printed.

    python -m attngroup.benchmarks.bench_spec_decode --batch 64 --num-spec-tokens 3 --json out/bench/spec_decode.json
    python -m attngroup.benchmarks.bench_spec_decode --batch 64 -k 3 --cuda-graph --json out/bench/spec_decode_graphs.json
    python -m attngroup.benchmarks.bench_spec_decode --device cpu --batch 1 --prompt-len 8 --warmup 1 --steps 3 --smoke
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attngroup.benchmarks.cli import argument_parser
from attngroup.benchmarks.metrics import Metric, write_metrics
from attngroup.reference_engine.cli.generate_cli import DTYPES, positive_int, torch_dtype
from attngroup.reference_engine.model_pairs import MODEL_PAIRS, get_model_pair

if TYPE_CHECKING:  # torch loads after the arguments are parsed, so --help answers at once
    import torch

BACKENDS = ("triton", "flashinfer", "torch")
MIN_STEPS = 20
"""Timed steps a measurement needs; fewer only with ``--smoke``."""
BLOCK_SIZE = 16
PREFILL_BUDGET = 8192
"""Tokens per engine step while the prompts prefill (the verify steps need ``B * (k + 1)``)."""


class NotSteadyError(RuntimeError):
    """A timed step was not one speculative step of the whole batch."""


@dataclass(frozen=True)
class StepSample:
    """One timed step, in milliseconds, and what it emitted."""

    step_ms: float
    draft_ms: float
    verify_ms: float
    metadata_ms: float
    sampling_ms: float
    wait_ms: float
    tokens: int


def spread(samples: Sequence[float]) -> tuple[float, float, float]:
    """Median, p10 and p90 (inclusive deciles) of at least two samples."""
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return statistics.median(samples), deciles[0], deciles[-1]


def metric_prefix(args: argparse.Namespace) -> str:
    return (
        f"spec_decode.{args.pair}.{args.backend}.{args.dtype}.b{args.batch}.k{args.num_spec_tokens}"
    )


def max_tokens_for(args: argparse.Namespace) -> int:
    """Generated tokens a request may reach: enough that none finishes during the run."""
    # The prefill's sampled token, then at most k + 1 tokens per step: the steps that
    # bring every request to drafting (up to 2), the warm-up, the timed steps (synchronised
    # and pipelined), the profiled ones and one launched ahead.
    steps = 2 + args.warmup + 2 * args.steps + args.profile_steps + 1
    return 1 + steps * (args.num_spec_tokens + 1)


def num_blocks_for(args: argparse.Namespace, max_tokens: int) -> int:
    """Blocks per KV-cache group for the whole batch at its longest, with the null block."""
    worst_case = args.prompt_len + max_tokens + args.num_spec_tokens + 1
    return args.batch * (math.ceil(worst_case / BLOCK_SIZE) + 1) + 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argument_parser("attngroup.benchmarks.bench_spec_decode", __doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=sorted(MODEL_PAIRS), default="gemma4-e2b-mtp")
    parser.add_argument(
        "--backend", choices=BACKENDS, default=None, help="default: triton on CUDA, torch on CPU"
    )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on CUDA, fp32 on CPU"
    )
    parser.add_argument("--num-spec-tokens", "-k", type=int, default=3, help="k drafts (1..8)")
    parser.add_argument("--batch", type=positive_int, default=64, help="requests decoding together")
    parser.add_argument("--prompt-len", type=positive_int, default=1024, help="tokens per prompt")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steady steps first")
    parser.add_argument("--steps", type=int, default=50, help=f"timed steps (>= {MIN_STEPS})")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a functional check, not a measurement: allows 2 to 19 timed steps",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and prompts")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument(
        "--cuda-graph",
        action="store_true",
        help="time eager and CUDA-graph steps side by side (metrics named .eager. and .graph.)",
    )
    parser.add_argument(
        "--profile-steps",
        type=positive_int,
        default=5,
        help="with --cuda-graph on CUDA: steps profiled per mode for kernel_ms",
    )
    parser.add_argument("--json", type=Path, help="write the metrics to this JSON file")
    args = parser.parse_args(argv)
    if not 1 <= args.num_spec_tokens <= 8:
        parser.error(f"--num-spec-tokens must be in 1..8, got {args.num_spec_tokens}")
    if args.warmup < 1:
        parser.error(f"--warmup must be at least 1 (the first steps compile), got {args.warmup}")
    if args.steps < 2:
        parser.error(f"--steps must be at least 2, got {args.steps}")
    if args.steps < MIN_STEPS and not args.smoke:
        parser.error(
            f"--steps must be at least {MIN_STEPS} for a measurement, got {args.steps} "
            "(--smoke allows fewer for a functional check)"
        )
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        parser.error(f"--device {args.device}: {error}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is available")
    if device.type not in ("cuda", "cpu"):
        parser.error(f"--device {args.device}: only cuda and cpu are supported")
    on_gpu = device.type == "cuda"
    if args.backend is None:
        args.backend = "triton" if on_gpu else "torch"
    if args.dtype is None:
        args.dtype = "bf16" if on_gpu else "fp32"
    if args.backend == "flashinfer" and not on_gpu:
        parser.error("--backend flashinfer needs a CUDA device")
    return args


def build_engine(args: argparse.Namespace, *, cuda_graph: bool = False) -> Any:
    """The engine with the batch added (its prompts not yet run)."""
    # Imported here: the engine pulls in triton, after main set the interpreter flag.
    import torch

    from attngroup.reference_engine.engine.llm_engine import EngineConfig, LLMEngine
    from attngroup.reference_engine.engine.request import SamplingParams

    k = args.num_spec_tokens
    max_tokens = max_tokens_for(args)
    engine = LLMEngine(
        EngineConfig(
            pair=args.pair,
            backend=args.backend,
            device=args.device,
            dtype=torch_dtype(args.dtype),
            block_size=BLOCK_SIZE,
            num_blocks=num_blocks_for(args, max_tokens),
            num_spec_tokens=k,
            seed=args.seed,
            max_num_seqs=args.batch,
            max_num_batched_tokens=max(args.batch * (k + 1), PREFILL_BUDGET),
            cuda_graph=cuda_graph,
            # Captured steps hold the longest context the run reaches.
            max_model_len=args.prompt_len + max_tokens + k + 1,
        )
    )
    vocab_size = get_model_pair(args.pair).target_config().vocab_size
    generator = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, vocab_size, (args.batch, args.prompt_len), generator=generator)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    for prompt in prompts.tolist():
        engine.add_request(prompt, params)
    return engine


def reach_steady_state(engine: Any, batch: int, k: int) -> None:
    """Step until every request of the batch decodes with ``k`` drafts."""
    limit = 4 + sum(len(r.prompt_token_ids) for r in engine.scheduler.waiting)
    for _ in range(limit):
        running = engine.scheduler.running
        if len(running) == batch and all(len(r.spec_token_ids) == k for r in running):
            return
        engine.step()
    raise NotSteadyError(f"the batch did not reach {batch} requests drafting {k} tokens")


def synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_step(
    engine: Any, batch: int, k: int, device: torch.device, *, sync: bool = True
) -> StepSample:
    """One ``LLMEngine.step``, checked to be one speculative step of the whole batch;
    ``sync``: its time includes waiting for all the device work it queued."""
    runner, stats = engine.runner.timings, engine.stats
    timings = stats.timings
    before = (
        runner.draft_forward,
        runner.target_forward,
        runner.metadata,
        timings.sampling,
        timings.device_wait,
    )
    generated, drafts = stats.num_generated_tokens, stats.spec.num_draft_tokens
    preemptions = engine.scheduler.num_preemptions
    started = time.perf_counter()
    finished = engine.step()
    if sync:
        synchronize(device)
    elapsed = time.perf_counter() - started
    verified = stats.spec.num_draft_tokens - drafts
    if finished or engine.scheduler.num_preemptions != preemptions or verified != batch * k:
        raise NotSteadyError(
            f"not a steady speculative step: {len(finished)} finished, "
            f"{engine.scheduler.num_preemptions - preemptions} preempted, {verified} drafts "
            f"verified (expected {batch} x {k})"
        )
    after = (
        runner.draft_forward,
        runner.target_forward,
        runner.metadata,
        timings.sampling,
        timings.device_wait,
    )
    draft, verify, metadata, sampling, wait = (
        1e3 * (a - b) for a, b in zip(after, before, strict=True)
    )
    return StepSample(
        step_ms=1e3 * elapsed,
        draft_ms=draft,
        verify_ms=verify,
        metadata_ms=metadata,
        sampling_ms=sampling,
        wait_ms=wait,
        tokens=stats.num_generated_tokens - generated,
    )


def time_steps(engine: Any, args: argparse.Namespace) -> list[StepSample]:
    """Fill the batch, warm up, then time ``args.steps`` steps."""
    import torch

    device = torch.device(args.device)
    k = args.num_spec_tokens
    reach_steady_state(engine, args.batch, k)
    for _ in range(args.warmup):
        timed_step(engine, args.batch, k, device)
    gc.collect()
    gc.disable()
    try:
        return [timed_step(engine, args.batch, k, device) for _ in range(args.steps)]
    finally:
        gc.enable()


def time_pipelined(engine: Any, args: argparse.Namespace) -> list[float]:
    """Milliseconds between consecutive returns of ``args.steps`` steps run back to back,
    synchronised only before the first: an engine that queues a step before reading the
    one before keeps the device fed, and this is the pace a serving loop gets from it."""
    import torch

    device = torch.device(args.device)
    synchronize(device)
    ends = [time.perf_counter()]
    gc.collect()
    gc.disable()
    try:
        for _ in range(args.steps):
            timed_step(engine, args.batch, args.num_spec_tokens, device, sync=False)
            ends.append(time.perf_counter())
    finally:
        gc.enable()
    synchronize(device)
    return [1e3 * (end - start) for start, end in itertools.pairwise(ends)]


@dataclass(frozen=True)
class DeviceProfile:
    """One profiled step's device work: its kernels (and copies, fills)."""

    kernel_ms: float  # their durations, summed
    span_ms: float  # from the first one's start to the last one's end (gaps included)
    count: int


def device_profiles(engine: Any, args: argparse.Namespace) -> list[DeviceProfile]:
    """Every kernel, copy and fill per step, over ``--profile-steps`` steps profiled with
    torch.profiler (CUDA graphs' kernels are reported one by one)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(args.device)
    per_step = []
    for _ in range(args.profile_steps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            timed_step(engine, args.batch, args.num_spec_tokens, device)
        events = [
            event for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA
        ]
        start = min(event.time_range.start for event in events)
        end = max(event.time_range.end for event in events)
        per_step.append(
            DeviceProfile(
                kernel_ms=sum(event.device_time_total for event in events) / 1e3,
                span_ms=(end - start) / 1e3,
                count=len(events),
            )
        )
    return per_step


def metrics_of(
    args: argparse.Namespace, samples: Sequence[StepSample], mode: str | None = None
) -> list[Metric]:
    prefix = metric_prefix(args) + (f".{mode}" if mode else "")
    per_step = {
        field: [getattr(sample, field) for sample in samples]
        for field in ("step_ms", "draft_ms", "verify_ms", "metadata_ms", "sampling_ms")
        + (("wait_ms",) if mode == "graph" else ())
    }
    metrics = [
        Metric(f"{prefix}.{field}", statistics.median(values), "ms", values, False)
        for field, values in per_step.items()
    ]
    rates = [1e3 * sample.tokens / sample.step_ms for sample in samples]
    lengths = [sample.tokens / args.batch for sample in samples]
    metrics.append(
        Metric(f"{prefix}.tokens_per_s", statistics.median(rates), "tokens/s", rates, True)
    )
    metrics.append(
        Metric(f"{prefix}.accepted_length", statistics.median(lengths), "tokens", lengths, True)
    )
    return metrics


def graph_over_kernels(args: argparse.Namespace, metrics: Sequence[Metric]) -> list[Metric]:
    """Each graph step over the eager step's median kernel sum (``graph_over_kernels``) and
    over the graph step's own (``graph_over_own_kernels``; target: <= 1.2)."""
    by_name = {metric.name: metric for metric in metrics}
    prefix = metric_prefix(args)
    ratios = []
    for name, step, mode in (
        ("graph_over_kernels", "step_ms", "eager"),
        ("graph_over_own_kernels", "step_ms", "graph"),
        ("pipelined_over_own_kernels", "pipelined_step_ms", "graph"),
    ):
        kernels = by_name[f"{prefix}.{mode}.kernel_ms"].value
        each = [ms / kernels for ms in by_name[f"{prefix}.graph.{step}"].samples]
        ratios.append(Metric(f"{prefix}.{name}", statistics.median(each), "x", each, False))
    return ratios


def print_summary(args: argparse.Namespace, metrics: Sequence[Metric]) -> None:
    smoke = "  (smoke run: not a measurement)" if args.smoke else ""
    print(
        f"{metric_prefix(args)} on {args.device}: {args.steps} timed steps after {args.warmup} "
        f"warm-up, prompt {args.prompt_len} tokens{smoke}"
    )
    for metric in metrics:
        median, p10, p90 = spread(metric.samples)
        label = metric.name.removeprefix(metric_prefix(args) + ".")
        print(f"  {label:<22} {median:12.3f} {metric.unit:<9} p10 {p10:12.3f}  p90 {p90:12.3f}")
    print("  (metadata_ms is host time, part of draft_ms and verify_ms)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if torch.device(args.device).type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the KV write is a Triton kernel
    modes = ("eager", "graph") if args.cuda_graph else (None,)
    metrics: list[Metric] = []
    for mode in modes:
        try:
            engine = build_engine(args, cuda_graph=mode == "graph")
        except ValueError as error:  # a configuration the engine refuses (backend, dtype, device)
            print(f"error: {error}", file=sys.stderr)
            return 2
        try:
            samples = time_steps(engine, args)
            mode_metrics = metrics_of(args, samples, mode)
            pipelined = time_pipelined(engine, args)
            mode_metrics.append(
                Metric(
                    f"{metric_prefix(args)}{f'.{mode}' if mode else ''}.pipelined_step_ms",
                    statistics.median(pipelined),
                    "ms",
                    pipelined,
                    False,
                )
            )
            if mode is not None and torch.device(args.device).type == "cuda":
                profiles = device_profiles(engine, args)
                name = f"{metric_prefix(args)}.{mode}"
                for suffix, unit, values in (
                    ("kernel_ms", "ms", [p.kernel_ms for p in profiles]),
                    ("device_span_ms", "ms", [p.span_ms for p in profiles]),
                    ("kernels", "kernels", [float(p.count) for p in profiles]),
                ):
                    mode_metrics.append(
                        Metric(f"{name}.{suffix}", statistics.median(values), unit, values, False)
                    )
        except NotSteadyError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        if mode == "graph":
            graphs = engine.runner.cuda_graphs
            print("\n".join(f"CUDA graphs: {line}" for line in graphs.plan.describe()))
            print(f"CUDA graphs: passes {dict(sorted(graphs.counts.items()))}")
            print(f"device loop: engine steps {dict(sorted(engine.device_loop.counts.items()))}")
        metrics.extend(mode_metrics)
        del engine
    if args.cuda_graph and torch.device(args.device).type == "cuda":
        metrics.extend(graph_over_kernels(args, metrics))
    print_summary(args, metrics)
    if args.json is not None:
        write_metrics(args.json, metrics)
        print(f"wrote {len(metrics)} metrics to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
