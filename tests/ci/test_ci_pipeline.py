"""Buildkite emission: only Buildkite keys, validated step by step against the official schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from attngroup.ci.areas.config import RunConfig, TestAreas, load_test_area_file
from attngroup.ci.errors import CIInputError
from attngroup.ci.selection.buildkite_schema import load_schema, validate_pipeline
from attngroup.ci.selection.changes import ChangeSet
from attngroup.ci.selection.pipeline import (
    build_pipeline,
    checked_uploads,
    count_steps,
    split_uploads,
)
from attngroup.ci.selection.select_steps import Knobs, select_steps
from tests.ci.helpers import RUN_CONFIG, init_repo, run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "data" / "vllm-buildkite"


def _assert_schema_valid(document: dict) -> None:
    """Whole-document validation with the official schema, then step by step for precision."""
    jsonschema.Draft7Validator(load_schema()).validate(document)
    assert validate_pipeline(document) == []


def test_schema_comes_from_the_buildkite_sdk_package():
    schema = load_schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert "commandStep" in schema["definitions"]


@pytest.mark.parametrize("output_format", ["yaml", "json"])
def test_pipeline_of_this_repository_passes_the_official_schema(output_format):
    done = subprocess.run(
        [sys.executable, "-m", "attngroup.ci", "pipeline", "--all", "--format", output_format],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document = yaml.safe_load(done.stdout) if output_format == "yaml" else json.loads(done.stdout)
    _assert_schema_valid(document)
    keys = [step["key"] for group in document["steps"] for step in group["steps"]]
    assert {"spec-decode-cpu", "spec-decode-gpu-mtp", "kernels-cpu", "kernels-gpu"} <= set(keys)


AREA = """\
group: Spec
steps:
  - label: "Spec MTP %N"
    key: spec-mtp
    device: h200
    num_devices: 2
    parallelism: 2
    soft_fail: true
    retry:
      automatic:
        - exit_status: -1
          limit: 1
    env:
      SHARD: 1
    working_dir: suites
    source_file_dependencies: [kernels/]
    commands:
      - python -m pytest spec -k "shard_$$BUILDKITE_PARALLEL_JOB"
  - label: Docs
    key: docs
    device: cpu
    optional: true
    source_file_dependencies: [docs/]
    commands: [make docs]
"""


@pytest.fixture
def emitted(tmp_path):
    config = RunConfig(
        path="ci_config.yaml",
        job_dirs=("areas",),
        device_agents={
            "h200": {"queue": "gpu"},
            "h200:2": {"queue": "gpu-x2"},
            "cpu": {"queue": "cpu"},
        },
    )
    (tmp_path / "spec.yaml").write_text(AREA)
    steps, _ = load_test_area_file(tmp_path / "spec.yaml", "areas/spec.yaml", "error")
    areas = TestAreas(tuple(steps), ("areas/spec.yaml",))
    changes = ChangeSet("main", "HEAD", "abc", ("kernels/registry.py",))
    selection = select_steps(areas, config, changes, Knobs())
    return areas, selection, config


def test_selected_step_passes_buildkite_fields_through(emitted):
    areas, selection, config = emitted
    document = build_pipeline(areas, selection, config)
    _assert_schema_valid(document)
    step = document["steps"][0]["steps"][0]
    assert step == {
        "label": "Spec MTP %N",
        "key": "spec-mtp",
        "commands": ["cd suites", 'python -m pytest spec -k "shard_$$BUILDKITE_PARALLEL_JOB"'],
        "agents": {"queue": "gpu-x2"},
        "soft_fail": True,
        "retry": {"automatic": [{"exit_status": -1, "limit": 1}]},
        "parallelism": 2,
        "env": {"SHARD": "1"},
    }
    assert "$$BUILDKITE_PARALLEL_JOB" in yaml.safe_dump(document)


def test_unselected_steps_sit_behind_a_block_or_are_left_out(emitted):
    areas, selection, config = emitted
    blocked = build_pipeline(areas, selection, config, "block")["steps"][0]["steps"]
    assert blocked[1] == {
        "block": "Run Docs",
        "key": "block-docs",
        "prompt": "Not selected: optional step: runs only with NIGHTLY=1",
    }
    assert blocked[2]["depends_on"] == ["block-docs"] and blocked[2]["key"] == "docs"
    omitted = build_pipeline(areas, selection, config, "omit")["steps"][0]["steps"]
    assert [step["key"] for step in omitted] == ["spec-mtp"]


def test_internal_keys_never_leak(emitted):
    areas, selection, config = emitted
    text = yaml.safe_dump(build_pipeline(areas, selection, config, "block"))
    for internal in (
        "source_file_dependencies",
        "device",
        "num_devices",
        "working_dir",
        "optional",
        "mirror",
        "no_gpu",
    ):
        assert f"{internal}:" not in text


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (
            {"label": "x", "commands": ["true"], "source_file_dependencies": ["a/"]},
            "Additional properties are not allowed ('source_file_dependencies' was unexpected)",
        ),
        (
            {"label": "x", "commands": ["true"], "timeout_in_minutes": "30"},
            "'30' is not of type 'integer' at timeout_in_minutes",
        ),
        ({"block": "Run x", "key": "has space"}, "'has space' does not match"),
        ({"label": "x"}, "not a recognisable Buildkite step"),
    ],
    ids=["leaked-key", "string-timeout", "bad-block-key", "unknown-step-type"],
)
def test_schema_errors_are_precise(step, message):
    errors = validate_pipeline({"steps": [{"group": "G", "steps": [step]}]})
    assert any(message in error for error in errors), errors
    with pytest.raises(CIInputError, match="fails Buildkite's schema"):
        checked_uploads({"steps": [step]})


def test_uploads_are_split_at_500_steps_without_splitting_groups():
    group = {"group": "G", "steps": [{"label": f"s{i}", "commands": ["true"]} for i in range(99)]}
    pipeline = {"steps": [group] * 12}
    uploads = split_uploads(pipeline)
    assert [count_steps(upload) for upload in uploads] == [500, 500, 200]
    oversized = {"group": "big", "steps": [{"label": "s", "commands": ["true"]}] * 500}
    with pytest.raises(CIInputError, match="group 'big' has 501 steps; one upload takes 500"):
        split_uploads({"steps": [oversized]})


def test_vllm_spec_decode_fixture_emits_a_valid_pipeline():
    relative = ".buildkite/test_areas/spec_decode.yaml"
    steps, _ = load_test_area_file(FIXTURES / relative, relative)
    areas = TestAreas(tuple(steps), (relative,))
    config = RunConfig(path="ci_config.yaml", job_dirs=(".buildkite/test_areas",))
    changes = ChangeSet("main", "HEAD", "abc", ("vllm/v1/attention/backends/flash_attn.py",))
    selection = select_steps(areas, config, changes)
    document = build_pipeline(areas, selection, config)
    _assert_schema_valid(document)
    assert "spec-decode-mtp-gemma4" in selection.selected_keys()
    assert "spec-decode-eagle-1-deepseek-qwen" not in selection.selected_keys()


def test_pipeline_output_file_is_written_atomically(tmp_path):
    repo = init_repo(
        tmp_path / "repo",
        {
            ".buildkite/ci_config.yaml": RUN_CONFIG,
            ".buildkite/test_areas/a.yaml": AREA.replace("    working_dir: suites\n", ""),
        },
    )
    output = tmp_path / "out" / "pipeline.json"
    output.parent.mkdir()
    result = run_cli(
        "pipeline",
        "--repo",
        str(repo),
        "--base",
        "HEAD",
        "--format",
        "json",
        "--output",
        str(output),
    )
    assert result.exit_code == 0, result.stderr
    _assert_schema_valid(json.loads(output.read_text()))
    assert [path.name for path in output.parent.iterdir()] == ["pipeline.json"]
    # An empty diff selects nothing; both steps wait behind blocks.
    assert [step.get("block") for step in json.loads(output.read_text())["steps"][0]["steps"]][
        ::2
    ] == ["Run Spec MTP %N", "Run Docs"]


def test_lint_passes_here_and_strict_rejects_legacy_keys(tmp_path):
    assert run_cli("lint", "--repo", str(REPO_ROOT)).exit_code == 0
    repo = init_repo(
        tmp_path / "repo",
        {
            ".buildkite/ci_config.yaml": RUN_CONFIG.replace(
                "legacy_keys: error", "legacy_keys: warn"
            ),
            ".buildkite/test_areas/a.yaml": AREA.replace(
                "    parallelism: 2\n", "    num_gpus: 2\n"
            ),
        },
    )
    assert run_cli("lint", "--repo", str(repo)).exit_code == 0
    strict = run_cli("lint", "--repo", str(repo), "--strict")
    assert strict.exit_code == 2
    assert "legacy key 'num_gpus'" in strict.stderr


def test_omit_keeps_an_unselected_dependency_behind_its_block():
    from tests.ci.test_ci_selection import AREAS, CONFIG

    selection = select_steps(AREAS, CONFIG, ChangeSet("main", "HEAD", "b", ("kernels/x.py",)))
    assert "build" not in selection.selected_keys()  # kernels depends on it
    document = build_pipeline(AREAS, selection, CONFIG, "omit")
    _assert_schema_valid(document)
    keys = [step["key"] for step in document["steps"][0]["steps"]]
    assert keys == ["block-build", "build", "kernels", "spec-decode"]
