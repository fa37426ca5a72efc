"""Every kind of bad input gives a clear error, exit code 2, and no output file."""

from __future__ import annotations

import pytest

from tests.ci.helpers import RUN_CONFIG, init_repo, run_cli

GOOD_AREA = """\
group: G
steps:
  - label: Unit
    key: unit
    device: cpu
    source_file_dependencies: [src/]
    commands: [python -m pytest tests]
"""


def _step_with(extra: str) -> str:
    return GOOD_AREA + "".join(f"    {line}\n" for line in extra.splitlines())


# (id, files replacing the good repository's, command arguments, environment, expected message)
CASES = [
    (
        "bad-yaml",
        {".buildkite/test_areas/a.yaml": "group: [unclosed\n"},
        (),
        {},
        ".buildkite/test_areas/a.yaml:2: invalid YAML",
    ),
    (
        "unknown-key",
        {".buildkite/test_areas/a.yaml": _step_with("num_gpus: 2")},
        (),
        {},
        ".buildkite/test_areas/a.yaml:8: step 'Unit': unknown key 'num_gpus' (did you mean 'num_devices'?)",
    ),
    (
        "wrong-type",
        {".buildkite/test_areas/a.yaml": _step_with('timeout_in_minutes: "30"')},
        (),
        {},
        "'timeout_in_minutes' must be an integer >= 1, got '30'",
    ),
    (
        "duplicate-yaml-key",
        {".buildkite/test_areas/a.yaml": _step_with("device: h200")},
        (),
        {},
        ".buildkite/test_areas/a.yaml:8: duplicate key 'device' (first defined on line 5)",
    ),
    (
        "duplicate-step-key",
        {".buildkite/test_areas/b.yaml": GOOD_AREA},
        (),
        {},
        ".buildkite/test_areas/b.yaml:3: duplicate step key 'unit': also defined at .buildkite/test_areas/a.yaml:3",
    ),
    (
        "dangling-depends-on",
        {".buildkite/test_areas/a.yaml": _step_with("depends_on: [unti]")},
        (),
        {},
        "step 'unit': depends_on 'unti' names no step (did you mean 'unit'?)",
    ),
    (
        "invalid-regex",
        {".buildkite/ci_config.yaml": RUN_CONFIG.replace('"setup\\\\.py$"', '"csrc/("')},
        (),
        {},
        "run_all_patterns: invalid regular expression 'csrc/('",
    ),
    ("missing-base-ref", {}, ("--no-base",), {}, "missing base ref: pass --base REF"),
    (
        "malformed-base-ref",
        {},
        ("--base=--upload-pack=evil",),
        {},
        "base '--upload-pack=evil' is not a valid git revision",
    ),
    ("bad-knob", {}, (), {"RUN_ALL": "yes"}, "RUN_ALL must be 0 or 1, got 'yes'"),
    (
        "unknown-only-step-key",
        {},
        (),
        {"ONLY_STEP_KEYS": '["unti"]'},
        "ONLY_STEP_KEYS names unknown steps ['unti'] (did you mean 'unit'?)",
    ),
    (
        "only-step-keys-not-json",
        {},
        (),
        {"ONLY_STEP_KEYS": '["unit"'},
        "ONLY_STEP_KEYS is not a JSON list",
    ),
    (
        "unmapped-device",
        {".buildkite/test_areas/a.yaml": GOOD_AREA.replace("cpu", "tpu")},
        (),
        {},
        "device 'tpu' has no entry in device_agents of .buildkite/ci_config.yaml (known: cpu, h200)",
    ),
    (
        "concurrency-without-group",
        {".buildkite/test_areas/a.yaml": _step_with("concurrency: 1")},
        (),
        {},
        "'concurrency' and 'concurrency_group' must be set together",
    ),
    (
        "steps-not-a-list",
        {".buildkite/test_areas/a.yaml": "group: G\nsteps: {label: x}\n"},
        (),
        {},
        ".buildkite/test_areas/a.yaml:2: file: 'steps' must be a list of steps",
    ),
    ("missing-config", {}, ("--config", "nope.yaml"), {}, "nope.yaml does not exist"),
    (
        "unknown-config-key",
        {".buildkite/ci_config.yaml": RUN_CONFIG + "job_dir: [x]\n"},
        (),
        {},
        "unknown key 'job_dir' (did you mean 'job_dirs'?)",
    ),
]


@pytest.mark.parametrize(
    ("files", "arguments", "environment", "message"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_input_exits_2_with_clear_error_and_writes_nothing(
    tmp_path, monkeypatch, files, arguments, environment, message
):
    repo = init_repo(
        tmp_path / "repo",
        {
            ".buildkite/ci_config.yaml": RUN_CONFIG,
            ".buildkite/test_areas/a.yaml": GOOD_AREA,
            "src/x.py": "",
            **files,
        },
    )
    for name in ("RUN_ALL", "NIGHTLY", "ONLY_STEP_KEYS", "DOCS_ONLY_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    output = tmp_path / "pipeline.yaml"
    base = (
        () if any(a.startswith(("--no-base", "--base")) for a in arguments) else ("--base", "HEAD")
    )
    extra = tuple(argument for argument in arguments if argument != "--no-base")
    result = run_cli("pipeline", "--repo", str(repo), *base, *extra, "--output", str(output))
    assert result.exit_code == 2, result
    assert message in result.stderr
    assert not output.exists()
    assert not list(tmp_path.glob("pipeline*"))


def test_argparse_usage_errors_also_exit_2(tmp_path):
    result = run_cli("select", "--repo", str(tmp_path))
    assert result.exit_code == 2
    assert "the following arguments are required: --base" in result.stderr
