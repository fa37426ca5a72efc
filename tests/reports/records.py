"""Builders of in-memory run records for the reports tests (no pytest run needed)."""

from __future__ import annotations

import random

from attngroup.reports.record import Metric, RunRecord, TestResult

BENCH_NODEID = "attngroup/suites/kernels/test_bench.py::test_decode_latency[triton-fp32]"


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


HOSTILE_ID = (
    'attngroup/suites/grouping/test_x.py::test_groups[<script>window.injected=1</script>-"a&b"]'
)
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
            "attngroup/suites/kernels/test_k.py::test_decode[flashinfer-bf16]",
            "failed",
            fields={"backend": "flashinfer", "dtype": "bf16"},
            markers=("kernels", "gpu"),
        ),
        make_test(
            "attngroup/suites/spec_decode/test_s.py::test_greedy[gemma4-e2b-mtp-triton-fp32]",
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
            "attngroup/suites/kernels/test_k.py::test_decode[flashinfer-bf16]",
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
    "changed_files": ["attngroup/kernels/<evil>.py"],
    "steps": [
        {
            "key": "grouping",
            "label": "Grouping <script>window.injected=4</script>",
            "selected": True,
            "why": ["attngroup/kernels/<evil>.py matches attngroup/kernels/"],
        },
        {"key": "spec-decode", "label": "Spec decode", "selected": False, "why": []},
    ],
}


MATRIX_PAIRS = ("gemma4-e2b-mtp", "gemma4-e4b-mtp", "llama3-eagle", "qwen3-mtp")
SPEC_DECODE_CASES = (  # backend, dtype, outcome on a CPU machine
    ("torch", "fp32", "passed"),
    ("triton", "fp32", "passed"),
    ("torch", "bf16", "skipped"),
    ("flashinfer", "bf16", "skipped"),
)
SKIPPED_KERNEL_TESTS = 30  # one cell with more tests than a tooltip ever held
HAZARD_TESTS = 8


def matrix_run() -> RunRecord:
    """A run shaped like the suites': pairs x areas x backends x dtypes, plus pair-less tests.

    ``llama3-eagle``'s grouping case fails; the merged-group hazard tests carry both the
    grouping and the kernels marker; 30 FlashInfer kernel tests without a pair all skip, as
    do ``qwen3-mtp``'s HF parity tests (its only ones).
    """

    def case(nodeid: str, outcome: str = "passed", markers=("grouping",), **fields: str):
        return make_test(nodeid, outcome, fields=fields, markers=markers)

    tests = [
        *(
            case(
                f"attngroup/suites/spec_decode/test_greedy_identity.py::test_spec_decode_greedy"
                f"[{pair}-{backend}-{dtype}-k{k}]",
                outcome,
                markers=("spec_decode", "mtp"),
                pair=pair,
                backend=backend,
                dtype=dtype,
            )
            for pair in MATRIX_PAIRS
            for backend, dtype, outcome in SPEC_DECODE_CASES
            for k in (1, 3)
        ),
        *(
            case(
                f"attngroup/suites/grouping/test_grouping_conformance.py::test_groups[{pair}-tp{tp}]",
                "failed" if (pair, tp) == ("llama3-eagle", 2) else "passed",
                pair=pair,
                tp=str(tp),
            )
            for pair in MATRIX_PAIRS
            for tp in (1, 2)
        ),
        *(
            case(
                f"attngroup/suites/kernels/test_merged_group_hazard.py::test_merged_group_hazard[{i}]",
                markers=("gpu", "grouping", "kernels", "mtp"),
                pair="gemma4-e2b-mtp",
                backend="triton",
                dtype="fp32",
            )
            for i in range(HAZARD_TESTS)
        ),
        *(
            case(
                f"attngroup/suites/kernels/test_flashinfer.py::test_flashinfer_decode[case{i}]",
                "skipped",
                markers=("kernels", "gpu"),
                backend="flashinfer",
                dtype="bf16",
            )
            for i in range(SKIPPED_KERNEL_TESTS)
        ),
        *(
            case(
                f"attngroup/suites/kernels/test_step_metadata.py::test_second_step_matches_the_reference[{p}]",
                markers=("kernels",),
            )
            for p in ("large-then-small", "small-then-large", "padding-reset-after-fuller-step")
        ),
        *(
            case(
                f"attngroup/suites/hf_parity/test_hf_parity.py::test_target_logits_match_transformers"
                f"[qwen3-mtp-{backend}]",
                "skipped",
                markers=("hf_parity", "mtp"),
                pair="qwen3-mtp",
                backend=backend,
                dtype="bf16",
            )
            for backend in ("torch", "triton")
        ),
        case("attngroup/suites/engine_units/test_scheduler.py::test_chunked_prefill", markers=()),
        case("tests/ci/test_select.py::test_attention_change_selects_spec_decode", markers=()),
    ]
    return make_run(*tests, run_id="matrix")
