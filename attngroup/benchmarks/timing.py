"""GPU timing with CUDA events and a cold L2, and the device-to-device copy bandwidth.

Each timed run starts after a write to a buffer larger than the L2 (60 MB on the
H200), so no run reads the previous run's KV from cache; the flush itself is
outside the timed interval. A spin kernel then keeps the GPU busy while the host
enqueues the timed launch, so the interval holds the kernels' time only: without it,
a launch whose Python work outlasts the flush (about 70 us) is timed with the host's
gap in front of it, as the H200 showed (Gemma 4 e2b draft at 64 x 8k: 193.9 us median,
p10 172.1, p90 212.1 eager against 147.9 us replayed from a CUDA graph). Host launch
cost is what ``bench_attention --cuda-graph`` and the engine's step timings measure.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024
COPY_BYTES = 1024 * 1024 * 1024
HOST_LEAD_CYCLES = 1_000_000
"""GPU clock cycles the spin kernel waits before each timed run (about 0.5 ms on the H200),
longer than any backend's host-side launch work."""


@dataclass(frozen=True)
class Timing:
    """Per-run latencies in microseconds."""

    samples_us: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.samples_us) < 2:
            raise ValueError("a timing needs at least two samples")

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    def percentile_us(self, percent: float) -> float:
        """Linear-interpolated percentile (``percent`` in 0..100)."""
        cut_points = statistics.quantiles(self.samples_us, n=100, method="inclusive")
        if percent <= 0:
            return min(self.samples_us)
        if percent >= 100:
            return max(self.samples_us)
        return cut_points[round(percent) - 1]


def time_cuda(run: Callable[[], object], *, warmup: int, runs: int, flush: torch.Tensor) -> Timing:
    """Time ``run`` ``runs`` times after ``warmup`` untimed calls, flushing L2 before each and
    starting each interval with the run's kernels already enqueued (see the module docstring)."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()
        torch.cuda._sleep(HOST_LEAD_CYCLES)
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return Timing(
        tuple(start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends, strict=True))
    )


INTERLEAVED_ROUNDS = 5
"""Rounds of ``time_interleaved``: each launch's timed runs are split over them."""
ROUND_WARMUP = 2
"""Untimed runs before each round's timed ones after the first round (the first takes the
caller's warm-up)."""

Key = TypeVar("Key", bound=Hashable)


class Timer(Protocol):
    def __call__(
        self, run: Callable[[], object], *, warmup: int, runs: int, flush: torch.Tensor
    ) -> Timing: ...


def time_interleaved(
    launches: Mapping[Key, Callable[[], object]],
    *,
    total_runs: int,
    warmup: int,
    flush: torch.Tensor,
    rounds: int = INTERLEAVED_ROUNDS,
    timer: Timer = time_cuda,
) -> dict[Key, Timing]:
    """Each launch timed in ``rounds`` rounds of ``ceil(total_runs / rounds)`` runs, the order
    of the launches rotated by one each round, their samples joined into one ``Timing`` each.

    Timed one backend after the other, our kernel timed first in each case ran up to 2.9 us
    (0.8 %) slower than when timed after FlashInfer on the H100
    (``h100-2026-12-05-flashinfer-first-matrix.txt`` against ``-head512-graph-matrix.txt``);
    rotating the order in rounds spreads such drift over every launch alike, as
    ``tuning.ab`` does for its variants.
    """
    if rounds < 1 or total_runs < max(rounds, 2):
        raise ValueError(
            f"need rounds >= 1 and total_runs >= max(rounds, 2); got {rounds}, {total_runs}"
        )
    runs_per_round = -(-total_runs // rounds)
    keys = list(launches)
    samples: dict[Key, list[float]] = {key: [] for key in keys}
    for round_index in range(rounds):
        shift = round_index % len(keys) if keys else 0
        for key in keys[shift:] + keys[:shift]:
            round_warmup = warmup if round_index == 0 else ROUND_WARMUP
            timing = timer(launches[key], warmup=round_warmup, runs=runs_per_round, flush=flush)
            samples[key].extend(timing.samples_us)
    return {key: Timing(tuple(values)) for key, values in samples.items()}


def cuda_graph_replay(run: Callable[[], object]) -> Callable[[], None]:
    """``run`` captured once into a CUDA graph; the returned callable replays its kernels
    without the host-side launch work, as an engine's decode graph does. ``run`` must launch
    on fixed tensors and never sync; it runs once on a side stream first (compiles, lazy
    allocations), as torch's capture requires."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    return torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)


def copy_bandwidth(
    device: torch.device, *, warmup: int, runs: int, flush: torch.Tensor
) -> tuple[Timing, float]:
    """The device-to-device copy's latency and its bandwidth in bytes/s (read + write)."""
    source = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    timing = time_cuda(lambda: target.copy_(source), warmup=warmup, runs=runs, flush=flush)
    return timing, 2 * COPY_BYTES / (timing.median_us * 1e-6)
