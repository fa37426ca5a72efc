"""From a step's shell commands to pytest invocations in repository terms."""

from __future__ import annotations

import pytest

from ci.pytest_commands import CommandParseError, PytestRun, pytest_runs

VLLM_SHARDS = """\
case "$$BUILDKITE_PARALLEL_JOB" in
  0)
    TARGET_TEST_SUITE=L4 pytest basic_correctness/ -v -s -m 'distributed(num_gpus=2)'
    ;;
  1)
    pytest -v models/test_x.py::test_a --deselect models/test_x.py::test_a[slow]
    ;;
esac"""

CASES = {
    "vllm-working-dir": (
        ("export X=1", "pytest -v -s -m 'not slow_test' v1/spec_decode"),
        "/vllm-workspace/tests",
        [
            PytestRun(
                "pytest -v -s -m not slow_test v1/spec_decode",
                "tests",
                ("tests/v1/spec_decode",),
                markers="(not slow_test)",
            )
        ],
    ),
    "python-m-pytest-and-keyword": (
        ('python -m pytest suites/spec_decode -k "mtp and not eagle" -x',),
        None,
        [
            PytestRun(
                "python -m pytest suites/spec_decode -k mtp and not eagle -x",
                ".",
                ("suites/spec_decode",),
                keyword="(mtp and not eagle)",
            )
        ],
    ),
    "cd-carries-over-and-ignore": (
        ("cd suites && python -m pytest kernels --ignore kernels/test_slow.py", "pytest ../tests"),
        None,
        [
            PytestRun(
                "python -m pytest kernels --ignore kernels/test_slow.py",
                "suites",
                ("suites/kernels",),
                ignore=("suites/kernels/test_slow.py",),
            ),
            PytestRun("pytest ../tests", "suites", ("tests",)),
        ],
    ),
    "shell-case-shards-and-deselect": (
        (VLLM_SHARDS,),
        "/vllm-workspace/tests",
        [
            PytestRun(
                "TARGET_TEST_SUITE=L4 pytest basic_correctness/ -v -s -m distributed(num_gpus=2)",
                "tests",
                ("tests/basic_correctness",),
                markers="(distributed(num_gpus=2))",
            ),
            PytestRun(
                "pytest -v models/test_x.py::test_a --deselect models/test_x.py::test_a[slow]",
                "tests",
                ("tests/models/test_x.py::test_a",),
                deselect=("tests/models/test_x.py::test_a[slow]",),
            ),
        ],
    ),
    "not-pytest": (("echo pytest is great", "bash run.sh pytest"), None, []),
}


@pytest.mark.parametrize(("commands", "working_dir", "expected"), CASES.values(), ids=CASES.keys())
def test_pytest_runs(commands, working_dir, expected):
    assert pytest_runs(commands, working_dir, "/vllm-workspace") == expected


@pytest.mark.parametrize(
    ("commands", "working_dir", "message"),
    [
        (("pytest 'unclosed",), None, "cannot parse shell command"),
        (("pytest x",), "/elsewhere/tests", "lies outside the repository"),
        (("cd ../.. && pytest x",), None, "lies outside the repository"),
        (("pytest -k",), None, "option -k needs a value"),
    ],
    ids=["unbalanced-quote", "working-dir-outside-workspace", "cd-outside", "dangling-option"],
)
def test_unusable_commands_are_reported(commands, working_dir, message):
    with pytest.raises(CommandParseError, match=message):
        pytest_runs(commands, working_dir, "/vllm-workspace")
