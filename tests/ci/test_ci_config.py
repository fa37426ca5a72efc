"""Strict loading of vLLM-format test areas: every vLLM fixture loads, mistakes are caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from ci.areas import load_test_areas
from ci.config import (
    KeyPolicy,
    derive_step_key,
    load_run_config,
    load_test_area_file,
)
from ci.errors import CIInputError, CIInputErrors
from tests.ci.helpers import write_tree

FIXTURES = Path(__file__).parent / "data" / "vllm-buildkite"
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


def test_unknown_key_names_file_line_and_near_miss(tmp_path):
    with pytest.raises(CIInputError) as raised:
        _area(
            tmp_path,
            """\
            group: g
            steps:
              - label: a
                commands: [pytest]
                num_gpus: 2
            """,
        )
    assert str(raised.value) == (
        "area.yaml:5: step 'a': unknown key 'num_gpus' (did you mean 'num_devices'?)"
    )


def test_misspelt_key_gets_difflib_suggestion(tmp_path):
    with pytest.raises(
        CIInputError, match=r"area.yaml:5: .*'timeout_in_minute'.*'timeout_in_minutes'"
    ):
        _area(
            tmp_path,
            """\
            group: g
            steps:
              - label: a
                commands: [pytest]
                timeout_in_minute: 3
            """,
        )


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
