"""The JSON contracts between packages (``schemas/``): each schema is valid draft 2020-12,
strict enough to refuse a planted wrong type or missing key in a real writer's output,
and the committed results still match; real ``ci select --json`` output feeds the report.

The writers' own tests validate the output of each real run against its schema
(``assert_matches_schema`` in tests/ci, tests/reports and the benchmark tests); the
fixtures here produce one small real output per schema to plant faults in.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from jsonschema import Draft202012Validator

from attngroup.benchmarks import bench_metadata
from attngroup.benchmarks.tuning import sweep as tune_attention
from attngroup.bugzoo.__main__ import main as bugzoo_main
from attngroup.reference_engine.__main__ import main as engine_main
from attngroup.reports.cli import EXIT_OK
from attngroup.reports.cli import main as reports_main
from attngroup.reports.compare import compare_runs
from attngroup.reports.record import load_record, read_json_file, write_record
from attngroup.reports.selection import load_selection
from tests.ci.helpers import commit_all, git, init_repo, run_cli, write_tree
from tests.ci.test_ci_changes import AREAS
from tests.ci.test_ci_deps import PLANTED
from tests.json_schemas import (
    MISSING,
    SCHEMA_DIR,
    SCHEMAS,
    assert_file_matches_schema,
    assert_matches_schema,
    assert_refuses_planted_fault,
    fault_id,
    schema_path,
)
from tests.reports.records import make_run, make_test
from tests.test_bugzoo import SOURCE, entry, make_patch, make_repo, write_entries
from tests.test_pairs_cli import E2B

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "attngroup" / "benchmarks" / "results"
COMMITTED_SWEEP = RESULTS / "h200-2026-12-02-tune-verify-d512.json"
COMMITTED_AB = RESULTS / "h200-2026-12-04-kernel-ab.json"


def test_schema_folder_holds_exactly_the_contracts() -> None:
    assert sorted(path.name for path in SCHEMA_DIR.glob("*.json")) == sorted(
        schema_path(name).name for name in SCHEMAS
    )


@pytest.mark.parametrize("name", SCHEMAS)
def test_schema_is_valid_draft_2020_12(name: str) -> None:
    schema = json.loads(schema_path(name).read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def _committed_results() -> list[Any]:
    params = []
    for path in sorted([*RESULTS.rglob("*.json"), *RESULTS.rglob("*.json.gz")]):
        data = read_json_file(path, "committed result")
        if isinstance(data, dict) and "schema" in data:
            name = "run-record"
        elif isinstance(data, list):
            name = "benchmark-metrics"
        elif isinstance(data, dict) and "candidates" in data:
            name = "benchmark-ab-attention"
        else:
            name = "benchmark-tune-attention"
        params.append(pytest.param(path, name, id=str(path.relative_to(RESULTS))))
    return params


@pytest.mark.parametrize(("path", "name"), _committed_results())
def test_committed_results_match_their_schema(path: Path, name: str) -> None:
    """Records, metric lists and sweep reports written by earlier versions (on the GPU)
    still match the contract."""
    assert_matches_schema(read_json_file(path, "committed result"), name)


def _select_repo(root: Path) -> Path:
    """A change to a kernel file: spec-decode selected, docs not."""
    repo = init_repo(root, AREAS)
    git(repo, "checkout", "-q", "-b", "feature")
    write_tree(repo, {"kernels/registry.py": "NAMES = {'triton': 1}\n"})
    commit_all(repo, "backend change")
    return repo


def _printed_json(main, argv: list[str], exit_code: int) -> Any:
    """What an in-process ``main(argv)`` prints to stdout, parsed; its exit code checked."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == exit_code
    return json.loads(stdout.getvalue())


def _zoo_results(root: Path) -> Any:
    """``python -m bugzoo --json`` on a tiny repository with one caught patch."""
    repo = make_repo(root)
    caught = make_patch(repo, "subtracts", SOURCE.replace("a + b", "a - b"))
    zoo = write_entries(repo, [entry("subtracts", caught)])
    results = root / "zoo.json"
    with contextlib.redirect_stdout(io.StringIO()):
        argv = ["--root", str(repo), "--zoo", str(zoo), "-n", "0", "--json", str(results)]
        assert bugzoo_main(argv) == 0
    return json.loads(results.read_text())


@pytest.fixture(scope="module")
def real_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One small real output of every writer, by output name (``SCHEMA`` or
    ``SCHEMA@VARIANT`` where a writer has several modes). ``reference_engine generate``'s
    summary is checked by its own test (suites/spec_decode/test_generate_cli.py): an engine
    run is too slow to repeat here."""
    root = tmp_path_factory.mktemp("writers")
    outputs: dict[str, Any] = {}
    metrics, record = root / "metrics.json", root / "record.json"
    argv = ["--device", "cpu", "--batch", "2", "--context-len", "40", "--runs", "2"]
    assert bench_metadata.main([*argv, "--json", str(metrics), "--record", str(record)]) == 0
    outputs["benchmark-metrics"] = json.loads(metrics.read_text())
    outputs["run-record"] = json.loads(record.read_text())
    repo = _select_repo(root / "select")
    selected = run_cli("select", "--repo", str(repo), "--base", "main", "--head", "HEAD", "--json")
    outputs["ci-select"] = json.loads(selected.stdout)
    planted = init_repo(root / "deps", PLANTED)
    cache = ["--cache-dir", str(root / "cache")]
    report = run_cli("check-deps", "--repo", str(planted), "--json", *cache)
    outputs["ci-check-deps"] = json.loads(report.stdout)
    baseline = root / "deps-baseline.json"
    run_cli("check-deps", "--repo", str(planted), "--write-baseline", str(baseline), *cache)
    outputs["ci-check-deps-baseline"] = json.loads(baseline.read_text())
    assert outputs["ci-check-deps-baseline"]["steps"], "the planted gap must be recorded"
    git(planted, "checkout", "-q", "-b", "change")
    write_tree(planted, {"kernels/common.py": "X = 2\n"})
    commit_all(planted, "change a kernel helper")
    missed = run_cli("check-deps", "--repo", str(planted), "--base", "main", "--json", *cache)
    outputs["ci-check-deps@missed"] = json.loads(missed.stdout)
    assert outputs["ci-check-deps@missed"]["missed"], "the planted change must miss a step"
    outputs["reports-comparison"] = _comparison(root, record)
    legacy = ["inspect", "gemma4-e4b-mtp", "--policy", "legacy", "--tp", "2", "--json"]
    outputs["reference-engine-inspect"] = _printed_json(engine_main, legacy, exit_code=1)
    configs = ["inspect", *E2B, "--json"]
    outputs["reference-engine-inspect@configs"] = _printed_json(engine_main, configs, exit_code=0)
    outputs["bugzoo-results"] = _zoo_results(tmp_path_factory.mktemp("zoo"))
    # tune_attention needs CUDA: its real output here is a committed sweep from an H200
    outputs["benchmark-tune-attention"] = json.loads(COMMITTED_SWEEP.read_text())
    outputs["benchmark-ab-attention"] = json.loads(COMMITTED_AB.read_text())
    return outputs


def _comparison(root: Path, record: Path) -> dict[str, Any]:
    """``reports compare --json`` of the benchmark record against a baseline whose one test
    failed and whose metric was 10 % faster."""
    baseline = json.loads(record.read_text())
    baseline.update(run_id="baseline")
    baseline["tests"][0].update(outcome="failed", message="relative error 0.1")
    for metric in baseline["metrics"]:
        metric["value"] *= 0.9
        metric["samples"] = [sample * 0.9 for sample in metric["samples"]]
    baseline_path = root / "baseline.json"
    baseline_path.write_text(json.dumps(baseline))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        reports_main(["compare", "--run", str(record), "--baseline", str(baseline_path), "--json"])
    document = json.loads(stdout.getvalue())
    assert document["fixed"] and document["metrics"], document
    return document


# (output, path to the planted key, value or MISSING, schema) ; the path's last part is
# the key or index that is replaced or deleted.
FAULTS = [
    ("run-record", ("kind",), MISSING),
    ("run-record", ("kind",), "nightly"),
    ("run-record", ("schema_version",), "2"),
    ("run-record", ("duration_s",), "1.5 s"),
    ("run-record", ("duration_s",), -1.5),
    ("run-record", ("tests", 0, "duration_s"), -0.25),
    ("run-record", ("environment", "device"), ["H200"]),
    ("run-record", ("tests", 0, "nodeid"), MISSING),
    ("run-record", ("tests", 0, "outcome"), "maybe"),
    ("run-record", ("tests", 0, "fields"), {"pair": 3}),
    ("run-record", ("metrics", 0, "samples"), ["1.0"]),
    ("run-record", ("metrics", 0, "higher_is_better"), MISSING),
    ("benchmark-metrics", (0, "value"), "12.5"),
    ("benchmark-metrics", (0, "value"), -12.5),
    ("benchmark-metrics", (0, "samples"), [12.5, -1.0]),
    ("benchmark-metrics", (0, "unit"), MISSING),
    ("benchmark-metrics", (0, "samples"), [None]),
    ("benchmark-metrics", (0, "higher_is_better"), 0),
    ("ci-select", ("steps",), MISSING),
    ("ci-select", ("run_all",), "false"),
    ("ci-select", ("changed_files",), "kernels/registry.py"),
    ("ci-select", ("steps", 0, "selected"), 1),
    ("ci-select", ("steps", 0, "key"), MISSING),
    ("ci-check-deps", ("summary",), MISSING),
    ("ci-check-deps", ("ok",), "false"),
    ("ci-check-deps", ("steps", 0, "gaps", "static"), "2"),
    ("ci-check-deps", ("steps", 0, "gaps", "static"), -2),
    ("ci-check-deps", ("summary", "steps"), -1),
    ("ci-check-deps", ("steps", 0, "test_files"), -1),
    ("ci-check-deps", ("steps", 0, "add", 0, "kind"), "dynamic"),
    ("ci-check-deps@missed", ("missed", 0, "chain"), "a.py -> b.py"),
    ("ci-check-deps@missed", ("missed", 0, "step"), MISSING),
    ("ci-check-deps-baseline", ("format",), "ci-check-deps-baseline/2"),
    ("ci-check-deps-baseline", ("orphan_tests",), MISSING),
    ("ci-check-deps-baseline", ("steps", "spec-mtp", "entries"), "kernels/"),
    ("ci-check-deps-baseline", ("steps", "spec-mtp", "problems"), MISSING),
    ("reports-comparison", ("regression",), MISSING),
    ("reports-comparison", ("fixed", 0, "current"), "green"),
    ("reports-comparison", ("fixed", 0, "fields"), []),
    ("reports-comparison", ("metrics", 0, "verdict"), "worse"),
    ("reports-comparison", ("metrics", 0, "threshold"), None),
    ("reference-engine-inspect", ("error",), MISSING),
    ("reference-engine-inspect", ("tp",), "2"),
    ("reference-engine-inspect", ("policy",), "strict"),
    ("reference-engine-inspect", ("kv_cache_groups", 0, "spec", "block_size"), "16"),
    ("reference-engine-inspect", ("kv_cache_groups", 0, "attention_groups", 0, "num_heads_q"), 0),
    ("reference-engine-inspect", ("kv_cache_groups", 0, "attention_groups", 0, "backend"), MISSING),
    ("reference-engine-inspect", ("kv_cache_groups", 0, "layers"), []),
    ("reference-engine-inspect@configs", ("scaling", 0, "model"), "assistant"),
    ("reference-engine-inspect@configs", ("scaling", 0, "tiny"), MISSING),
    ("benchmark-tune-attention", ("verify.gemma4-e2b-full-d512.b64x8k", 0, "median_us"), "357"),
    ("benchmark-tune-attention", ("verify.gemma4-e2b-full-d512.b64x8k", 0, "heuristic"), MISSING),
    ("benchmark-tune-attention", ("verify.gemma4-e2b-full-d512.b64x8k", 0, "config"), "fastest"),
    (
        "benchmark-tune-attention",
        ("verify.gemma4-e2b-full-d512.b64x8k", 0, "config", "num_warps"),
        MISSING,
    ),
    ("benchmark-ab-attention", ("cases", "decode.gemma4-e2b-sliding-d256.b64x8k", 0, "correct"), 1),
    (
        "benchmark-ab-attention",
        ("cases", "decode.gemma4-e2b-sliding-d256.b64x8k", 1, "p90_us"),
        MISSING,
    ),
    ("benchmark-ab-attention", ("candidates", 0, "options", "value_splits"), "2"),
    ("benchmark-ab-attention", ("device",), MISSING),
    ("bugzoo-results", ("load_average",), [0.5, 0.4, 0.3]),
    ("bugzoo-results", ("baseline", "id"), "unpatched"),
    ("bugzoo-results", ("entries", 0, "caught"), "yes"),
    ("bugzoo-results", ("entries", 0, "seconds"), -1.0),
    ("bugzoo-results", ("baseline", "seconds"), -0.5),
    ("bugzoo-results", ("entries", 0, "output_tail"), MISSING),
]


@pytest.mark.parametrize(
    ("output", "path", "value"),
    FAULTS,
    ids=[f"{output}-{fault_id(path, value)}" for output, path, value in FAULTS],
)
def test_schema_refuses_a_planted_fault(real_outputs, output: str, path: tuple, value) -> None:
    schema = output.partition("@")[0]
    assert_refuses_planted_fault(real_outputs[output], schema, path, value)


def test_every_real_output_has_a_planted_fault(real_outputs) -> None:
    """No writer's output is left out of the fault table (generate's is in its own test)."""
    assert {output for output, _, _ in FAULTS} == set(real_outputs)


def test_real_select_output_feeds_the_report(tmp_path: Path) -> None:
    """``python -m ci select --json`` (a real subprocess) -> ``reports build --selection``:
    the docs test that CI did not run is "not selected", not "removed"."""
    repo = _select_repo(tmp_path / "repo")
    selected = subprocess.run(
        [
            sys.executable,
            "-m",
            "attngroup.ci",
            "select",
            "--repo",
            str(repo),
            "--base",
            "main",
            "--json",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert selected.returncode == 0, selected.stderr
    selection_file = tmp_path / "selection.json"
    selection_file.write_text(selected.stdout)
    assert_matches_schema(json.loads(selected.stdout), "ci-select")

    selection = load_selection(selection_file)
    assert (selection.step("spec-decode").selected, selection.step("docs").selected) == (
        True,
        False,
    )
    spec = make_test("suites/spec/test_mtp.py::test_greedy", step="spec-decode")
    docs = make_test("docs/test_links.py::test_links", step="docs")
    baseline = write_record(make_run(spec, docs, run_id="base"), tmp_path / "base.json")
    current = write_record(make_run(spec), tmp_path / "run.json")
    comparison = compare_runs(load_record(current), load_record(baseline), selection=selection)
    assert [change.nodeid for change in comparison.not_selected] == [docs.nodeid]
    assert comparison.removed_tests == ()

    report = tmp_path / "report.html"
    argv = ["build", "--run", str(current), "--baseline", str(baseline)]
    assert reports_main([*argv, "--selection", str(selection_file), "-o", str(report)]) == EXIT_OK
    section = report.read_text(encoding="utf-8").split('<section id="selection">')[1]
    section = section.split("</section>")[0]
    assert "<code>spec-decode</code>" in section and "<code>docs</code>" in section
    assert "&#39;kernels/registry.py&#39; matches dependency &#39;kernels/&#39;" in section
    assert "<code>kernels/registry.py</code>" in section


def _config_schemas() -> dict[str, dict[str, Any]]:
    """The launch-config object of each benchmark schema that records one."""
    tune = json.loads(schema_path("benchmark-tune-attention").read_text(encoding="utf-8"))
    ab = json.loads(schema_path("benchmark-ab-attention").read_text(encoding="utf-8"))
    tune_config = tune["additionalProperties"]["items"]["properties"]["config"]["oneOf"][1]
    return {
        "benchmark-tune-attention": tune_config,
        "benchmark-ab-attention": ab["$defs"]["config"],
    }


RETIRED_CONFIG_FIELDS = {
    # h100-2026-12-05-fused-merge-ab.json, -launch-options-ab.json, -verify-register-cap-ab.json
    "benchmark-ab-attention": {"fused_merge", "programmatic_launch", "reload_query"},
}
"""``LaunchConfig`` fields a committed result file holds that the class no longer has."""


@pytest.mark.parametrize("name", ["benchmark-tune-attention", "benchmark-ab-attention"])
def test_every_launch_config_field_is_in_the_schema(name: str) -> None:
    """The sweep and the A/B write ``LaunchConfig`` whole: a new field must reach the schema
    (checked here on the CPU; their runs, which validate the files, need the GPU)."""
    from dataclasses import asdict

    from attngroup.kernels.ops.triton_launch_config import LaunchConfig

    config = asdict(LaunchConfig(16, 16, 4, 3, 2, max_registers=168, tma_kv=True))
    schema = _config_schemas()[name]
    retired = RETIRED_CONFIG_FIELDS.get(name, set())
    assert set(schema["properties"]) == set(config) | retired
    assert not retired & set(config), "a retired field is back: drop it from the list"
    assert not list(Draft202012Validator(schema).iter_errors(config))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tune_attention_sweep_matches_its_schema(tmp_path: Path) -> None:
    """The smallest sweep the CLI allows: one case, the launcher's choice and one config."""
    report = tmp_path / "tune.json"
    one_config = ["--tile-sizes", "64", "--num-warps", "4", "--num-stages", "2"]
    argv = ["--shapes", "llama3-8b-d128", "--modes", "decode", "--runs", "2", *one_config]
    with contextlib.redirect_stdout(io.StringIO()):
        assert tune_attention.main([*argv, "--num-segments", "16", "--json", str(report)]) == 0
    assert_file_matches_schema(report, "benchmark-tune-attention")
    (results,) = json.loads(report.read_text()).values()
    assert [result["heuristic"] for result in results].count(True) == 1
