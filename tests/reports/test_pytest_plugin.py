"""The run-record pytest plugin: what it records, when it writes, and xdist merging.

Inner pytest runs disable plugin autoloading and load ``attngroup.reports.pytest_plugin`` (and
xdist) explicitly: fast, and independent of whether the project is pip-installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from attngroup.reports.pytest_plugin import METRIC_PROPERTY, _TestProgress
from attngroup.reports.record import RunRecord, TestResult, load_record
from tests.json_schemas import assert_file_matches_schema
from tests.pytest_subprocess import PYTEST

REPO_ROOT = Path(__file__).resolve().parents[2]
PLUGIN = (
    "-p",
    "attngroup.reports.pytest_plugin",
    "-W",
    "ignore::pytest.PytestAssertRewriteWarning",
)

SAMPLE_CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--engine", default="reference")
"""
SAMPLE_INI = """
[pytest]
markers =
    grouping: grouping checks
    kernels: kernel checks
"""
SAMPLE_TESTS = """
import pytest


class Pair:  # a named object, like a ModelPair
    def __init__(self, name):
        self.name = name


class Dtype:  # prints like a torch dtype, without importing torch
    def __str__(self):
        return "torch.bfloat16"


@pytest.mark.grouping
@pytest.mark.parametrize("tp", [1, 2], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("dtype", [Dtype()])
@pytest.mark.parametrize("model_pair", [Pair("gemma4-e2b-mtp")], ids=["gemma4-e2b-mtp"])
@pytest.mark.parametrize("backend", ["triton"])
def test_grouping(backend, model_pair, dtype, tp):
    assert tp == 1, "split-KV scratch sized for 8 heads, got 4"


@pytest.mark.kernels
@pytest.mark.parametrize("case", ["flashinfer-fp16-tp2"], ids=lambda case: case)
def test_id_tokens(case):
    pass


@pytest.mark.kernels
@pytest.mark.parametrize("backend_dtype", [("flashinfer", Dtype())], ids=["flashinfer-bf16"])
def test_compound(backend_dtype):
    pass


def test_metric(record_metric):
    import fractions  # any numbers.Real counts, as numpy scalars do

    record_metric("decode_latency", 1.0, "ms", samples=[1.0, fractions.Fraction(11, 10), 0.9])
    record_metric("throughput", 900.0, "tokens/s", threshold=0.1)


def test_skipped():
    pytest.skip("needs a CUDA device")


@pytest.mark.xfail(reason="known LEGACY bug")
def test_xfailed():
    assert False


@pytest.mark.xfail(reason="fixed upstream")
def test_xpassed():
    pass


@pytest.fixture
def broken():
    raise RuntimeError("fixture exploded")


def test_error(broken):
    pass


def test_deselected():
    pass
"""


def clean_environment(environ: dict[str, str]) -> dict[str, str]:
    """No autoloaded plugins, no inherited record path or CI variables; reports importable."""
    environment = {
        k: v
        for k, v in environ.items()
        if k != "ATTENTION_GROUPING_RUN_RECORD" and not k.startswith("BUILDKITE_")
    }
    environment["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), environ.get("PYTHONPATH")])
    )
    return environment


@pytest.fixture
def isolated(pytester, monkeypatch):
    """pytester whose inner runs see a clean environment (see clean_environment)."""
    cleaned = clean_environment(dict(os.environ))
    for name in set(os.environ) - cleaned.keys():
        monkeypatch.delenv(name)
    for name, value in cleaned.items():
        monkeypatch.setenv(name, value)
    return pytester


@pytest.fixture
def inner(isolated):
    """An isolated pytester holding the sample suite."""
    isolated.makeconftest(SAMPLE_CONFTEST)
    isolated.makeini(SAMPLE_INI)
    isolated.makepyfile(test_sample=SAMPLE_TESTS)
    return isolated


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory) -> tuple[RunRecord, Path]:
    """One run of the sample suite (in a subprocess, shared by the content checks)."""
    folder = tmp_path_factory.mktemp("sample")
    (folder / "conftest.py").write_text(SAMPLE_CONFTEST)
    (folder / "pytest.ini").write_text(SAMPLE_INI)
    (folder / "test_sample.py").write_text(SAMPLE_TESTS)
    environment = clean_environment(dict(os.environ))
    environment.update(BUILDKITE_COMMIT="f" * 40, BUILDKITE_BRANCH="fix/grouping")
    completed = subprocess.run(
        [
            *PYTEST,
            *PLUGIN,
            "--run-record",
            "out/run.json",
            "--junitxml",
            "out/junit.xml",
            "--ci-step",
            "grouping",
            "-k",
            "not deselected",
        ],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 1, completed.stdout + completed.stderr
    return load_record(folder / "out" / "run.json"), folder / "out" / "junit.xml"


def recorded_test(record: RunRecord, name: str) -> TestResult:
    """The one recorded test whose function name starts with ``name``."""
    [test] = [test for test in record.tests if test.nodeid.split("::")[1].startswith(name)]
    return test


@pytest.mark.parametrize(
    ("name", "outcome", "message"),
    [
        ("test_grouping[triton-gemma4-e2b-mtp-dtype0-tp1]", "passed", None),
        (
            "test_grouping[triton-gemma4-e2b-mtp-dtype0-tp2]",
            "failed",
            "split-KV scratch sized for 8 heads",
        ),
        ("test_skipped", "skipped", "needs a CUDA device"),
        ("test_xfailed", "xfailed", "known LEGACY bug"),
        ("test_xpassed", "xpassed", "fixed upstream"),
        ("test_error", "error", "RuntimeError: fixture exploded"),
        ("test_deselected", "deselected", None),
    ],
)
def test_outcome_and_message(sample_run, name, outcome, message):
    test = recorded_test(sample_run[0], name)
    assert test.outcome == outcome
    if message is None:
        assert test.message is None
    else:
        assert message in test.message


def test_record_matches_its_schema(sample_run):
    """Every outcome, a metric, parameters and fields: the record as the plugin wrote it."""
    assert_file_matches_schema(sample_run[1].with_name("run.json"), "run-record")


def test_failure_keeps_the_traceback(sample_run):
    test = recorded_test(sample_run[0], "test_grouping[triton-gemma4-e2b-mtp-dtype0-tp2]")
    assert "assert tp == 1" in test.details


@pytest.mark.parametrize(
    ("name", "fields", "markers"),
    [
        pytest.param(
            "test_grouping[triton-gemma4-e2b-mtp-dtype0-tp2]",
            {"backend": "triton", "dtype": "bf16", "tp": "2", "engine": "reference"},
            ("grouping",),
            id="from-params-never-a-pair",
        ),
        pytest.param(
            "test_id_tokens",
            {"dtype": "fp16", "tp": "2", "engine": "reference"},
            ("kernels",),
            id="from-id-tokens",
        ),
        pytest.param(
            "test_compound",
            {"backend": "flashinfer", "dtype": "bf16", "engine": "reference"},
            ("kernels",),
            id="from-compound-parameter",
        ),
        pytest.param("test_deselected", {"engine": "reference"}, (), id="deselected"),
    ],
)
def test_parametrization_split_into_fields(sample_run, name, fields, markers):
    test = recorded_test(sample_run[0], name)
    assert dict(test.fields) == fields
    assert test.markers == markers
    assert test.step == "grouping"


def test_raw_params_are_recorded(sample_run):
    test = recorded_test(sample_run[0], "test_grouping[triton-gemma4-e2b-mtp-dtype0-tp1]")
    assert dict(test.params) == {
        "backend": "triton",
        "model_pair": "gemma4-e2b-mtp",
        "dtype": "torch.bfloat16",
        "tp": 1,
    }


def test_metrics_recorded_through_the_fixture(sample_run):
    metrics = {metric.name: metric for metric in sample_run[0].metrics}
    assert metrics["decode_latency"].samples == (1.0, 1.1, 0.9)
    assert metrics["decode_latency"].higher_is_better is False
    assert metrics["throughput"].higher_is_better is True
    assert metrics["throughput"].threshold == 0.1
    assert {metric.nodeid for metric in metrics.values()} == {"test_sample.py::test_metric"}


def test_environment(sample_run):
    record = sample_run[0]
    environment = record.environment
    assert environment["git_sha"] == "f" * 40
    assert environment["git_branch"] == "fix/grouping"
    assert environment["engine"] == "reference"
    assert environment["ci_step"] == "grouping"
    assert {
        "torch",
        "triton",
        "transformers",
        "flashinfer",
        "device",
        "python",
    } <= environment.keys()
    assert environment["device"]
    assert record.exit_status == 1


def test_junit_xml_for_ci_views(sample_run):
    root = ElementTree.parse(sample_run[1]).getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 9  # every test that ran; the deselected one is absent
    [metric_case] = [case for case in cases if case.get("name") == "test_metric"]
    values = [
        json.loads(p.get("value"))
        for p in metric_case.iter("property")
        if p.get("name") == METRIC_PROPERTY
    ]
    assert {value["name"] for value in values} == {"decode_latency", "throughput"}


def test_inert_unless_asked(inner):
    result = inner.runpytest(*PLUGIN)
    result.assert_outcomes(passed=5, failed=1, skipped=1, xfailed=1, xpassed=1, errors=1)
    assert list(inner.path.rglob("*.json")) == []
    assert "run record:" not in result.stdout.str()


def test_record_written_when_asked(inner):
    result = inner.runpytest(*PLUGIN, "--run-record", "out/run.json")
    written = sorted(path.relative_to(inner.path).as_posix() for path in inner.path.rglob("*.json"))
    assert written == ["out/run.json"]  # the folder is created
    record = load_record(inner.path / written[0])
    assert (record.kind, len(record.tests)) == ("pytest", 10)
    result.stdout.fnmatch_lines(["run record: *out/run.json"])


def test_environment_variable_and_ini_option_do_not_ask(inner, monkeypatch):
    """Only --run-record asks: nothing else makes every run overwrite a record."""
    monkeypatch.setenv("ATTENTION_GROUPING_RUN_RECORD", "out/from-environment.json")
    inner.makeini(SAMPLE_INI + "run_record = out/from-ini.json\n")
    inner.runpytest(*PLUGIN)
    assert list(inner.path.rglob("*.json")) == []


GOOD_RECORD = '{"kept": true}'


@pytest.mark.parametrize(
    ("arguments", "conftest"),
    [
        pytest.param(["--collect-only"], "", id="collect-only"),
        pytest.param(
            [],
            "import pytest\n\n"
            "def pytest_collection_modifyitems(config, items):\n"
            "    raise pytest.UsageError('--shard 3/2: INDEX must be in [0, COUNT)')\n",
            id="usage-error-like-shard-3-of-2",
        ),
    ],
)
def test_no_record_without_a_run(inner, arguments, conftest):
    """--collect-only and a usage error leave an earlier record as it was."""
    if conftest:
        inner.makeconftest(SAMPLE_CONFTEST + conftest)
    (inner.path / "out").mkdir()
    (inner.path / "out" / "run.json").write_text(GOOD_RECORD)
    result = inner.runpytest(*PLUGIN, "--run-record", "out/run.json", *arguments)
    assert (inner.path / "out" / "run.json").read_text() == GOOD_RECORD
    assert "run record:" not in result.stdout.str()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        pytest.param("folder", "is a directory", id="a-directory"),
        pytest.param("file.txt/run.json", "is a file, not a directory", id="under-a-file"),
    ],
)
def test_bad_record_path_is_a_usage_error_before_any_test(inner, path, message):
    (inner.path / "folder").mkdir()
    (inner.path / "file.txt").write_text("x")
    result = inner.runpytest(*PLUGIN, "--run-record", path)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--run-record: output*{message}*"])
    assert "passed" not in result.stdout.str()


CASE_TESTS = """
import pytest


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("pair", ["gemma4-e2b-mtp", "large-then-small"])
def test_unmarked(pair, backend):
    pass


@pytest.mark.case(pair="qwen3-mtp", backend="torch", dtype="float32", tp=2)
@pytest.mark.parametrize("pair", ["large-then-small"])
def test_marked(pair):
    pass


@pytest.mark.parametrize(
    "pair", [pytest.param("small-then-large", marks=pytest.mark.case(dtype="fp16"))]
)
@pytest.mark.parametrize("backend", ["triton"])
def test_marked_by_its_param(pair, backend):
    pass
"""


def test_only_the_case_marker_names_a_pair(isolated):
    """A marked test's fields are its marker's, whatever its parameters are called; an
    unmarked one keeps the guessed backend, never a guessed pair."""
    isolated.makepyfile(test_cases=CASE_TESTS)
    isolated.runpytest_subprocess(*PLUGIN, "--strict-markers", "--run-record", "run.json")
    fields = {
        test.nodeid.split("::")[1]: dict(test.fields)
        for test in load_record(isolated.path / "run.json").tests
    }
    assert fields == {
        "test_unmarked[gemma4-e2b-mtp-triton]": {"backend": "triton"},
        "test_unmarked[large-then-small-triton]": {"backend": "triton"},
        "test_marked[large-then-small]": {
            "pair": "qwen3-mtp",
            "backend": "torch",
            "dtype": "fp32",
            "tp": "2",
        },
        "test_marked_by_its_param[triton-small-then-large]": {"dtype": "fp16"},
    }


def test_case_marker_with_an_unknown_field_is_a_usage_error(isolated):
    isolated.makepyfile("import pytest\n\n@pytest.mark.case(model='x')\ndef test_x():\n    pass\n")
    result = isolated.runpytest(*PLUGIN, "--run-record", "run.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*@pytest.mark.case takes keywords pair, backend*; got model*"])
    assert not (isolated.path / "run.json").exists()


@pytest.mark.parametrize(
    ("call", "error"),
    [
        pytest.param(
            'record_metric("t", float("nan"), "ms")',
            "value must be a finite number",
            id="nan-value",
        ),
        pytest.param(
            'record_metric("t", 1.0, "ms", samples=[1.0, "fast"])',
            "sample must be a finite number",
            id="text-sample",
        ),
        pytest.param('record_metric("", 1.0, "ms")', "non-empty string", id="empty-name"),
        pytest.param(
            'record_metric("t", 1.0, "ms", threshold=0)',
            "threshold must be positive",
            id="zero-threshold",
        ),
        pytest.param(
            'record_metric("t", 1.0, "ms"); record_metric("t", 2.0, "ms")',
            "already recorded",
            id="duplicate",
        ),
    ],
)
def test_record_metric_rejects_bad_values(isolated, call, error):
    isolated.makepyfile(f"def test_bad(record_metric):\n    {call}\n")
    result = isolated.runpytest(*PLUGIN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{error}*"])


def test_collection_error_is_recorded(isolated):
    isolated.makepyfile(test_broken="import not_a_module_anywhere\n")
    isolated.runpytest(*PLUGIN, "--run-record", "run.json")
    [test] = load_record(isolated.path / "run.json").tests
    assert (test.nodeid, test.outcome) == ("test_broken.py", "error")
    assert "not_a_module_anywhere" in test.details


def test_xdist_workers_are_merged(inner, sample_run):
    result = inner.runpytest(
        *PLUGIN,
        "-p",
        "xdist.plugin",
        "-n",
        "2",
        "--run-record",
        "out/run.json",
        "-k",
        "not deselected",
    )
    result.assert_outcomes(passed=4, failed=1, skipped=1, xfailed=1, xpassed=1, errors=1)
    merged = load_record(inner.path / "out" / "run.json")
    single = sample_run[0]

    def summary(record: RunRecord) -> dict:
        return {
            test.nodeid: (test.outcome, dict(test.fields), test.markers) for test in record.tests
        }

    assert summary(merged) == summary(single)
    assert [(m.name, m.samples) for m in merged.metrics] == [
        (m.name, m.samples) for m in single.metrics
    ]
    assert merged.environment["device"]


def make_report(outcome: str, when: str) -> pytest.TestReport:
    longrepr = None if outcome == "passed" else "AssertionError: rows differ"
    return pytest.TestReport("a.py::t", ("a.py", 1, "t"), {}, outcome, longrepr, when, duration=0.5)


def test_reruns_are_kept_as_attempts():
    """pytest-rerunfailures reports a failed attempt as outcome 'rerun', then runs again."""
    progress = _TestProgress("a.py::t")
    for outcome, when in [
        ("passed", "setup"),
        ("rerun", "call"),
        ("passed", "setup"),
        ("passed", "call"),
        ("passed", "teardown"),
    ]:
        progress.add(make_report(outcome, when))
    assert progress.attempts == ["failed"]
    assert progress.outcome == "passed"
    assert progress.duration_s == pytest.approx(2.5)


def _run_planted(tmp_path: Path, source: str, workers: list[str]) -> RunRecord:
    """``source`` as a test file, run by pytest with the plugin (and ``workers``), which must
    fail (the planted tests do); its run record."""
    (tmp_path / "test_planted.py").write_text(source)
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", *PLUGIN, *workers, "-p", "no:cacheprovider",
         "--run-record", "run.json"],
        cwd=tmp_path, env=clean_environment(dict(os.environ)), capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert completed.returncode == 1, completed.stdout + completed.stderr
    return load_record(tmp_path / "run.json")


PLANTED_ADAPTER_ERROR = """
from attngroup.suites.engines.base import AdapterError


def test_adapter_broke():
    raise AdapterError("adapter error in attention grouping: KeyError: 'x'", ("File a.py",))


def test_engine_failed():
    assert "vLLM's verdict" == "pass"
"""


@pytest.mark.parametrize(
    "workers", [[], ["-p", "xdist.plugin", "-n", "2"]], ids=["one-process", "xdist"]
)
def test_a_planted_adapter_error_is_recorded_as_adapter_error(tmp_path, workers):
    """An adapter's harness error is its own outcome, never the engine's failure."""
    record = _run_planted(tmp_path, PLANTED_ADAPTER_ERROR, workers)
    outcomes = {test.nodeid.split("::")[1]: test.outcome for test in record.tests}
    assert outcomes == {"test_adapter_broke": "adapter_error", "test_engine_failed": "failed"}
    assert_file_matches_schema(tmp_path / "run.json", "run-record")


PLANTED_OUT_OF_MEMORY = """
import pytest
import torch

# As the H100 raised them when 14 xdist workers shared its 80 GB.
OUT_OF_MEMORY = {
    "torch-allocator": torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 has a total capacity of 79.18 GiB"
    ),
    "torch-cuda-runtime": torch.AcceleratorError("CUDA error: out of memory"),
    "triton-launch": RuntimeError("Triton Error [CUDA]: out of memory"),
}


@pytest.mark.parametrize("kind", sorted(OUT_OF_MEMORY))
def test_out_of_memory(kind):
    raise OUT_OF_MEMORY[kind]


@pytest.fixture
def caches():
    raise OUT_OF_MEMORY["torch-allocator"]


def test_out_of_memory_in_setup(caches):
    pass


def test_wrong_result():
    raise RuntimeError("out of tolerance: relative error 0.3 against the oracle")
"""


@pytest.mark.parametrize(
    ("workers", "harness"), [([], False), (["-p", "xdist.plugin", "-n", "2"], True)],
    ids=["one-process", "xdist"],
)  # fmt: skip
def test_gpu_out_of_memory_under_shared_workers_is_a_harness_error(tmp_path, workers, harness):
    """Workers sharing one GPU that run it out of memory are the run's fault: an adapter
    error saying so, never the engine's failure; alone on the device, a test that runs out of
    memory has failed."""
    record = _run_planted(tmp_path, PLANTED_OUT_OF_MEMORY, workers)
    tests = {test.nodeid.split("::")[1]: test for test in record.tests}
    assert tests.pop("test_wrong_result").outcome == "failed"
    assert len(tests) == 4
    for name, test in tests.items():
        if harness:
            assert test.outcome == "adapter_error", name
            assert test.message is not None
            assert test.message.startswith(
                "harness error: GPU out of memory with 2 pytest-xdist workers sharing the GPU"
            ), test.message
            assert "out of memory" in test.message.split("(-n): ", 1)[1]
        else:
            assert test.outcome in ("failed", "error"), name
    assert_file_matches_schema(tmp_path / "run.json", "run-record")
