"""From a step's shell commands to pytest invocations in repository terms."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from attngroup.ci.deps.test_inventory import collected_files, missing_targets, selected_tests
from attngroup.ci.selection.pytest_commands import (
    CommandParseError,
    PytestRun,
    pytest_runs,
    resolve_run,
)
from attngroup.ci.selection.pytest_options import repository_options
from tests.ci.helpers import write_tree

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
    "outside-the-repository-without-pytest": (("bash /vllm-workspace/check.sh",), "/", []),
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


REPO_ROOT = Path(__file__).resolve().parents[2]


def test_this_projects_own_options_are_discovered():
    """conftest.py's --shard and the pytest11 plugin's --run-record / --ci-step take values."""
    options = repository_options(REPO_ROOT)
    assert all(options.arity(name) for name in ("--shard", "--run-record", "--ci-step"))
    assert options.arity("-k") and "-x" in options.flags  # pytest's own, read the same way


def test_readme_shard_command_has_no_missing_path():
    command = "python -m pytest attngroup/suites --shard $BUILDKITE_PARALLEL_JOB/$BUILDKITE_PARALLEL_JOB_COUNT"
    (run,) = pytest_runs((command,), None, None)
    assert missing_targets(REPO_ROOT, run) == []
    assert resolve_run(run, REPO_ROOT).paths == ("attngroup/suites",)


VLLM_LIKE = {
    "conftest.py": """\
        def pytest_addoption(parser):
            parser.addoption("--models", nargs="+", help="models")
            group = parser.getgroup("vllm")
            group.addoption("--optimized", action="store_true")
        """,
    "tests/kernels/test_fused_moe.py": "def test_moe():\n    pass\n",
    "tests/kernels/test_fused_quant.py": "def test_quant():\n    pass\n",
    "tests/kernels/test_other.py": "def test_other():\n    pass\n",
    "tests/tool_use/test_tools.py": "def test_tool():\n    pass\n",
}


@pytest.fixture
def vllm_like(tmp_path):
    write_tree(tmp_path, VLLM_LIKE)
    return tmp_path


@pytest.mark.parametrize(
    ("command", "paths"),
    [
        (
            "pytest -v kernels/test_fused_*.py",
            ("tests/kernels/test_fused_moe.py", "tests/kernels/test_fused_quant.py"),
        ),
        ("pytest tool_use --models llama3.2 qwen3", ("tests/tool_use",)),
        ("pytest --optimized tool_use/test_tools.py", ("tests/tool_use/test_tools.py",)),
        ("pytest -sv -n2 -p no:cacheprovider kernels", ("tests/kernels",)),
        ("pytest kernels/test_nope_*.py", ("tests/kernels/test_nope_*.py",)),
    ],
    ids=["glob-expanded", "option-values", "repo-flag", "clustered-flags", "unmatched-glob"],
)
def test_paths_are_what_the_shell_and_pytest_make_of_them(vllm_like, command, paths):
    (run,) = pytest_runs((command,), "/vllm-workspace/tests", "/vllm-workspace", vllm_like)
    assert run.paths == paths


def test_only_an_unmatched_glob_is_a_missing_path(vllm_like):
    runs = pytest_runs(
        ("pytest kernels/test_fused_*.py --models llama3.2", "pytest kernels/test_nope_*.py"),
        "/vllm-workspace/tests",
        "/vllm-workspace",
    )
    assert [missing_targets(vllm_like, run) for run in runs] == [
        [],
        ["tests/kernels/test_nope_*.py"],
    ]


def test_an_undeclared_option_value_is_no_path(vllm_like):
    (run,) = pytest_runs(
        ("pytest --retries 3 kernels",), "/vllm-workspace/tests", "/vllm-workspace", vllm_like
    )
    assert (run.paths, run.unknown_options) == (("tests/kernels",), ("--retries",))


MULTI_LINE = """\
python3 -c '
import sys
print("pytest is # not a comment")
'
pytest -v \\
    kernels/test_other.py \\
    -k "other or
moe"  # trailing comment
"""


def test_quotes_span_lines_and_backslashes_join_them():
    runs = pytest_runs((MULTI_LINE,), "/vllm-workspace/tests", "/vllm-workspace")
    assert runs == [
        PytestRun(
            "pytest -v kernels/test_other.py -k other or\nmoe",
            "tests",
            ("tests/kernels/test_other.py",),
            keyword="(other or\nmoe)",
        )
    ]


MARKED = """\
import pytest

@pytest.mark.core_model
def test_core():
    pass

@pytest.mark.core_model
@pytest.mark.slow_test
def test_core_slow():
    pass

def test_plain():
    pass

def test_a_fast():
    pass

def test_a_b():
    pass
"""

PARAMETRIZED = """\
import pytest

@pytest.mark.parametrize("case", [pytest.param(1, marks=pytest.mark.core_model), 2])
def test_dynamic(case):
    pass
"""


@pytest.fixture
def marked(tmp_path):
    write_tree(tmp_path, {"tests/test_marked.py": MARKED, "tests/test_param.py": PARAMETRIZED})
    return tmp_path


def _names(repo: Path, arguments: str) -> list[str]:
    (run,) = pytest_runs((f"pytest tests {arguments}",), None, None)
    files = collected_files(repo, run, ())
    return sorted(test.node for test in selected_tests(repo, run, files))


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('-m "core_model and not slow_test"', ["test_core", "test_dynamic"]),
        ('-k "fast and not slow"', ["test_a_fast", "test_dynamic"]),
        ('-k "core and not slow"', ["test_core", "test_dynamic"]),
        ("-m slow_test", ["test_core_slow", "test_dynamic"]),
    ],
    ids=["markers", "keywords", "keyword-from-name", "one-marker"],
)
def test_filters_are_evaluated_per_test_with_each_unknown_name_its_own(marked, arguments, expected):
    """test_dynamic's ids and markers are unknown statically: each name may be either value."""
    assert _names(marked, arguments) == expected


@pytest.mark.parametrize(
    "arguments",
    ['-m "core_model and not slow_test"', '-k "a and not b"', '-k "core and not slow"'],
)
def test_static_answers_agree_with_pytest(marked, arguments):
    (run,) = pytest_runs((f"pytest tests/test_marked.py {arguments}",), None, None)
    files = collected_files(marked, run, ())
    static = sorted(test.node_id for test in selected_tests(marked, run, files))
    collected = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"),
            *shlex.split(f"tests/test_marked.py {arguments}"),
        ],
        cwd=marked,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    ).stdout
    assert static == sorted(line for line in collected.splitlines() if "::" in line)


def test_runs_with_the_same_text_but_other_words_resolve_apart(vllm_like):
    """'-k "a and b"' and '-k a and b' print alike; the parse must not mix them up."""
    (quoted,) = pytest_runs(
        ('pytest -k "a and b" kernels',), "/vllm-workspace/tests", "/vllm-workspace"
    )
    (bare,) = pytest_runs(
        ("pytest -k a and b kernels",), "/vllm-workspace/tests", "/vllm-workspace"
    )
    assert quoted.command == bare.command
    assert resolve_run(quoted, vllm_like).keyword == "(a and b)"
    assert resolve_run(bare, vllm_like).keyword == "(a)"
