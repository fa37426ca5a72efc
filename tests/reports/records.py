"""Builders of in-memory run records for the reports tests (no pytest run needed)."""

from __future__ import annotations

import random

from reports.record import Metric, RunRecord, TestResult

BENCH_NODEID = "suites/kernels/test_bench.py::test_decode_latency[triton-fp32]"


def make_test(nodeid: str, outcome: str = "passed", **changes: object) -> TestResult:
    return TestResult(nodeid=nodeid, outcome=outcome, duration_s=0.01, **changes)


def make_run(
    *tests: TestResult,
    metrics: tuple[Metric, ...] = (),
    run_id: str = "current",
    created_at: str = "2026-12-02T00:00:00+00:00",
    environment: dict[str, object] | None = None,
    kind: str = "pytest",
) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        created_at=created_at,
        duration_s=1.5,
        exit_status=0,
        kind=kind,
        environment=environment or {"git_sha": f"{run_id}0000000000", "engine": "reference"},
        tests=tests,
        metrics=metrics,
    )


def noisy_samples(center: float, relative_noise: float, count: int, seed: int) -> tuple[float, ...]:
    """Fresh timing-like samples: ``center`` with Gaussian relative noise."""
    rng = random.Random(seed)
    return tuple(center * (1 + rng.gauss(0, relative_noise)) for _ in range(count))


def make_metric(
    samples: tuple[float, ...] = (),
    value: float | None = None,
    name: str = "decode_latency",
    unit: str = "ms",
    **changes: object,
) -> Metric:
    typical = value if value is not None else sorted(samples)[len(samples) // 2]
    return Metric(
        name=name, nodeid=BENCH_NODEID, value=typical, unit=unit, samples=samples, **changes
    )


HOSTILE_ID = 'suites/grouping/test_x.py::test_groups[<script>window.injected=1</script>-"a&b"]'
HOSTILE_MESSAGE = '<img src=x onerror="window.injected=2"> builder planned 8 heads, got 4'


def hostile_history() -> tuple[RunRecord, RunRecord]:
    """A baseline and a run whose test ids, messages and parameters carry markup."""
    fields = {
        "pair": "gemma4-e2b-mtp",
        "backend": "triton",
        "dtype": "fp32",
        "policy": "<b>bold</b>",
    }
    baseline = make_run(
        make_test(HOSTILE_ID, fields=fields, markers=("grouping",)),
        make_test(
            "suites/kernels/test_k.py::test_decode[flashinfer-bf16]",
            "failed",
            fields={"backend": "flashinfer", "dtype": "bf16"},
            markers=("kernels", "gpu"),
        ),
        make_test(
            "suites/spec_decode/test_s.py::test_greedy[gemma4-e2b-mtp-triton-fp32]",
            fields={"pair": "gemma4-e2b-mtp", "backend": "triton", "dtype": "fp32"},
            markers=("spec_decode", "mtp"),
            step="spec-decode",
        ),
        metrics=(make_metric(noisy_samples(1.0, 0.02, 12, seed=5)),),
        run_id="baseline",
        created_at="2026-12-01T00:00:00+00:00",
        environment={"git_sha": "b" * 40, "engine": "reference", "device": "<i>CPU</i>"},
    )
    current = make_run(
        make_test(
            HOSTILE_ID,
            "failed",
            fields=fields,
            markers=("grouping",),
            message=HOSTILE_MESSAGE,
            details="Traceback </pre><script>window.injected=3</script>",
        ),
        make_test(
            "suites/kernels/test_k.py::test_decode[flashinfer-bf16]",
            "passed",
            fields={"backend": "flashinfer", "dtype": "bf16"},
            markers=("kernels", "gpu"),
        ),
        metrics=(make_metric(noisy_samples(1.2, 0.02, 12, seed=6)),),
        environment={"git_sha": "c" * 40, "engine": "reference", "device": "<i>CPU</i>"},
    )
    return baseline, current


HOSTILE_SELECTION = {
    "base": "main",
    "head": "HEAD",
    "run_all": False,
    "reason": "paths <u>changed</u>",
    "changed_files": ["kernels/<evil>.py"],
    "steps": [
        {
            "key": "grouping",
            "label": "Grouping <script>window.injected=4</script>",
            "selected": True,
            "why": ["kernels/<evil>.py matches kernels/"],
        },
        {"key": "spec-decode", "label": "Spec decode", "selected": False, "why": []},
    ],
}
