"""Selection on vLLM 0.34.0's own CI files matches vLLM's pipeline generator.

Two checks per change: the harness agrees with ``vllm_generator_selection`` (a literal
transcription of vllm-project/ci-infra main at commit 3e4cfe4, ``buildkite/pipeline_generator/``: step.py
``read_steps_from_job_dir``, buildkite_step.py ``_step_should_run`` / ``_generate_step_key`` /
mirror creation, amd.py ``_amd_mirror_should_run`` / ``normalize_amd_depends_on``,
global_config.py ``_should_run_all``, pipeline_generator.py ``is_docs_only_change``), which reads
the raw YAML with nothing from ``ci``; and hand-checked facts about the result.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from attngroup.ci.areas.config import load_run_config
from attngroup.ci.areas.load import load_test_areas
from attngroup.ci.selection.changes import ChangeSet
from attngroup.ci.selection.select_steps import Knobs, select_steps
from tests.ci.helpers import write_tree

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
VLLM_0_34 = Path(__file__).parent / "data" / "vllm-buildkite-0.34.0"
ALWAYS_RUN = {
    "image-build",
    "image-build-smoke-test",
    "image-build-cpu",
    "image-build-hpu",
    "image-build-xpu",
    "image-build-amd",
    "refresh-rocm-base-amd",
}


def _generate_step_key(label: str) -> str:
    key = label.replace(" ", "-").lower()
    for dropped in "()%":
        key = key.replace(dropped, "")
    for dashed in ",+:./":
        key = key.replace(dashed, "-")
    return key


def _matches(dependencies: list[str] | None, files: list[str]) -> bool:
    def under(entry: str, path: str) -> bool:
        entry = entry.rstrip("/")
        return bool(entry) and (path == entry or path.startswith(f"{entry}/"))

    includes = [entry for entry in dependencies or [] if not entry.startswith("!")]
    excludes = [entry[1:] for entry in dependencies or [] if entry.startswith("!")]
    return any(
        any(under(entry, path) for entry in includes)
        and not any(under(entry, path) for entry in excludes)
        for path in files
    )


# amd.py AMD_DEVICE_CONFIGS at 3e4cfe4 (mi355_dpx, used by vLLM 0.34.0, is not among them).
AMD_DEVICE_CONFIGS = {f"mi{gpu}_{count}" for gpu in (250, 300, 325, 355) for count in (1, 2, 4, 8)}


def _is_amd_gpu(device: str | None) -> bool:
    return device in AMD_DEVICE_CONFIGS


def vllm_generator_selection(root: Path, files: list[str]) -> set[str]:
    """Keys vLLM's generator runs (not blocked) for ``files`` changed, NIGHTLY=0, RUN_ALL=0."""
    config = yaml.load((root / ".buildkite/ci_config.yaml").read_text(), Loader=LOADER)

    def run_all_for(patterns: list[str]) -> bool:
        return any(
            any(re.match(pattern, path) for pattern in patterns)
            and not any(re.match(pattern, path) for pattern in config["run_all_exclude_patterns"])
            for path in files
        )

    run_all = run_all_for(config["run_all_patterns"])  # amd_run_all_patterns: not read
    docs = [
        p.startswith("docs/") or p.endswith(".md") or p in {"mkdocs.yml", "mkdocs.yaml"}
        for p in files
    ]
    if not run_all and docs and all(docs):
        return set()

    steps = []
    for job_dir in config["job_dirs"]:
        for directory, _, names in os.walk(root / job_dir):
            for name in (n for n in names if n.endswith(".yaml")):
                path = Path(directory) / name
                data = yaml.load(path.read_text(), Loader=LOADER)
                for step in data.get("steps") or []:
                    step = dict(step)
                    if data.get("depends_on"):
                        step["depends_on"] = step.get("depends_on") or data["depends_on"]
                        step["source_file_dependencies"] = [
                            *(step.get("source_file_dependencies") or []),
                            path.relative_to(root).as_posix(),
                        ]
                    steps.append(step)

    def should_run(step: dict, key: str | None) -> bool:
        if key and (
            key.startswith("image-build") or key in {"ensure-ci-base-amd", "refresh-rocm-base-amd"}
        ):
            return True
        if step.get("optional"):
            return False
        if (
            _is_amd_gpu(step.get("device"))
            and not step.get("dind")
            and ".buildkite/scripts/hardware_ci/run-amd-test.sh" in files
        ):
            return True
        if run_all:
            return True
        return _matches(step.get("source_file_dependencies"), files)

    selected = set()
    for step in steps:
        key = step.get("key") or _generate_step_key(step["label"])
        if should_run(step, step.get("key")):
            selected.add(key)
        amd = (step.get("mirror") or {}).get("amd")
        if amd:
            effective = {
                **step,
                "device": amd["device"],
                "dind": amd.get("dind", True),
                "optional": amd.get("optional", step.get("optional")),
                "source_file_dependencies": [
                    *(amd.get("source_file_dependencies") or []),
                    *(step.get("source_file_dependencies") or []),
                ],
            }
            if should_run(effective, None) or "docker/Dockerfile.rocm_base" in files:
                selected.add(f"amd-{key}")
    return selected  # depends_on are pulled only for ONLY_STEP_KEYS


@pytest.fixture(scope="module")
def vllm_areas():
    config = load_run_config(VLLM_0_34 / ".buildkite/ci_config.yaml")
    return config, load_test_areas(config, VLLM_0_34)


def _selected(vllm_areas, files: list[str]) -> set[str]:
    config, areas = vllm_areas
    selection = select_steps(areas, config, ChangeSet("main", "HEAD", "base", tuple(files)))
    return selection.selected_keys()


BACKENDS = "vllm/v1/attention/backends"
CHANGES = {
    "backend-triton": [f"{BACKENDS}/triton_attn.py"],
    "backend-flash": [f"{BACKENDS}/flash_attn.py"],
    "backend-flashinfer": [f"{BACKENDS}/flashinfer.py"],
    "three-backends": [
        f"{BACKENDS}/{name}.py" for name in ("triton_attn", "flash_attn", "flashinfer")
    ],
    "v2-attn-utils": ["vllm/v1/worker/gpu/attn_utils.py"],
    "v2-spec-decode-init": ["vllm/v1/worker/gpu/spec_decode/__init__.py"],
    "speculative-config": ["vllm/config/speculative.py"],
    "model-gemma4-mtp": ["vllm/model_executor/models/gemma4_mtp.py"],
    "model-qwen3-next": ["vllm/model_executor/models/qwen3_next.py"],
    "model-llama-eagle": ["vllm/model_executor/models/llama_eagle.py"],
    "platform-rocm": ["vllm/platforms/rocm.py"],
    "kv-transfer-excluded": ["vllm/distributed/kv_transfer/__init__.py"],
    "api-server": ["vllm/entrypoints/openai/api_server.py"],
    "kv-cache-utils": ["vllm/v1/core/kv_cache_utils.py"],
    "eagle-proposer": ["vllm/v1/spec_decode/eagle.py"],
    "test-eagle": ["tests/v1/spec_decode/test_eagle.py"],
    "test-attention-selector": ["tests/kernels/attention/test_attention_selector.py"],
    "test-new": ["tests/v1/spec_decode/test_new_proposer.py"],
    "test-renamed": ["tests/v1/core/test_kv_cache_utils.py", "tests/v1/core/test_kv_cache_util.py"],
    "tests-conftest": ["tests/conftest.py"],
    "deleted-backend": [f"{BACKENDS}/flex_attention.py"],
    "docs-readme": ["docs/README.md"],
    "root-readme": ["README.md"],
    "mkdocs": ["mkdocs.yaml"],
    "docs-only": ["docs/usage/faq.md", "README.md"],
    "docs-and-code": ["docs/usage/faq.md", "vllm/config/speculative.py"],
    "test-area-yaml": [".buildkite/test_areas/spec_decode.yaml"],
    "hardware-cpu-yaml": [".buildkite/hardware_tests/cpu.yaml"],
    "image-build-yaml": [".buildkite/image_build/image_build.yaml"],
    "ci-config": [".buildkite/ci_config.yaml"],
    "amd-test-wrapper": [".buildkite/scripts/hardware_ci/run-amd-test.sh"],
    "cmakelists": ["CMakeLists.txt"],
    "cmake-hipify": ["cmake/hipify.py"],
    "csrc-cache-kernels": ["csrc/cache_kernels.cu"],
    "csrc-cpu": ["csrc/cpu/attention.cpp"],
    "csrc-rocm": ["csrc/rocm/attention.cu"],
    "requirements-common": ["requirements/common.txt"],
    "requirements-rocm": ["requirements/rocm.txt"],
    "requirements-test-cuda": ["requirements/test/cuda.txt"],
    "dockerfile": ["docker/Dockerfile"],
    "dockerfile-rocm": ["docker/Dockerfile.rocm"],
    "rocm-base-dockerfile": ["docker/Dockerfile.rocm_base"],
    "setup-py": ["setup.py"],
    "pyproject": ["pyproject.toml"],
}


def test_the_table_holds_at_least_40_changes():
    assert len(CHANGES) >= 40


@pytest.mark.parametrize("files", CHANGES.values(), ids=CHANGES.keys())
def test_selection_matches_vllms_generator(vllm_areas, files):
    assert _selected(vllm_areas, files) == vllm_generator_selection(VLLM_0_34, files)


def test_docs_only_runs_nothing(vllm_areas):
    assert _selected(vllm_areas, CHANGES["docs-only"]) == set()


def test_hardware_cpu_yaml_runs_only_what_names_it(vllm_areas):
    """cpu.yaml's group depends_on is empty: its own file is no dependency of its steps."""
    selected = _selected(vllm_areas, CHANGES["hardware-cpu-yaml"])
    assert selected == ALWAYS_RUN | {"zen-cpu-image-build"}  # lists cpu.yaml explicitly


def test_test_area_yaml_runs_its_non_optional_steps_and_their_mirrors(vllm_areas):
    _, areas = vllm_areas
    in_file = [s for s in areas.steps if s.file == ".buildkite/test_areas/spec_decode.yaml"]
    expected = {step.key for step in in_file if not step.optional}
    selected = _selected(vllm_areas, CHANGES["test-area-yaml"])
    assert selected - ALWAYS_RUN == expected
    assert {"v1-spec-decode", "amd-v1-spec-decode", "spec-decode-draft-model"} <= expected
    assert len(expected) == 18 and len(in_file) == 37  # 9 + 9 mirrors run, of 19 + 18 mirrors


def test_backend_change_runs_the_spec_decode_steps(vllm_areas):
    selected = _selected(vllm_areas, CHANGES["backend-flash"])
    assert {"v1-spec-decode", "amd-v1-spec-decode", "spec-decode-mtp-gemma4"} <= selected
    assert "cpu-kernel-tests" not in selected  # lists only the AMX MLA backend file


def test_rocm_base_dockerfile_runs_every_amd_mirror_optional_ones_too(vllm_areas):
    _, areas = vllm_areas
    mirrors = {step.key for step in areas.steps if step.mirror_target == "amd"}
    selected = _selected(vllm_areas, CHANGES["rocm-base-dockerfile"])
    assert mirrors <= selected and any(s.optional for s in areas.steps if s.key in mirrors)
    assert "v1-spec-decode" not in selected


def test_cmakelists_runs_every_non_optional_step(vllm_areas):
    _, areas = vllm_areas
    selected = _selected(vllm_areas, CHANGES["cmakelists"])
    assert {step.key for step in areas.steps if not step.optional} <= selected


def test_amd_run_all_patterns_does_not_run_every_amd_step(vllm_areas):
    """0.34.0's config lists csrc/ in amd_run_all_patterns; ci-infra main (3e4cfe4) never reads
    the key, so a csrc/ change runs only the steps whose entries name it."""
    _, areas = vllm_areas
    selected = _selected(vllm_areas, CHANGES["csrc-cache-kernels"])
    assert "amd-v1-spec-decode" not in selected and "v1-spec-decode" not in selected
    amd = {s.key for s in areas.steps if s.mirror_target == "amd" and not s.optional}
    assert selected & amd < amd


def test_amd_test_wrapper_runs_native_amd_gpu_steps_but_not_mi355_dpx(vllm_areas):
    _, areas = vllm_areas
    selected = _selected(vllm_areas, CHANGES["amd-test-wrapper"])
    native = {
        s.key
        for s in areas.steps
        if s.device in AMD_DEVICE_CONFIGS and not s.dind and not s.optional
    }
    dpx = {s.key for s in areas.steps if s.device == "mi355_dpx"}
    assert native and native <= selected
    assert dpx and not dpx & selected


def test_only_step_keys_takes_the_key_vllm_derives(tmp_path):
    write_tree(
        tmp_path,
        {
            "ci_config.yaml": "job_dirs: [areas]\n",
            "areas/cpu.yaml": "steps:\n  - label: CPU-Distributed Tests (PP+TP)\n    commands: [x]\n",
        },
    )
    config = load_run_config(tmp_path / "ci_config.yaml", "ci_config.yaml")
    areas = load_test_areas(config, tmp_path)
    knobs = Knobs(only_step_keys=("cpu-distributed-tests-pp-tp",))
    selection = select_steps(areas, config, ChangeSet("main", "HEAD", "base", ()), knobs)
    assert selection.selected_keys() == {"cpu-distributed-tests-pp-tp"}


@pytest.mark.parametrize(
    ("only_step_keys", "expected"),
    [
        (("amd-spec",), {"amd-spec", "prep"}),
        (("amd-spec", "spec"), {"amd-spec", "spec", "prep"}),
    ],
    ids=["mirror-key-alone", "mirror-and-parent"],
)
def test_only_step_keys_takes_amd_mirror_keys(tmp_path, only_step_keys, expected):
    """ci-infra PR #520: a /ci retry forwards a failed mirror's key ``amd-<key>``; the generator
    indexed only keys declared in the YAML, so bootstrap died with ``Unknown CI step key(s)``.
    The mirror and the steps it depends on are selected; its NVIDIA parent only when named."""
    write_tree(
        tmp_path,
        {
            "ci_config.yaml": "job_dirs: [areas]\nexternal_step_keys: [image-build-amd]\n",
            "areas/spec.yaml": """\
            steps:
              - label: Prep
                key: prep
                commands: [x]
              - label: Spec decode
                key: spec
                device: h200
                commands: [pytest spec]
                mirror:
                  amd:
                    device: mi300_1
                    depends_on: [prep]
            """,
        },
    )
    config = load_run_config(tmp_path / "ci_config.yaml", "ci_config.yaml")
    areas = load_test_areas(config, tmp_path)
    knobs = Knobs(only_step_keys=only_step_keys)
    selection = select_steps(areas, config, ChangeSet("main", "HEAD", "base", ()), knobs)
    assert selection.selected_keys() == expected
