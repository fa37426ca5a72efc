"""Strict loading of vLLM-format test areas: every vLLM fixture loads, mistakes are caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from attngroup.ci.areas.config import (
    KeyPolicy,
    derive_step_key,
    load_run_config,
    load_test_area_file,
)
from attngroup.ci.areas.load import load_test_areas
from attngroup.ci.errors import CIInputError, CIInputErrors
from tests.ci.helpers import run_cli, write_tree

FIXTURES = Path(__file__).parent / "data" / "vllm-buildkite"
REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_AREA_FILES = sorted(
    path.relative_to(FIXTURES).as_posix()
    for path in FIXTURES.rglob("*.yaml")
    if path.name != "ci_config.yaml"
)


def test_all_fixture_files_are_present():
    listed = (FIXTURES / "SOURCE.md").read_text().count("| .buildkite/")
    assert len(TEST_AREA_FILES) + 1 == listed == 49


@pytest.mark.parametrize("relative", TEST_AREA_FILES, ids=lambda path: Path(path).stem)
def test_vllm_fixture_loads_on_its_own(relative):
    steps, _ = load_test_area_file(FIXTURES / relative, relative)
    assert steps, "every fixture file has steps"
    assert all(step.file == relative and step.commands for step in steps)
    assert len({step.key for step in steps}) == len(steps)


def test_vllm_run_config_loads():
    config = load_run_config(FIXTURES / ".buildkite/ci_config.yaml")
    assert config.job_dirs == (".buildkite/test_areas", ".buildkite/image_build")
    assert [pattern.pattern for pattern in config.run_all_patterns] == [".*"]


def test_vllm_fixtures_together_report_the_duplicate_key_in_both_files():
    config = load_run_config(FIXTURES / ".buildkite/ci_config.yaml")
    with pytest.raises(CIInputErrors) as raised:
        load_test_areas(config, FIXTURES)
    duplicate = [
        str(error)
        for error in raised.value.errors
        if "duplicate step key 'v1-spec-decode'" in str(error)
    ]
    assert len(duplicate) == 1
    assert ".buildkite/test_areas/spec_decode.yaml:5" in duplicate[0]
    assert ".buildkite/test_areas/misc.yaml:5" in duplicate[0]


def test_legacy_keys_warn_by_default_with_the_modern_key():
    steps, warnings = load_test_area_file(
        FIXTURES / ".buildkite/test_areas/e2e_integration.yaml", "e2e_integration.yaml"
    )
    assert any(
        "legacy key 'num_gpus'" in warning and "'num_devices'" in warning for warning in warnings
    )
    assert all(step.num_devices is None for step in steps), "legacy keys have no effect"


STRICT = KeyPolicy(legacy_keys="error", unknown_keys="error")


def _area(tmp_path: Path, text: str, policy: KeyPolicy = STRICT) -> tuple[list, list[str]]:
    write_tree(tmp_path, {"area.yaml": text})
    return load_test_area_file(tmp_path / "area.yaml", "area.yaml", policy)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param(
            "num_gpus: 2",
            "area.yaml:5: step 'a': unknown key 'num_gpus' (did you mean 'num_devices'?)",
            id="vllm-spelling",
        ),
        pytest.param(
            "timeout_in_minute: 3",
            "area.yaml:5: step 'a': unknown key 'timeout_in_minute' "
            "(did you mean 'timeout_in_minutes'?)",
            id="misspelt",
        ),
    ],
)
def test_unknown_key_names_file_line_and_near_miss(tmp_path, line, message):
    with pytest.raises(CIInputError) as raised:
        _area(tmp_path, f"group: g\nsteps:\n  - label: a\n    commands: [pytest]\n    {line}\n")
    assert str(raised.value) == message


def test_all_problems_of_a_file_are_reported_together(tmp_path):
    with pytest.raises(CIInputErrors) as raised:
        _area(
            tmp_path,
            """\
            group: g
            steps:
              - label: a
                commands: pytest
              - label: b
                commands: [pytest]
                optional: "yes"
                concurrency: 1
            """,
        )
    messages = [str(error) for error in raised.value.errors]
    assert any("area.yaml:4" in m and "'commands' must be a list of strings" in m for m in messages)
    assert any("area.yaml:7" in m and "'optional' must be true or false" in m for m in messages)
    assert any("'concurrency' and 'concurrency_group' must be set together" in m for m in messages)


def test_step_fields_and_own_file_dependency(tmp_path):
    steps, _ = _area(
        tmp_path,
        """\
        group: Kernels
        depends_on: [image-build]
        steps:
          - label: "Kernels (GPU) 1/2"
            device: h200
            num_devices: 2
            parallelism: 2
            source_file_dependencies: [kernels/, "!kernels/docs/"]
            commands: [python -m pytest suites/kernels]
        """,
    )
    (step,) = steps
    assert step.key == "kernels-gpu-1-2"
    assert step.depends_on == ("image-build",)
    assert step.dependencies == ("kernels/", "!kernels/docs/", "area.yaml")
    assert step.passthrough == {"parallelism": 2}


@pytest.mark.parametrize(
    ("label", "key"),
    [
        ("CPU-Distributed Tests (PP+TP)", "cpu-distributed-tests-pp-tp"),
        (":nvidia: (H200 MIG 35GB) V1 Spec Decode", "-nvidia--h200-mig-35gb-v1-spec-decode"),
        ("Kernels (GPU) 1/2", "kernels-gpu-1-2"),
        ("LoRA 50%, v0.1", "lora-50--v0-1"),
    ],
    ids=["plus-becomes-dash", "colons-become-dashes", "slash", "percent-dropped-comma-dot"],
)
def test_derived_key_is_vllms(label, key):
    """ci-infra buildkite_step.py ``_generate_step_key``, character for character."""
    assert derive_step_key(label) == key


def test_mirrors_are_built_as_vllm_builds_them(tmp_path):
    write_tree(
        tmp_path,
        {
            "ci_config.yaml": "job_dirs: [areas]\nexternal_step_keys: [image-build, image-build-amd]\n",
            "areas/spec.yaml": """\
            group: Spec
            depends_on: [image-build]
            steps:
              - label: Spec decode
                key: spec
                device: h200
                timeout_in_minutes: 30
                source_file_dependencies: [kernels/]
                commands: [pytest spec]
                mirror:
                  amd:
                    device: mi300_1
                    timeout_in_minutes: 50
                    depends_on: [image-build]
                    source_file_dependencies: [kernels/, platforms/rocm.py]
              - label: Spec decode MI355
                device: h200
                commands: [pytest spec]
                mirror:
                  amd:
                    label: Spec decode on MI355
                    device: mi355_1
                    dind: false
            """,
        },
    )
    config = load_run_config(tmp_path / "ci_config.yaml", "ci_config.yaml")
    assert config.mirrors == ("amd",), "mirrors are emitted unless the configuration says not"
    parent, mirror, _, labelled = load_test_areas(config, tmp_path).steps
    assert (mirror.key, mirror.label, mirror.device, mirror.dind) == (
        "amd-spec",
        "AMD: Spec decode (mi300_1)",
        "mi300_1",
        True,
    )
    assert mirror.dependencies == ("kernels/", "platforms/rocm.py", "areas/spec.yaml")
    assert mirror.commands == parent.commands and mirror.depends_on == ("image-build-amd",)
    assert mirror.passthrough == {"timeout_in_minutes": 50}
    assert (labelled.key, labelled.label, labelled.dind) == (
        "amd-spec-decode-mi355",
        "Spec decode on MI355",
        False,
    )
    assert labelled.depends_on == ("image-build-amd",)


VLLM_0_34 = Path(__file__).parent / "data" / "vllm-buildkite-0.34.0"


def test_vllm_0_34_loads_with_its_config_through_the_cli():
    """Only --config: the repository root is found above .buildkite/ from its job_dirs."""
    result = run_cli("lint", "--config", str(VLLM_0_34 / ".buildkite/ci_config.yaml"))
    assert result.exit_code == 0, result.stderr
    assert "533 steps in 44 files: valid" in result.stdout
    assert "error" not in result.stderr


def test_vllm_0_34_every_file_is_loaded_and_the_intel_config_parses():
    yaml_files = {path.relative_to(VLLM_0_34).as_posix() for path in VLLM_0_34.rglob("*.yaml")}
    config = load_run_config(VLLM_0_34 / ".buildkite/ci_config.yaml")
    areas = load_test_areas(config, VLLM_0_34)
    configs = {f".buildkite/{name}" for name in ("ci_config.yaml", "ci_config_rocm.yaml")}
    assert set(areas.files) == yaml_files - configs - {".buildkite/ci_config_intel.yaml"}
    # The ROCm and Intel pipelines' configurations parse too; their steps live in the files
    # above (the Intel job_dirs is not part of the release).
    rocm = load_run_config(VLLM_0_34 / ".buildkite/ci_config_rocm.yaml")
    intel = load_run_config(VLLM_0_34 / ".buildkite/ci_config_intel.yaml")
    assert (rocm.job_dirs, intel.job_dirs) == (
        (".buildkite/hardware_tests",),
        (".buildkite/intel_jobs",),
    )


def test_vllm_0_34_keys_are_known_with_their_types():
    config = load_run_config(VLLM_0_34 / ".buildkite/ci_config.yaml")
    assert [pattern.pattern for pattern in config.amd_run_all_patterns] == ["csrc/"]
    areas = load_test_areas(config, VLLM_0_34).by_key()
    assert areas["zen-cpu-image-build"].agents == {"queue": "amd-cpu"}
    # The three unknown-key warnings are the legacy keys vLLM itself no longer reads.
    assert not [w for w in load_test_areas(config, VLLM_0_34).warnings if "unknown key" in w]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("automatic_shard: yes-please", "'automatic_shard' must be true or false"),
        ("agents: [amd-cpu]", "'agents' must be a mapping of strings to strings"),
    ],
    ids=["automatic-shard", "agents"],
)
def test_new_vllm_keys_are_type_checked(tmp_path, line, message):
    with pytest.raises(CIInputError, match=f"area.yaml:5: step 'a': {message}"):
        _area(tmp_path, f"group: g\nsteps:\n  - label: a\n    commands: [pytest]\n    {line}\n")


UPSTREAM_KEY_AREA = "group: g\nsteps:\n  - label: a\n    commands: [pytest]\n    shiny_new: 1\n"


def test_unknown_key_warns_with_file_line_and_key_under_warn(tmp_path):
    steps, warnings = _area(tmp_path, UPSTREAM_KEY_AREA, KeyPolicy(unknown_keys="warn"))
    assert [step.key for step in steps] == ["a"]
    assert warnings == [
        "area.yaml:5: step 'a': unknown key 'shiny_new' is ignored (unknown_keys: warn)"
    ]


def test_unknown_key_is_an_error_under_error(tmp_path):
    with pytest.raises(CIInputError, match=r"area\.yaml:5: step 'a': unknown key 'shiny_new'"):
        _area(tmp_path, UPSTREAM_KEY_AREA, STRICT)


def test_this_projects_configuration_is_strict():
    config = load_run_config(REPO_ROOT / ".buildkite/ci_config.yaml")
    assert (config.unknown_keys, config.legacy_keys) == ("error", "error")


def test_run_config_unknown_key_warns_by_default_and_fails_when_strict(tmp_path):
    write_tree(tmp_path, {"loose.yaml": "job_dirs: [a]\nnew_knob: 1\n"})
    assert load_run_config(tmp_path / "loose.yaml", "loose.yaml").warnings == (
        "loose.yaml:2: ci_config: unknown key 'new_knob' is ignored (unknown_keys: warn)",
    )
    write_tree(tmp_path, {"strict.yaml": "job_dirs: [a]\nunknown_keys: error\nnew_knob: 1\n"})
    with pytest.raises(CIInputError, match=r"strict\.yaml:3: ci_config: unknown key 'new_knob'"):
        load_run_config(tmp_path / "strict.yaml", "strict.yaml")


def test_a_failing_file_does_not_make_references_into_it_dangling(tmp_path):
    write_tree(
        tmp_path,
        {
            "ci_config.yaml": "job_dirs: [areas]\nunknown_keys: error\n",
            "areas/build.yaml": """\
            steps:
              - label: Build image
                timeout_in_minutes: soon
                commands: [make]
            """,
            "areas/tests.yaml": """\
            depends_on: [build-image]
            steps:
              - label: Tests
                commands: [pytest]
              - label: Typo
                depends_on: [biuld-image]
                commands: [pytest]
            """,
        },
    )
    config = load_run_config(tmp_path / "ci_config.yaml", "ci_config.yaml")
    with pytest.raises(CIInputErrors) as raised:
        load_test_areas(config, tmp_path)
    messages = [str(error) for error in raised.value.errors]
    assert len(messages) == 2, messages
    assert "areas/build.yaml:3: step 'Build image': 'timeout_in_minutes'" in messages[0]
    assert "depends_on 'biuld-image' names no step" in messages[1]


def test_an_unparsable_file_suspends_the_reference_check_and_says_so(tmp_path):
    write_tree(
        tmp_path,
        {
            "ci_config.yaml": "job_dirs: [areas]\n",
            "areas/build.yaml": "steps: [\n",
            "areas/tests.yaml": "steps:\n  - label: T\n    depends_on: [build]\n    commands: [x]\n",
        },
    )
    result = run_cli("lint", "--repo", str(tmp_path), "--config", "ci_config.yaml")
    assert result.exit_code == 2
    assert "areas/build.yaml:2: invalid YAML" in result.stderr
    assert "names no step" not in result.stderr
    assert "depends_on references were not checked" in result.stderr


@pytest.mark.parametrize(
    ("config_argument", "message"),
    [(".", "is a directory; pass its ci_config.yaml"), ("nope.yaml", "does not exist")],
    ids=["directory", "missing"],
)
def test_config_argument_errors_say_what_is_wrong(tmp_path, config_argument, message):
    result = run_cli("lint", "--repo", str(tmp_path), "--config", str(tmp_path / config_argument))
    assert result.exit_code == 2 and message in result.stderr
    assert "Traceback" not in result.stderr
