"""Runs the attention benchmark's cases through the backends on a device: caches, the
engine's builders and implementations, the oracle check, timings and their metrics.

Imported by ``attngroup.benchmarks.bench_attention`` once its arguments are parsed: loading it
loads torch, Triton and the kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import groupby
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Triton runs on the CPU only under its interpreter, chosen when kernels are defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from attngroup.benchmarks.attention_cases import BLOCK_SIZE, KV_BYTES_PER_ELEMENT, Case, cases
from attngroup.benchmarks.backend_names import MAX_RELATIVE_ERROR, PEERS
from attngroup.benchmarks.case_launch import triton_path
from attngroup.benchmarks.flashinfer_sweep import config_slug, configs_for, table_choice
from attngroup.benchmarks.metrics import Metric, write_metrics
from attngroup.benchmarks.run_record import RecordWriter
from attngroup.benchmarks.timing import (
    COPY_BYTES,
    Timing,
    copy_bandwidth,
    cuda_graph_replay,
    l2_flush_buffer,
    time_interleaved,
)
from attngroup.benchmarks.vllm_triton_peer import (
    VllmTritonPeerBackend,
    missing_reason,
    split_kv_path,
)
from attngroup.kernels.attention_oracle import paged_attention_reference
from attngroup.kernels.backend import AttentionBackend, AttentionLayerParams
from attngroup.kernels.backends.flashinfer_attn import WrapperChoice
from attngroup.kernels.metadata import CommonAttentionMetadata, cdiv
from attngroup.kernels.ops.triton_launch_config import INTERPRETED
from attngroup.kernels.registry import get_backend
from attngroup.reference_engine.kv_cache_spec import FullAttentionSpec

# bf16, as engines serve; float32 under Triton's interpreter, whose tl.dot on bf16 is wrong (our
# kernel casts its operands there, vLLM's does not: a bf16 check would judge the interpreter).
DTYPE = torch.float32 if INTERPRETED else torch.bfloat16
PEER_BACKENDS: dict[str, type[AttentionBackend]] = {"vllm-triton": VllmTritonPeerBackend}
CHECKED_REQUESTS = 2  # requests per case compared with the oracle (its cost grows with context)


def layer_params(case: Case) -> AttentionLayerParams:
    """The one attention layer a case runs."""
    return AttentionLayerParams(
        name=f"{case.shape_name}.{case.mode}",
        num_heads_q=case.num_heads_q,
        num_kv_heads=case.shape.num_kv_heads,
        head_size=case.shape.head_size,
        sm_scale=case.shape.head_size**-0.5,
    )


@dataclass(frozen=True)
class KVCache:
    """One paged cache (``DTYPE``) and a shuffled block table, shared by a shape's modes."""

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_table: torch.Tensor

    @classmethod
    def random(cls, case: Case, device: torch.device, seed: int = 0) -> KVCache:
        generator = torch.Generator(device=device).manual_seed(seed)
        blocks_per_request = cdiv(case.context_len, BLOCK_SIZE)
        num_blocks = case.batch_size * blocks_per_request + 1  # + the null block 0
        shape = (num_blocks, BLOCK_SIZE, case.shape.num_kv_heads, case.shape.head_size)
        key_cache = torch.randn(shape, generator=generator, device=device, dtype=DTYPE)
        value_cache = torch.randn(shape, generator=generator, device=device, dtype=DTYPE)
        order = torch.randperm(num_blocks - 1, generator=generator, device=device) + 1
        table = order.reshape(case.batch_size, blocks_per_request).to(torch.int32)
        return cls(key_cache, value_cache, table)


def step_metadata(case: Case, block_table: torch.Tensor, device) -> CommonAttentionMetadata:
    return CommonAttentionMetadata.from_seq_lens(
        [case.context_len] * case.batch_size,
        [case.query_len] * case.batch_size,
        block_table,
        BLOCK_SIZE,
        device,
    )


def kv_cache_spec(case: Case) -> FullAttentionSpec:
    shape = case.shape
    return FullAttentionSpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=shape.num_kv_heads,
        head_size=shape.head_size,
        dtype=DTYPE,
    )


@dataclass(frozen=True)
class BackendRun:
    backend: str
    run: Callable[[], torch.Tensor]  # launches the kernel only
    output: torch.Tensor
    path: str  # what the backend chose for this batch


def prepare(
    backend_name: str, case: Case, common, cache: KVCache, query, device, **options
) -> BackendRun:
    """Builder, build and impl as the engine does them; ``run`` launches only the kernel.
    ``options`` go to the builder (``wrapper_choice`` for FlashInfer's sweep)."""
    backend = backend_class(backend_name)
    layer = layer_params(case)
    builder = backend.get_builder_cls()(
        kv_cache_spec(case),
        [layer],
        device,
        max_num_seqs=case.batch_size,
        max_query_len=case.query_len,
        **options,
    )
    metadata = builder.build(common)
    impl = backend.get_impl_cls()(layer)
    output = torch.full_like(query, float("nan"))

    def run() -> torch.Tensor:
        return impl.forward(query, cache.key_cache, cache.value_cache, metadata, output)

    return BackendRun(backend_name, run, output, describe_path(backend_name, case, metadata))


def backend_class(name: str) -> type[AttentionBackend]:
    """An engine backend from the registry, or a benchmark-only peer."""
    return PEER_BACKENDS.get(name) or get_backend(name)


def describe_path(backend_name: str, case: Case, metadata) -> str:
    if backend_name == "flashinfer":
        return metadata.choice.describe()
    if backend_name == "vllm-triton":
        return f"vllm-{split_kv_path(metadata, case.num_heads_q, case.shape.num_kv_heads)}"
    return triton_path(case, metadata.seq_threshold_3d)


def check_against_oracle(run: BackendRun, case: Case, common, cache: KVCache, query) -> float:
    """Relative error of the first requests' rows against the float32 oracle."""
    num_requests = min(CHECKED_REQUESTS, case.batch_size)
    num_tokens = num_requests * case.query_len
    head = common.unpadded(num_tokens, num_requests)
    expected = paged_attention_reference(
        query[:num_tokens],
        cache.key_cache,
        cache.value_cache,
        query_start_loc=head.query_start_loc,
        seq_lens=head.seq_lens,
        block_table=head.block_table,
        sm_scale=layer_params(case).sm_scale,
        compute_dtype=torch.float32,
    )
    actual = run.output[:num_tokens].float()
    return float((actual - expected).norm() / expected.norm())


def backend_metrics(case: Case, run: BackendRun, timing: Timing, copy_bw: float) -> list[Metric]:
    prefix = f"{case.name}.{run.backend}"
    bandwidths = [case.kv_bytes / (sample * 1e-6) / 1e12 for sample in timing.samples_us]
    kv_bw = case.kv_bytes / (timing.median_us * 1e-6)
    return [
        Metric(f"{prefix}.latency", timing.median_us, "us", list(timing.samples_us), False),
        Metric(f"{prefix}.kv_read_bandwidth", kv_bw / 1e12, "TB/s", bandwidths, True),
        Metric(f"{prefix}.fraction_of_copy_bandwidth", kv_bw / copy_bw, "ratio", [], True),
    ]


def print_row(
    case: Case, run: BackendRun, timing: Timing | None, copy_bw: float | None, note: str = ""
) -> None:
    text = f"{case.name:<44} {run.backend:<10} {run.path:<34}"
    if timing is None:
        kv_bytes = case.kv_bytes // KV_BYTES_PER_ELEMENT * DTYPE.itemsize
        print(f"{text} ran once (KV {kv_bytes / 1e6:.3f} MB, {DTYPE}){note}", flush=True)
        return
    assert copy_bw is not None, "a timed run has the copy bandwidth measured before it"
    kv_bw = case.kv_bytes / (timing.median_us * 1e-6)
    print(
        f"{text} {timing.median_us:9.1f} us  p10 {timing.percentile_us(10):9.1f}  "
        f"p90 {timing.percentile_us(90):9.1f}  {kv_bw / 1e12:5.2f} TB/s  "
        f"{kv_bw / copy_bw:6.1%} of copy{note}",
        flush=True,
    )


@dataclass(frozen=True)
class CaseLaunch:
    """One launch of a case: a backend's, or (``config``) one FlashInfer configuration of the
    sweep, whose fastest correct one is the peer ``flashinfer``."""

    run: BackendRun
    config: WrapperChoice | None = None

    @property
    def key(self) -> str:
        return self.run.backend if self.config is None else f"flashinfer:{config_slug(self.config)}"


CANNOT_RUN = (RuntimeError, ValueError, NotImplementedError)
"""What a FlashInfer configuration raises for a case it cannot run (printed, then left out)."""


def prepare_launches(
    backend_names: Sequence[str], case: Case, common, cache: KVCache, query, device
) -> list[CaseLaunch]:
    """Every backend's launch of the case; for FlashInfer, every configuration that can run
    it (``flashinfer_sweep``)."""
    launches = []
    for name in backend_names:
        if name != "flashinfer":
            launches.append(CaseLaunch(prepare(name, case, common, cache, query, device)))
            continue
        for config in configs_for(case):
            try:
                run = prepare(
                    "flashinfer", case, common, cache, query, device, wrapper_choice=config
                )
            except CANNOT_RUN as error:
                print(
                    f"{case.name} flashinfer {config.describe()}: cannot run: {error}",
                    file=sys.stderr,
                )
                continue
            launches.append(CaseLaunch(run, config))
    return launches


def oracle_errors(
    launches: Sequence[CaseLaunch], case: Case, common, cache: KVCache, query
) -> dict[str, float]:
    """Each launch run once on a NaN-poisoned output and its relative error against the
    oracle (NaN where an element was left unwritten); a FlashInfer configuration that raises
    is printed and left out, any other launch's error propagates."""
    errors = {}
    for launch in launches:
        launch.run.output.fill_(float("nan"))
        try:
            launch.run.run()
        except CANNOT_RUN as error:
            if launch.config is None:
                raise
            print(
                f"{case.name} flashinfer {launch.config.describe()}: cannot run: {error}",
                file=sys.stderr,
            )
            continue
        errors[launch.key] = check_against_oracle(launch.run, case, common, cache, query)
    return errors


def flashinfer_at_its_best(
    case: Case,
    launches: Sequence[CaseLaunch],
    errors: Mapping[str, float],
    timings: Mapping[str, Timing],
    copy_bw: float | None,
) -> tuple[CaseLaunch | None, list[Metric]]:
    """The sweep's fastest correct configuration (the first correct one when nothing was
    timed; None when none was correct) and the per-configuration metrics
    (``flashinfer.config_SLUG_latency`` and ``_error``, and the backend table's choice over the
    best as ``flashinfer.table_choice_over_best``)."""
    metrics: list[Metric] = []
    prefix = f"{case.name}.flashinfer"
    swept = [launch for launch in launches if launch.config is not None and launch.key in errors]
    for launch in swept:
        assert launch.config is not None  # the sweep's launches carry their configuration
        slug = config_slug(launch.config)
        error, timing = errors[launch.key], timings.get(launch.key)
        metrics.append(Metric(f"{prefix}.config_{slug}_error", error, "ratio", [], False))
        if timing is not None:
            samples = list(timing.samples_us)
            metrics.append(
                Metric(f"{prefix}.config_{slug}_latency", timing.median_us, "us", samples, False)
            )
        note = "" if error < MAX_RELATIVE_ERROR else f"  WRONG (relative error {error:.2e})"
        print_row(case, replace(launch.run, backend="fi-config"), timing, copy_bw, note)
    correct = [launch for launch in swept if errors[launch.key] < MAX_RELATIVE_ERROR]
    if not correct:
        return None, metrics
    best = min(correct, key=lambda launch: _median(timings, launch.key))
    chosen = next((launch for launch in swept if launch.config == table_choice(case)), None)
    if chosen is not None and chosen.key in timings and best.key in timings:
        ratio = timings[chosen.key].median_us / timings[best.key].median_us
        metrics.append(Metric(f"{prefix}.table_choice_over_best", ratio, "ratio", [], False))
    return best, metrics


def _median(timings: Mapping[str, Timing], key: str) -> float:
    return timings[key].median_us if key in timings else 0.0


def graph_replays(
    args: argparse.Namespace,
    case: Case,
    chosen: Mapping[str, CaseLaunch],
    common,
    cache: KVCache,
    query: torch.Tensor,
    flush: torch.Tensor | None,
    copy_bw: float | None,
) -> tuple[list[Metric], bool]:
    """Each chosen launch replayed from a CUDA graph: checked against the oracle on a poisoned
    output, then (unless --dry-run) the replays timed in interleaved rounds like the eager
    launches; returns the metrics and whether every replay was captured and matched."""
    replays: dict[str, Callable[[], None]] = {}
    metrics: list[Metric] = []
    ok = True
    for name, launch in chosen.items():
        try:
            replay = cuda_graph_replay(launch.run.run)
        except RuntimeError as capture_error:  # a launch that cannot be captured: a failed case
            print(
                f"{case.name} {name}: CUDA graph capture failed: {capture_error}", file=sys.stderr
            )
            ok = False
            continue
        launch.run.output.fill_(float("nan"))
        replay()
        relative_error = check_against_oracle(launch.run, case, common, cache, query)
        metrics.append(
            Metric(f"{case.name}.{name}.graph_relative_error", relative_error, "ratio", [], False)
        )
        if not relative_error < MAX_RELATIVE_ERROR:
            print(
                f"{case.name} {name} (CUDA graph): relative error {relative_error:.2e}",
                file=sys.stderr,
            )
            ok = False
        replays[name] = replay
    timings: dict[str, Timing] = {}
    if not args.dry_run and replays:
        assert flush is not None, "runs that are timed have an L2 flush buffer"
        timings = time_interleaved(replays, total_runs=args.runs, warmup=args.warmup, flush=flush)
    for name in replays:
        timing = timings.get(name)
        if timing is not None:
            samples = list(timing.samples_us)
            metrics.append(
                Metric(f"{case.name}.{name}.graph_latency", timing.median_us, "us", samples, False)
            )
        run = chosen[name].run
        print_row(case, replace(run, path=f"{run.path} graph"), timing, copy_bw)
    return metrics, ok


def ratio_metrics(case: Case, timings: dict[str, Timing]) -> list[Metric]:
    """Triton's median latency over each timed peer's and over the fastest peer's."""
    if "triton" not in timings:
        return []
    triton = timings["triton"]
    peers = {name: timings[name] for name in PEERS if name in timings}
    metrics = []
    for name, peer in peers.items():
        ratio = triton.median_us / peer.median_us
        low = triton.percentile_us(10) / peer.percentile_us(90)
        high = triton.percentile_us(90) / peer.percentile_us(10)
        print(f"{case.name:<44} triton/{name} {ratio:.2f} (p10/p90 spread {low:.2f}-{high:.2f})")
        metrics.append(Metric(f"{case.name}.triton_over_{name}", ratio, "ratio", [], False))
    if peers:
        best = min(peers, key=lambda name: peers[name].median_us)
        ratio = triton.median_us / peers[best].median_us
        print(f"{case.name:<44} triton/best peer ({best}) {ratio:.2f}")
        metrics.append(Metric(f"{case.name}.triton_over_best_peer", ratio, "ratio", [], False))
    return metrics


def available(backend_names: Sequence[str], device: torch.device) -> list[str]:
    return [name for name in backend_names if backend_class(name).is_available(device)]


def run_cases(
    args: argparse.Namespace, device: torch.device, record: RecordWriter | None = None
) -> tuple[list[Metric], int]:
    """Time (or, for --dry-run, run once) every case; returns the metrics and the exit status.

    Per case every launch (each backend, each FlashInfer configuration) is first run once and
    checked against the oracle, then all are timed together in interleaved rounds
    (``time_interleaved``), so no backend is the one always timed first."""
    metrics: list[Metric] = []
    status = 0
    flush = copy_bw = None
    if not args.dry_run:
        flush = l2_flush_buffer(device)
        copy_timing, copy_bw = copy_bandwidth(
            device, warmup=args.warmup, runs=args.runs, flush=flush
        )
        print(f"device-to-device copy: {copy_bw / 1e12:.2f} TB/s ({torch.cuda.get_device_name()})")
        samples = [2 * COPY_BYTES / (sample * 1e-6) / 1e12 for sample in copy_timing.samples_us]
        metrics.append(Metric("device.copy_bandwidth", copy_bw / 1e12, "TB/s", samples, True))
    backend_names = available(args.backends, device)
    for name in sorted(set(args.backends) - set(backend_names)):
        why = missing_reason() if name == "vllm-triton" else None
        print(
            f"skipping {name}: not available on {device}{f' ({why})' if why else ''}",
            file=sys.stderr,
        )
    torch.manual_seed(0)
    for case, cache in cases_with_caches(args, device):
        query = torch.randn(
            case.batch_size * case.query_len,
            case.num_heads_q,
            case.shape.head_size,
            device=device,
            dtype=DTYPE,
        )
        common = step_metadata(case, cache.block_table, device)
        launches = prepare_launches(backend_names, case, common, cache, query, device)
        errors = oracle_errors(launches, case, common, cache, query)
        launches = [launch for launch in launches if launch.key in errors]
        timings: dict[str, Timing] = {}
        if not args.dry_run:
            assert flush is not None, "runs that are timed have an L2 flush buffer"
            timings = time_interleaved(
                {launch.key: launch.run.run for launch in launches},
                total_runs=args.runs,
                warmup=args.warmup,
                flush=flush,
            )
        best, sweep_metrics = flashinfer_at_its_best(case, launches, errors, timings, copy_bw)
        metrics.extend(sweep_metrics)
        chosen = {launch.key: launch for launch in launches if launch.config is None}
        if "flashinfer" in backend_names:
            if best is None:
                print(
                    f"{case.name} flashinfer: no configuration matched the oracle", file=sys.stderr
                )
                status = 1
            else:
                chosen["flashinfer"] = best
        chosen = {name: chosen[name] for name in backend_names if name in chosen}
        backend_timings = {}
        for name, launch in chosen.items():
            error, timing = errors[launch.key], timings.get(launch.key)
            metrics.append(Metric(f"{case.name}.{name}.relative_error", error, "ratio", [], False))
            if not error < MAX_RELATIVE_ERROR:
                print(f"{case.name} {name}: relative error {error:.2e}", file=sys.stderr)
                status = 1
            print_row(case, launch.run, timing, copy_bw)
            if timing is not None:
                assert copy_bw is not None, "runs that are timed have the copy bandwidth"
                backend_timings[name] = timing
                metrics.extend(backend_metrics(case, launch.run, timing, copy_bw))
        metrics.extend(ratio_metrics(case, backend_timings))
        if args.cuda_graph:
            graph_metrics, graph_ok = graph_replays(
                args, case, chosen, common, cache, query, flush, copy_bw
            )
            metrics.extend(graph_metrics)
            status = status if graph_ok else 1
        # after every case: a run cut short keeps what it measured
        write_outputs(args, metrics, record)
    return metrics, status


def cases_with_caches(args: argparse.Namespace, device) -> Iterator[tuple[Case, KVCache]]:
    """Each case with its cache, allocated once per run of cases of one (shape, context)."""
    all_cases = cases(args.quick, args.tiny, args.shapes, args.contexts, args.modes)
    for _, same_cache in groupby(all_cases, key=lambda case: (case.shape_name, case.context_name)):
        sharing = list(same_cache)
        cache = KVCache.random(sharing[0], device)
        for case in sharing:
            yield case, cache


def write_outputs(
    args: argparse.Namespace, metrics: list[Metric], record: RecordWriter | None
) -> None:
    if args.json is not None:
        write_metrics(args.json, metrics)
    if record is not None:
        record.write([metric.as_json() for metric in metrics])


def record_writer(path: Path | None, device: torch.device) -> RecordWriter | None:
    if path is None:
        return None
    return RecordWriter(path, "attngroup/benchmarks/bench_attention.py", device)
