"""Dependency-gap checker on planted repositories: every import form, gaps, --fix, speed."""

from __future__ import annotations

import difflib
import json
import os
import random
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from attngroup.ci.areas.config import load_run_config, load_test_area_file
from attngroup.ci.areas.load import load_test_areas
from attngroup.ci.deps.checker import check_dependencies
from attngroup.ci.deps.fix import add_dependencies
from attngroup.ci.deps.imports import MODULE_LEVEL, REGISTRY, STATIC, ImportGraph
from attngroup.ci.deps.reach import closures, members
from attngroup.ci.deps.report import dead_entries
from attngroup.ci.deps.test_inventory import collected_files, selected_tests
from attngroup.ci.selection.pytest_commands import pytest_runs
from tests.ci.helpers import RUN_CONFIG, commit_all, init_repo, run_cli, write_tree
from tests.json_schemas import assert_matches_schema

# The original bug in miniature: the spec-decode step declares the engine but not the backends
# it reaches through the registry's dotted-path strings.
PLANTED = {
    ".buildkite/ci_config.yaml": RUN_CONFIG
    + "dependency_check:\n  test_roots: [suites, tests]\n  registries: [kernels/registry.py]\n",
    ".buildkite/test_areas/spec.yaml": """\
        group: Spec
        steps:
          # MTP correctness: keep this comment through --fix
          - label: Spec decode MTP
            key: spec-mtp
            device: cpu
            source_file_dependencies:
              - engine/
              - suites/__init__.py
              - suites/conftest.py
              - suites/spec/
            commands:
              - python -m pytest suites/spec -k mtp
        """,
    "kernels/__init__.py": "",
    "kernels/registry.py": """\
        import importlib
        BACKENDS = {"triton": "kernels.backends.triton_attn.TritonBackend"}
        def load(name):
            module, _, cls = BACKENDS[name].rpartition(".")
            return getattr(importlib.import_module(module), cls)
        """,
    "kernels/backends/__init__.py": "",
    "kernels/backends/triton_attn.py": (
        "from ..common import scratch_size\nclass TritonBackend: ...\n"
    ),
    "kernels/common.py": "def scratch_size(num_heads): return num_heads\n",
    "engine/__init__.py": "",
    "engine/builder.py": "from kernels import registry\n",
    "suites/__init__.py": "",
    "suites/conftest.py": "import engine.builder\n",
    "suites/spec/__init__.py": "",
    "suites/spec/test_mtp.py": "def test_mtp_greedy():\n    assert True\n",
    "tests/__init__.py": "",
    "tests/test_unowned.py": "def test_nobody_runs_me():\n    assert True\n",
}


@pytest.fixture(autouse=True)
def parse_cache_in_tmp(tmp_path, monkeypatch):
    """CLI runs keep their parse cache in the test's directory, not the user's cache."""
    monkeypatch.setenv("CI_DEPS_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def planted(tmp_path):
    write_tree(tmp_path, PLANTED)
    return tmp_path


@pytest.mark.parametrize(
    "kinds", [(MODULE_LEVEL,), (STATIC,), (STATIC, REGISTRY)], ids=["module", "static", "all"]
)
@pytest.mark.parametrize(
    "excluded", [frozenset(), frozenset({"kernels/registry.py"})], ids=["none", "registry-excluded"]
)
def test_backward_reach_from_a_file_equals_forward_reach_of_each_node(planted, kinds, excluded):
    """Change mode asks which files lead to a changed file; the whole-repository closures ask
    what each file leads to: the two must agree on every pair, exclusions included."""
    graph = ImportGraph.scan(planted, registries=["kernels/registry.py"])
    position = {path: index for index, path in enumerate(graph.nodes)}
    for target in graph.nodes:
        forward = {
            node
            for node in graph.nodes
            if graph.reach([node], kinds, excluded) >> position[target] & 1
        }
        assert graph.reaching(target, kinds, excluded) == forward, target


def _report(root: Path):
    config = load_run_config(root / ".buildkite/ci_config.yaml", ".buildkite/ci_config.yaml")
    return check_dependencies(load_test_areas(config, root), config, root)


def test_planted_backend_gap_is_found_by_kind_with_its_chain(planted):
    report = _report(planted)
    (step,) = report.steps
    assert [(gap.path, gap.kind) for gap in step.gaps] == [
        ("kernels/__init__.py", "static"),
        ("kernels/backends/__init__.py", "registry"),
        ("kernels/backends/triton_attn.py", "registry"),
        ("kernels/common.py", "registry"),
        ("kernels/registry.py", "static"),
    ]
    assert step.entries_to_add() == [("kernels/", 5, "static", 2, 0)]
    graph = ImportGraph.scan(planted, registries=["kernels/registry.py"])
    assert graph.chain(step.roots, "kernels/backends/triton_attn.py") == (
        (
            "suites/conftest.py",
            "engine/builder.py",
            "kernels/registry.py",
            "kernels/backends/triton_attn.py",
        ),
        "registry",
    )
    assert report.orphan_tests == ("tests/test_unowned.py",)
    assert not report.ok


def test_check_deps_exit_code_and_fix_keeps_comments_and_order(planted):
    before = run_cli("check-deps", "--repo", str(planted))
    assert before.exit_code == 1
    assert (
        "[FAIL] spec-mtp (.buildkite/test_areas/spec.yaml:4): 5 gaps (2 static, 3 registry; 2 tier a)"
        in (before.stdout)
    )
    assert (
        "    add 'kernels/': covers 5 static gaps (2 tier a, 0 imported by its tests)\n"
        in before.stdout
    )
    (planted / "tests/test_unowned.py").unlink()
    fixed = run_cli("check-deps", "--repo", str(planted), "--fix")
    assert fixed.exit_code == 0, fixed.stdout
    assert "fixed .buildkite/test_areas/spec.yaml: spec-mtp: kernels/" in fixed.stdout
    text = (planted / ".buildkite/test_areas/spec.yaml").read_text()
    assert "  # MTP correctness: keep this comment through --fix\n" in text
    assert text.index("suites/spec/") < text.index("kernels/") < text.index("commands:")
    assert run_cli("check-deps", "--repo", str(planted)).exit_code == 0


def test_ignore_list_with_reason_and_stale_entries(planted):
    write_tree(
        planted,
        {
            ".buildkite/ci_config.yaml": PLANTED[".buildkite/ci_config.yaml"]
            + (
                "  ignore:\n    spec-mtp:\n"
                "      kernels/: backends are covered by the kernels step\n"
                "      vendor/: nothing here\n"
            )
        },
    )
    report = _report(planted)
    assert report.steps[0].gaps == ()
    assert ("kernels/common.py", "backends are covered by the kernels step") in (
        report.steps[0].ignored
    )
    assert report.stale_ignores == ("spec-mtp: vendor/",)


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("python -m pytest suites/spec -k 'not mtp'", "its paths and filters select no test"),
        ("python -m pytest suites/spec -m gpu", "its paths and filters select no test"),
        (
            "python -m pytest suites/spec --deselect suites/spec/test_mtp.py::test_mtp_greedy",
            "its paths and filters select no test",
        ),
        ("python -m pytest suites/nope", "test path 'suites/nope' does not exist"),
        ("python -m pytest suites/spec -k 'mtp and ('", "invalid pytest expression"),
    ],
    ids=["keyword", "marker", "deselect", "missing-path", "bad-expression"],
)
def test_steps_whose_filters_select_nothing(planted, command, problem):
    area = PLANTED[".buildkite/test_areas/spec.yaml"].replace(
        "python -m pytest suites/spec -k mtp", json.dumps(command)
    )
    write_tree(planted, {".buildkite/test_areas/spec.yaml": area})
    (step,) = _report(planted).steps
    assert any(problem in item for item in step.problems), step.problems


def test_declared_paths_that_do_not_exist(planted):
    area = PLANTED[".buildkite/test_areas/spec.yaml"].replace(
        "- engine/\n", "- engine/\n              - enigne/\n"
    )
    write_tree(planted, {".buildkite/test_areas/spec.yaml": area})
    assert _report(planted).steps[0].missing_declared == ("enigne/",)


def test_whole_repository_report_leads_with_dead_entries_then_unrun_tests(planted):
    """What a maintainer can act on as it stands comes first: each declared entry that matches
    no file at its own YAML line, then the tests no step runs, and only then the ranked gaps."""
    area = PLANTED[".buildkite/test_areas/spec.yaml"].replace(
        "- engine/\n",
        "- engine/\n              - enigne/\n              - '!suites/spec/gone.py'\n",
    )
    write_tree(planted, {".buildkite/test_areas/spec.yaml": area})
    result = run_cli("check-deps", "--repo", str(planted))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[1:7] == [
        "declared paths that match no file: 2 entries in 1 steps",
        "  .buildkite/test_areas/spec.yaml:9: enigne/ (spec-mtp)",
        "  .buildkite/test_areas/spec.yaml:10: !suites/spec/gone.py (spec-mtp)",
        "tests run by no step: 1",
        "  tests/test_unowned.py",
        "steps with gaps, most tier-(a) gaps (imported on the step's device) first: 1",
    ]
    assert lines[7].startswith("[FAIL] spec-mtp (.buildkite/test_areas/spec.yaml:4): 5 gaps")
    document = json.loads(run_cli("check-deps", "--repo", str(planted), "--json").stdout)
    assert_matches_schema(document, "ci-check-deps")
    assert document["missing_declared"] == [
        {
            "location": ".buildkite/test_areas/spec.yaml:9",
            "entry": "enigne/",
            "steps": ["spec-mtp"],
        },
        {
            "location": ".buildkite/test_areas/spec.yaml:10",
            "entry": "!suites/spec/gone.py",
            "steps": ["spec-mtp"],
        },
    ]


# A kernel test that imports its kernels and, through a model registry's strings, a model
# package with more files than the kernels have; the kernels import a library package the test
# never imports itself. Neither the model package nor the library may lead.
KERNEL_AND_MODELS = {
    ".buildkite/ci_config.yaml": RUN_CONFIG
    + "dependency_check:\n  test_roots: [tests]\n  registries: [models/registry.py]\n",
    ".buildkite/test_areas/kernels.yaml": """\
        group: Kernels
        steps:
          - label: Kernel ops
            key: kernel-ops
            device: cpu
            source_file_dependencies:
              - tests/kernels/
            commands:
              - python -m pytest tests/kernels
        """,
    "kernels/__init__.py": "",
    "kernels/ops.py": "from kernels.scale import SCALE\n",
    "kernels/scale.py": "import lib.x\nimport lib.y\nimport lib.z\nSCALE = 1\n",
    "lib/__init__.py": "",
    **{f"lib/{name}.py": "" for name in "xyz"},
    "models/__init__.py": "",
    "models/registry.py": (
        'MODELS = {"a": "models.big.a.A", "b": "models.big.b.B", "c": "models.big.c.C"}\n'
    ),
    "models/big/__init__.py": "",
    **{f"models/big/{name}.py": f"class {name.upper()}: ...\n" for name in "abc"},
    "tests/kernels/test_ops.py": (
        "import kernels.ops\nimport models.registry\n\n"
        "def test_scale():\n    assert kernels.ops.SCALE == 1\n"
    ),
}


def test_entries_to_add_rank_tier_a_evidence_before_registry_reach(tmp_path):
    write_tree(tmp_path, KERNEL_AND_MODELS)
    (step,) = _report(tmp_path).steps
    entries = step.entries_to_add()
    assert [(item.entry, item.gaps, item.tier_a, item.direct) for item in entries] == [
        ("kernels/", 3, 3, 2),
        ("models/", 6, 2, 2),
        ("lib/", 4, 4, 0),
    ], "kernels/ has fewer gaps but more tier-(a) evidence; most of models/ only by registry; "
    "lib/ has the most tier-(a) gaps but the test imports it only through kernels/"


def test_a_mirror_shares_its_parents_dead_entry_line_and_has_its_own(planted):
    area = textwrap.dedent(
        PLANTED[".buildkite/test_areas/spec.yaml"].replace(
            "- engine/\n", "- engine/\n              - enigne/\n"
        )
    ) + (
        "    mirror:\n"
        "      amd:\n"
        "        device: mi300_1\n"
        "        source_file_dependencies: [kernels/, kernels/rocm_gone.py]\n"
    )
    config = PLANTED[".buildkite/ci_config.yaml"] + "external_step_keys: [image-build-amd]\n"
    write_tree(
        planted, {".buildkite/test_areas/spec.yaml": area, ".buildkite/ci_config.yaml": config}
    )
    assert dead_entries(_report(planted)) == [
        (".buildkite/test_areas/spec.yaml:9", "enigne/", ["spec-mtp", "amd-spec-mtp"]),
        (".buildkite/test_areas/spec.yaml:18", "kernels/rocm_gone.py", ["amd-spec-mtp"]),
    ]


IMPORT_FORMS = {
    "absolute": "import pkg.target",
    "from-package-import-module": "from pkg import target",
    "relative": "from .target import VALUE",
    "relative-parent": "from ..pkg import target",
    "dotted-string-in-registry": "PATH = 'pkg.target.Backend'",
    "f-string-template-in-registry": (
        "import importlib\nsuffix = 'get'\nimportlib.import_module(f'pkg.tar{suffix}')"
    ),
    "lazy-in-function": "def load():\n    import pkg.target",
    "type-checking-else": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    import pkg.target"
    ),
}
NOT_RUNTIME_EDGES = {
    "type-checking": "import typing\nif typing.TYPE_CHECKING:\n    import pkg.target",
    "string-outside-registries": "PATH = 'pkg.target.Backend'",
    "f-string-outside-registries": "suffix = 'get'\nNAME = f'pkg.tar{suffix}'",
}


def _reached(graph: ImportGraph, root: str) -> set[str]:
    return {graph.nodes[index] for index in members(graph.reach([root], (STATIC, REGISTRY)))}


def _graph_of_user(root: Path, source: str, registries: tuple[str, ...]) -> ImportGraph:
    write_tree(
        root,
        {
            "pkg/__init__.py": "",
            "pkg/target.py": "VALUE = 1\n",
            "pkg/unrelated.py": "",
            "pkg/user.py": source + "\n",
        },
    )
    return ImportGraph.scan(root, registries=registries)


@pytest.mark.parametrize("source", IMPORT_FORMS.values(), ids=IMPORT_FORMS.keys())
def test_import_forms_reach_the_module(tmp_path, source):
    graph = _graph_of_user(tmp_path, source, ("pkg/user.py",))
    assert _reached(graph, "pkg/user.py") == {"pkg/user.py", "pkg/__init__.py", "pkg/target.py"}
    assert graph.chain(["pkg/user.py"], "pkg/__init__.py")[0] == ("pkg/user.py", "pkg/__init__.py")


@pytest.mark.parametrize("source", NOT_RUNTIME_EDGES.values(), ids=NOT_RUNTIME_EDGES.keys())
def test_type_checking_and_strings_outside_registries_are_no_edges(tmp_path, source):
    graph = _graph_of_user(tmp_path, source, ())
    assert _reached(graph, "pkg/user.py") == {"pkg/user.py", "pkg/__init__.py"}


def test_strings_that_only_look_dotted_are_not_imports(tmp_path):
    write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "ci/__init__.py": "",
            "pkg/user.py": "CONFIG = 'ci.yaml'\nVERSION = 'pkg.version'\n",
        },
    )
    graph = ImportGraph.scan(tmp_path, registries=["pkg/user.py"])
    assert _reached(graph, "pkg/user.py") == {
        "pkg/user.py",
        "pkg/__init__.py",
    }


def _synthetic_repo(root: Path, num_packages: int, modules_per_package: int) -> None:
    """A vLLM-sized tree: chained imports, registries by dotted string, one step per package."""
    rng = random.Random(0)
    files = {".buildkite/ci_config.yaml": RUN_CONFIG + "dependency_check:\n  test_roots: [tests]\n"}
    steps = []
    for package in range(num_packages):
        files[f"lib/p{package}/__init__.py"] = ""
        for module in range(modules_per_package):
            targets = [
                f"lib.p{rng.randrange(num_packages)}.m{rng.randrange(modules_per_package)}"
                for _ in range(3)
            ]
            body = "\n".join(f"import {target}" for target in targets[:2])
            files[f"lib/p{package}/m{module}.py"] = (
                f"{body}\nREGISTRY = {{'x': '{targets[2]}.X'}}\n"
            )
        files[f"tests/p{package}/test_p{package}.py"] = (
            f"import lib.p{package}.m0\n\ndef test_p{package}():\n    assert True\n"
        )
        declared = f"[lib/, tests/p{package}/]" if package else "[lib/p1/, tests/p0/]"  # gaps
        steps.append(
            f"  - label: P{package}\n    key: p{package}\n    device: cpu\n"
            f"    source_file_dependencies: {declared}\n"
            f"    commands: [python -m pytest tests/p{package}]\n"
        )
    files[".buildkite/test_areas/synthetic.yaml"] = "group: S\nsteps:\n" + "".join(steps)
    write_tree(root, files)


def test_synthetic_repository_of_3000_modules_is_checked_in_seconds(tmp_path):
    _synthetic_repo(tmp_path, num_packages=30, modules_per_package=100)
    started = time.perf_counter()
    report = _report(tmp_path)
    elapsed = time.perf_counter() - started
    print(
        f"check-deps on {report.modules_indexed} modules, {len(report.steps)} steps: "
        f"{elapsed:.2f} s"
    )
    assert report.modules_indexed >= 3000
    assert report.steps[0].gaps and all(step.ok for step in report.steps[1:])
    assert report.steps[0].reachable > 1000, "random imports connect most of the tree"
    assert elapsed < 15.0


@pytest.mark.parametrize(
    ("fixture", "step_key", "new_lines"),
    [
        ("spec_decode", "v1-spec-decode", ["    - vllm/v1/attention/backends/\n"]),
        ("distributed", "distributed-comm-ops", ["  - vllm/v1/attention/backends/\n"]),
        (
            "crcr_report",
            "crcr-report",
            ["    source_file_dependencies:\n", "      - vllm/v1/attention/backends/\n"],
        ),
    ],
    ids=["indented-list", "unindented-list", "no-list-yet"],
)
def test_fix_only_inserts_lines_in_the_files_own_style(tmp_path, fixture, step_key, new_lines):
    source = Path(__file__).parent / f"data/vllm-buildkite/.buildkite/test_areas/{fixture}.yaml"
    target = tmp_path / f"{fixture}.yaml"
    target.write_text(source.read_text())
    assert add_dependencies(target, {step_key: ["vllm/v1/attention/backends/"]}) == [
        f"{step_key}: vllm/v1/attention/backends/"
    ]
    before, after = source.read_text().splitlines(True), target.read_text().splitlines(True)
    diff = list(difflib.ndiff(before, after))
    assert [line[2:] for line in diff if line.startswith("+ ")] == new_lines
    assert not [line for line in diff if line.startswith("- ")]
    steps, _ = load_test_area_file(target, "t.yaml")
    step = next(step for step in steps if step.key == step_key)
    assert step.source_file_dependencies[-1] == "vllm/v1/attention/backends/"
    assert add_dependencies(target, {step_key: ["vllm/v1/attention/backends/"]}) == []


def test_check_deps_json_report(planted):
    result = run_cli("check-deps", "--repo", str(planted), "--json")
    document = json.loads(result.stdout)
    assert_matches_schema(document, "ci-check-deps")
    assert result.exit_code == 1 and document["ok"] is False
    (step,) = document["steps"]
    assert step["gaps"] == {"static": 2, "registry": 3}
    assert [
        (item["entry"], item["gaps"], item["kind"], item["tier_a"], item["imported_by_tests"])
        for item in step["add"]
    ] == [("kernels/", 5, "static", 2, 0)]
    assert step["add"][0]["example"] == [
        "suites/conftest.py",
        "engine/builder.py",
        "kernels/__init__.py",
    ]
    assert document["orphan_tests"] == ["tests/test_unowned.py"]
    assert document["missing_declared"] == []


@pytest.mark.parametrize(
    "mode", [pytest.param((), id="whole-repository"), pytest.param(("--base", "HEAD~1"), id="base")]
)
def test_a_file_that_does_not_parse_is_a_named_warning(planted, mode):
    write_tree(planted, {"engine/broken.py": "def broken(:\n    pass\n"})
    init_repo(planted, {})
    write_tree(planted, {"engine/builder.py": (planted / "engine/builder.py").read_text() + "\n"})
    commit_all(planted, "touch the builder")
    result = run_cli("check-deps", "--repo", str(planted), "--json", *mode)
    document = json.loads(result.stdout)
    assert_matches_schema(document, "ci-check-deps")
    assert [item["path"] for item in document["unparsed_files"]] == ["engine/broken.py"]
    assert "invalid syntax" in document["unparsed_files"][0]["error"]
    (warning,) = [line for line in result.stderr.splitlines() if "unparsed-file" in line]
    assert warning.startswith("warning: unparsed-file: engine/broken.py: invalid syntax")


def test_static_selection_agrees_with_pytest_collection(planted):
    arguments = ["tests", "suites", "-k", "greedy or nobody"]
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *arguments,
        ],
        cwd=planted,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    ).stdout
    from_pytest = sorted(line for line in collected.splitlines() if "::" in line)
    (run,) = pytest_runs((f"pytest {shlex.join(arguments)}",), None, None)
    files = collected_files(planted, run, ())
    assert len(from_pytest) == 2
    assert sorted(test.node_id for test in selected_tests(planted, run, files)) == from_pytest


@pytest.mark.parametrize(
    ("successors", "expected"),
    [
        ([[1], [2], []], [{0, 1, 2}, {1, 2}, {2}]),
        ([[1], [0, 2], [], [3]], [{0, 1, 2}, {0, 1, 2}, {2}, {3}]),
        ([[1], [2], [0], [0]], [{0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {0, 1, 2, 3}]),
    ],
    ids=["chain", "cycle-with-exit", "cycle-entered-from-outside"],
)
def test_reachability_bitsets_follow_cycles(successors, expected):
    assert [set(members(bits)) for bits in closures(successors)] == expected
