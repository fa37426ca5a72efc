"""check-deps on a repository shaped like vLLM: a backend registry reached by strings, a model
registry naming many models lazily, spec-decode tests, a TYPE_CHECKING import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ci.helpers import RUN_CONFIG, commit_all, git, init_repo, run_cli, write_tree
from tests.json_schemas import assert_file_matches_schema, assert_matches_schema

NUM_MODELS = 40
DEPENDENCY_CHECK = "dependency_check:\n  test_roots: [tests]\n"
BACKENDS = "vllm/v1/attention/backends"


def _step(key: str, test: str, dependencies: list[str]) -> str:
    listed = "".join(f"\n      - {entry}" for entry in dependencies)
    return (
        f"  - label: {key}\n    key: {key}\n    device: cpu\n"
        f"    source_file_dependencies:{listed}\n    commands:\n      - pytest -v -s {test}\n"
    )


CORE = ["vllm/__init__.py", "vllm/v1/__init__.py", "tests/conftest.py"]
STEPS = [
    _step(
        "spec-decode-eagle",
        "tests/v1/spec_decode/test_eagle.py",
        [*CORE, "vllm/v1/spec_decode/", "tests/v1/spec_decode/test_eagle.py"],
    ),
    _step(
        "spec-decode-ngram",
        "tests/v1/spec_decode/test_ngram.py",
        [*CORE, "vllm/v1/spec_decode/", "tests/v1/spec_decode/test_ngram.py"],
    ),
    _step(
        "e2e-spec-decode",
        "tests/v1/e2e/test_spec_decode.py",
        [*CORE, "vllm/v1/spec_decode/", "tests/v1/e2e/"],
    ),
    _step("attention-backends", "tests/kernels", [*CORE, "vllm/v1/attention/", "tests/kernels/"]),
    _step(
        "models",
        "tests/models",
        [
            *CORE,
            "vllm/model_executor/__init__.py",
            "vllm/model_executor/models/__init__.py",
            "vllm/model_executor/models/registry.py",
            "tests/models/",
        ],
    ),
]
MODELS = "\n".join(f'    "Arch{i}": ("model_{i}", "Arch{i}"),' for i in range(NUM_MODELS))
TREE = {
    ".buildkite/ci_config.yaml": RUN_CONFIG
    + DEPENDENCY_CHECK
    + f"  registries: [{BACKENDS}/registry.py]\n",
    ".buildkite/test_areas/v1.yaml": "group: V1\nsteps:\n" + "".join(STEPS),
    "vllm/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    f"{BACKENDS}/__init__.py": "",
    f"{BACKENDS}/registry.py": """\
        import enum
        class AttentionBackendEnum(enum.Enum):
            FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"
            TRITON_ATTN = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
        """,
    f"{BACKENDS}/flash_attn.py": "class FlashAttentionBackend: ...\n",
    f"{BACKENDS}/triton_attn.py": "class TritonAttentionBackend: ...\n",
    "vllm/v1/spec_decode/__init__.py": "",
    "vllm/v1/spec_decode/eagle.py": """\
        from typing import TYPE_CHECKING
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        if TYPE_CHECKING:
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        def propose(runner: "GPUModelRunner") -> AttentionBackendEnum: ...
        """,
    "vllm/v1/spec_decode/ngram.py": "def propose(tokens): return tokens[-1:]\n",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/gpu_model_runner.py": "class GPUModelRunner: ...\n",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/models/__init__.py": "",
    "vllm/model_executor/models/registry.py": (
        "import importlib\n_MODELS = {\n" + MODELS + "\n}\n"
        "def load(arch):\n    module, name = _MODELS[arch]\n"
        '    return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)\n'
        'DEFAULT = "vllm.model_executor.models.model_0.Arch0"\n'
    ),
    **{
        f"vllm/model_executor/models/model_{i}.py": f"class Arch{i}: ...\n"
        for i in range(NUM_MODELS)
    },
    "tests/conftest.py": "import vllm\n",
    "tests/v1/spec_decode/test_eagle.py": (
        "from vllm.v1.spec_decode.eagle import propose\n\ndef test_eagle():\n    assert propose\n"
    ),
    "tests/v1/spec_decode/test_ngram.py": (
        "from vllm.v1.spec_decode.ngram import propose\n\n"
        "def test_ngram():\n    assert propose([1, 2]) == [2]\n"
    ),
    "tests/v1/e2e/test_spec_decode.py": (
        "import vllm.v1.spec_decode.eagle\n\ndef test_e2e():\n    assert vllm.v1.spec_decode.eagle\n"
    ),
    "tests/kernels/test_backends.py": (
        "from vllm.v1.attention.backends import flash_attn, triton_attn\n\n"
        "def test_backends():\n    assert flash_attn and triton_attn\n"
    ),
    "tests/models/test_registry.py": (
        "from vllm.model_executor.models.registry import load\n\n"
        "def test_arch3():\n    assert load('Arch3')\n"
    ),
}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.setenv("CI_DEPS_CACHE_DIR", str(tmp_path / "cache"))
    return init_repo(tmp_path / "repo", TREE)


def _check(repo: Path, *args: str):
    return run_cli("check-deps", "--repo", str(repo), *args)


def test_whole_repository_reports_the_backend_gap_not_the_model_strings(repo):
    result = _check(repo, "--json")
    document = json.loads(result.stdout)
    assert_matches_schema(document, "ci-check-deps")
    assert result.exit_code == 1
    failing = {step["key"]: step for step in document["steps"] if not step["ok"]}
    assert set(failing) == {"spec-decode-eagle", "e2e-spec-decode"}
    eagle = failing["spec-decode-eagle"]
    # registry.py and the packages by import; the two backends only through its strings
    assert eagle["gaps"] == {"static": 3, "registry": 2}
    assert [(item["entry"], item["gaps"]) for item in eagle["add"]] == [("vllm/v1/attention/", 5)]
    assert eagle["add"][0]["example"] == [
        "tests/v1/spec_decode/test_eagle.py",
        "vllm/v1/spec_decode/eagle.py",
        "vllm/v1/attention/__init__.py",
    ]
    assert document["summary"]["gaps"] == {"static": 6, "registry": 4}
    text = _check(repo).stdout
    assert "add 'vllm/v1/attention/': covers 5 static gaps (" in text
    assert "models/model_" not in text


def test_type_checking_imports_are_not_runtime_edges(repo):
    from attngroup.ci.areas.config import load_run_config
    from attngroup.ci.areas.load import load_test_areas
    from attngroup.ci.deps.checker import check_dependencies

    config = load_run_config(repo / ".buildkite/ci_config.yaml", ".buildkite/ci_config.yaml")
    report = check_dependencies(load_test_areas(config, repo), config, repo)
    assert "vllm/v1/spec_decode/eagle.py" in report.closures["spec-decode-eagle"]
    assert "vllm/v1/worker/gpu_model_runner.py" not in report.closures["spec-decode-eagle"]
    assert not any("models/model_" in path for path in report.closures["models"])


def test_change_to_one_backend_names_exactly_the_unselected_steps_that_reach_it(repo):
    git(repo, "checkout", "-q", "-b", "change")
    write_tree(repo, {f"{BACKENDS}/triton_attn.py": "class TritonAttentionBackend:\n    x = 1\n"})
    commit_all(repo, "change a backend")
    result = _check(repo, "--base", "main", "--json")
    document = json.loads(result.stdout)
    assert_matches_schema(document, "ci-check-deps")
    assert result.exit_code == 1, result.stderr
    assert document["changed_files"] == [f"{BACKENDS}/triton_attn.py"]
    assert [
        (item["step"], item["kind"], item["chain"], item["add"]) for item in document["missed"]
    ] == [
        (
            "spec-decode-eagle",
            "registry",
            [
                "tests/v1/spec_decode/test_eagle.py",
                "vllm/v1/spec_decode/eagle.py",
                f"{BACKENDS}/registry.py",
                f"{BACKENDS}/triton_attn.py",
            ],
            "vllm/v1/attention/",
        ),
        (
            "e2e-spec-decode",
            "registry",
            [
                "tests/v1/e2e/test_spec_decode.py",
                "vllm/v1/spec_decode/eagle.py",
                f"{BACKENDS}/registry.py",
                f"{BACKENDS}/triton_attn.py",
            ],
            "vllm/v1/attention/",
        ),
    ]
    text = _check(repo, "--base", "main").stdout
    assert text.splitlines() == [
        "check-deps --base main: 1 changed files; 2 unselected steps reach them "
        "(a: 0, b: 0, c: 2); 0 already cover them",
        f"{BACKENDS}/triton_attn.py:",
        " (c) only registry strings or function-local imports reach it: 2 steps",
        "  [MISSED] 2 steps: e2e-spec-decode (.buildkite/test_areas/v1.yaml:25), "
        "spec-decode-eagle (.buildkite/test_areas/v1.yaml:3): add 'vllm/v1/attention/'",
        f"      tests/v1/e2e/test_spec_decode.py -> vllm/v1/spec_decode/eagle.py -> "
        f"{BACKENDS}/registry.py => {BACKENDS}/triton_attn.py",
        "missed triggers FOUND",
    ]


# The same tree with vLLM's platform layout: tests/conftest.py imports vllm.platforms, whose
# function-local import of the XPU platform module imports the Triton backend (the XPU chain that
# 287 of 292 steps shared on vLLM 0.34.0), a model test importing the backend at module level,
# a spec-decode helper naming the backend's registry key, and a nightly step that covers it.
PLATFORM_CONFIG = "  platforms:\n    vllm/platforms/xpu.py: [xpu, 'intel_*']\n"
TIERED = {
    **TREE,
    ".buildkite/ci_config.yaml": TREE[".buildkite/ci_config.yaml"] + PLATFORM_CONFIG,
    ".buildkite/test_areas/more.yaml": "group: More\nsteps:\n"
    + _step("xpu-smoke", "tests/xpu/test_smoke.py", ["tests/xpu/"]).replace(
        "device: cpu", "device: xpu"
    )
    + _step(
        "spec-decode-choice",
        "tests/v1/spec_decode/test_choice.py",
        [*CORE, "vllm/v1/spec_decode/", "tests/v1/spec_decode/test_choice.py"],
    )
    + _step("models-triton", "tests/models_triton", ["tests/models_triton/"])
    + _step("nightly-backends", "tests/kernels", ["vllm/v1/attention/", "tests/kernels/"]).replace(
        "device: cpu", "device: cpu\n    optional: true"
    ),
    "tests/conftest.py": "import vllm\nimport vllm.platforms\n",
    "vllm/platforms/__init__.py": (
        "def current_platform():\n    from vllm.platforms import xpu\n    return xpu\n"
    ),
    "vllm/platforms/xpu.py": "from vllm.v1.attention.backends import triton_attn\n",
    "tests/xpu/test_smoke.py": "def test_smoke():\n    assert True\n",
    "tests/v1/spec_decode/helpers.py": 'BACKEND = "TRITON_ATTN"\n',
    "tests/v1/spec_decode/test_choice.py": (
        "from tests.v1.spec_decode.helpers import BACKEND\n"
        "from vllm.v1.spec_decode.eagle import propose\n\n"
        "def test_choice():\n    assert propose and BACKEND\n"
    ),
    "tests/models_triton/test_model.py": (
        "from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend\n\n"
        "def test_model():\n    assert TritonAttentionBackend\n"
    ),
}


@pytest.fixture
def tiered(tmp_path, monkeypatch):
    monkeypatch.setenv("CI_DEPS_CACHE_DIR", str(tmp_path / "cache"))
    repo = init_repo(tmp_path / "repo", TIERED)
    write_tree(repo, {f"{BACKENDS}/triton_attn.py": "class TritonAttentionBackend:\n    x = 1\n"})
    commit_all(repo, "change a backend")
    return repo


def test_change_report_tiers_platforms_and_edge_kinds(tiered):
    document = json.loads(_check(tiered, "--base", "HEAD~1", "--json").stdout)
    assert_matches_schema(document, "ci-check-deps")
    found = {item["step"]: item for item in document["missed"]}
    assert {key: item["tier"] for key, item in found.items()} == {
        "models-triton": "a",
        "spec-decode-choice": "b",
        "spec-decode-eagle": "c",
        "e2e-spec-decode": "c",
        "xpu-smoke": "c",
        "nightly-backends": "covered",
    }
    # Every edge's kind: module-level import, function-local import, registry string.
    assert list(
        zip(found["xpu-smoke"]["chain"], found["xpu-smoke"]["edges"] + [None], strict=True)
    ) == [
        ("tests/conftest.py", "->"),
        ("vllm/platforms/__init__.py", "~>"),
        ("vllm/platforms/xpu.py", "->"),
        (f"{BACKENDS}/triton_attn.py", None),
    ]
    assert found["spec-decode-choice"]["edges"] == ["->", "->", "=>"]
    assert found["models-triton"]["edges"] == ["->"]
    # The XPU platform module is on no chain of a step on another device.
    assert [key for key, item in found.items() if "vllm/platforms/xpu.py" in item["chain"]] == [
        "xpu-smoke"
    ]
    assert found["nightly-backends"]["nightly"] is True


def test_change_report_text_has_tier_headings_counts_and_no_covered_step_as_missed(tiered):
    result = _check(tiered, "--base", "HEAD~1")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "check-deps --base HEAD~1: 1 changed files; 5 unselected steps reach them "
        "(a: 1, b: 1, c: 3); 1 already cover them"
    )
    headings = [line for line in lines if line.startswith(" (")]
    assert headings == [
        " (a) its tests import it, on the step's device: 1 steps",
        " (b) its tests or their helpers name the module, a class of it or its registry key: 1 steps",
        " (c) only registry strings or function-local imports reach it: 3 steps",
    ]
    assert lines[lines.index(headings[0]) + 2] == (
        f"      tests/models_triton/test_model.py -> {BACKENDS}/triton_attn.py"
    )
    assert " covered: 1 steps already list an entry for it (1 covered, runs nightly)" in lines
    assert not any("nightly-backends" in line for line in lines)
    verbose = _check(tiered, "--base", "HEAD~1", "-v").stdout.splitlines()
    assert (
        "  nightly-backends (.buildkite/test_areas/more.yaml:28): covered, runs nightly" in verbose
    )


def test_change_that_no_unselected_step_imports_passes(repo):
    git(repo, "checkout", "-q", "-b", "models")
    write_tree(repo, {"vllm/model_executor/models/model_7.py": "class Arch7:\n    x = 1\n"})
    commit_all(repo, "change one model")
    result = _check(repo, "--base", "main")
    assert result.exit_code == 0, result.stdout
    assert "no missed triggers" in result.stdout


def test_baseline_fails_only_on_a_newly_planted_gap(repo, tmp_path):
    baseline = tmp_path / "baseline.json"
    assert _check(repo, "--write-baseline", str(baseline)).exit_code == 0
    assert_file_matches_schema(baseline, "ci-check-deps-baseline")
    assert _check(repo, "--baseline", str(baseline)).exit_code == 0
    write_tree(
        repo,
        {
            "vllm/utils/__init__.py": "",
            "vllm/utils/helpers.py": "def helper(): ...\n",
            "tests/v1/spec_decode/test_ngram.py": TREE["tests/v1/spec_decode/test_ngram.py"]
            + "import vllm.utils.helpers\n",
        },
    )
    result = _check(repo, "--baseline", str(baseline))
    assert result.exit_code == 1
    assert "[FAIL] spec-decode-ngram" in result.stdout
    assert "add 'vllm/utils/': covers 2 static gaps" in result.stdout
    assert "spec-decode-eagle" not in result.stdout
    assert "known findings in the baseline" in result.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read baseline"),
        ("{not json", "is corrupt"),
        ('{"format": "x"}', "is corrupt"),
    ],
    ids=["missing", "not-json", "wrong-format"],
)
def test_unreadable_baseline_is_bad_input_naming_the_file(repo, tmp_path, content, message):
    baseline = tmp_path / "baseline.json"
    if content is not None:
        baseline.write_text(content)
    result = _check(repo, "--baseline", str(baseline))
    assert result.exit_code == 2
    assert message in result.stderr and str(baseline) in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("import_roots: [nope]", "import_roots entry 'nope' is not a directory"),
        ("import_roots: [vllm]", "import_roots entry 'vllm' is a package"),
        ("import_roots: [.buildkite]", "import_roots entry '.buildkite' holds no Python file"),
        ("registries: [vllm/registry.py]", "registries entry 'vllm/registry.py' is not a"),
    ],
    ids=["missing", "shifts-module-names", "indexes-nothing", "missing-registry"],
)
def test_bad_import_roots_and_registries_are_bad_input(repo, setting, message):
    write_tree(
        repo, {".buildkite/ci_config.yaml": RUN_CONFIG + DEPENDENCY_CHECK + f"  {setting}\n"}
    )
    result = _check(repo)
    assert result.exit_code == 2
    assert ".buildkite/ci_config.yaml: dependency_check: " + message in result.stderr
    assert result.stdout == ""


def test_a_corrupt_parse_cache_is_rebuilt(repo, tmp_path):
    first = _check(repo).stdout
    for cache in (tmp_path / "cache").rglob("*.json"):
        cache.write_text("{truncated")
    assert _check(repo).stdout == first
    assert all(json.loads(cache.read_text()) for cache in (tmp_path / "cache").rglob("*.json"))


def test_change_mode_with_a_baseline_marks_recorded_gaps_known(repo, tmp_path):
    baseline = tmp_path / "baseline.json"
    assert _check(repo, "--write-baseline", str(baseline)).exit_code == 0
    git(repo, "checkout", "-q", "-b", "change")
    write_tree(repo, {f"{BACKENDS}/flash_attn.py": "class FlashAttentionBackend:\n    x = 1\n"})
    commit_all(repo, "change a backend")
    result = _check(repo, "--base", "main", "--baseline", str(baseline))
    assert result.exit_code == 0, result.stdout
    (known,) = [line for line in result.stdout.splitlines() if line.startswith("  [known] ")]
    assert "spec-decode-eagle" in known and "e2e-spec-decode" in known
    assert "[MISSED]" not in result.stdout
    assert result.stdout.endswith("no missed triggers\n")
