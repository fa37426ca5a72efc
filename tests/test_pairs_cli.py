"""`python -m attngroup.reference_engine inspect` / `generate` with pairs from config files
(`--target-config` ...) and from a pairs file (`--pairs`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attngroup.reference_engine.__main__ import main

pytestmark = pytest.mark.grouping

ROOT = Path(__file__).parents[1]
SHIPPED = ROOT / "attngroup" / "reference_engine" / "configs"
E2B = [
    "--target-config",
    str(SHIPPED / "gemma-4-E2B-it" / "config.json"),
    "--draft-config",
    str(SHIPPED / "gemma-4-E2B-it-assistant" / "config.json"),
    "--method",
    "mtp",
]
REGRESSION_PAIRS = str(ROOT / "attngroup" / "suites" / "data" / "regression_pairs.yaml")


def test_inspect_configs_legacy_prints_the_collision_and_the_scaling(capsys):
    assert main(["inspect", *E2B, "--policy", "legacy"]) == 1
    out = capsys.readouterr().out
    assert "must share num_heads; got {8, 4} for [" in out
    assert "8+4 q heads  <-- COLLISION" in out
    assert "target num_hidden_layers            35 -> 10" in out
    assert "target num_kv_shared_layers         20 -> 5" in out


def test_inspect_configs_split_gives_the_draft_its_own_groups(capsys):
    assert main(["inspect", *E2B, "--policy", "split", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["error"] is None
    draft_groups = [
        attn
        for kv_group in report["kv_cache_groups"]
        for attn in kv_group["attention_groups"]
        if any(name.startswith("draft_model") for name in attn["layers"])
    ]
    assert len(draft_groups) == 2
    for attn in draft_groups:
        assert attn["num_heads_q"] == 4
        assert all(name.startswith("draft_model") for name in attn["layers"])
    scaled = {(s["model"], s["field"]): (s["real"], s["tiny"]) for s in report["scaling"]}
    assert scaled["target", "hidden_size"] == (1536, 256)


def test_inspect_pair_from_a_pairs_file(capsys):
    assert main(["inspect", "qwen3-window8-draft", "--pairs", REGRESSION_PAIRS]) == 0
    out = capsys.readouterr().out
    assert "SlidingWindowSpec(block 16, num kv heads 2, head size 16, sliding window 8" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["inspect", *E2B[:2]], "go together"),
        (["inspect"], "name a PAIR"),
        (["inspect", "x", "--pairs", "no/such.yaml"], "no/such.yaml: no such pairs file"),
        (["generate", "x", "--pairs", "no/such.yaml"], "no/such.yaml: no such pairs file"),
    ],
    ids=["configs-incomplete", "nothing-named", "inspect-missing-file", "generate-missing-file"],
)
def test_bad_pair_arguments_exit_2_naming_the_problem(capsys, argv, expected):
    assert main(argv) == 2
    assert expected in capsys.readouterr().err


def test_bad_pairs_file_exits_2_with_file_and_field(tmp_path, capsys):
    path = tmp_path / "pairs.yaml"
    path.write_text("pairs:\n  - {name: a, target: t.json, draft: d.json, method: medusa}\n")
    assert main(["inspect", "a", "--pairs", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: pairs[0].target:" in err


@pytest.mark.parametrize("field", ["draft_kv", "backend", "description"])
def test_pairs_file_field_present_but_empty_exits_2_naming_it(tmp_path, capsys, field):
    """An empty value is refused, not read as "use the default"."""
    configs = ROOT / "attngroup" / "suites" / "data" / "configs"
    path = tmp_path / "pairs.yaml"
    path.write_text(
        "pairs:\n"
        f"  - name: a\n    target: {configs / 'qwen3-window-target' / 'config.json'}\n"
        f"    draft: {configs / 'qwen3-window-draft' / 'config.json'}\n"
        f"    method: draft_model\n    {field}: ''\n"
    )
    assert main(["inspect", "a", "--pairs", str(path)]) == 2
    assert f"{path}: pairs[0].{field}: empty" in capsys.readouterr().err


def test_generate_runs_a_pair_from_a_pairs_file():
    # Its own process: on the CPU the KV write needs the Triton interpreter, which must be
    # chosen before triton is imported (a GPU machine's test process has imported it).
    argv = ["generate", "mistral-window8-draft", "--pairs", REGRESSION_PAIRS]
    argv += ["--batch", "1", "--prompt-len", "4", "--max-tokens", "3", "--device", "cpu", "--json"]
    completed = subprocess.run(
        [sys.executable, "-m", "attngroup.reference_engine", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    summary = json.loads(completed.stdout)
    assert summary["pair"] == "mistral-window8-draft"
    assert summary["generated_tokens"] == 3


def _collect(env_pairs: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Collect one suite module in a fresh pytest with ``AGC_PAIRS`` set (its run
    record goes to ``tmp_path``, not over this run's)."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"),
            *("--run-record", str(tmp_path / "record.json")),
            *("attngroup/suites/grouping/test_model_pairs.py", "-k", "tiny"),
        ],
        cwd=ROOT,
        env={**os.environ, "AGC_PAIRS": env_pairs},
        capture_output=True,
        text=True,
        check=False,
    )


def test_agc_pairs_adds_the_file_pairs_to_the_suites(tmp_path):
    result = _collect(REGRESSION_PAIRS, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "test_pairs_are_tiny[mistral-window8-draft]" in result.stdout


def test_agc_pairs_with_a_bad_file_is_a_usage_error(tmp_path):
    result = _collect("no/such.yaml", tmp_path)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--pairs: no/such.yaml: no such pairs file" in result.stderr


def test_suite_options_are_known_to_a_run_outside_the_suites(tmp_path):
    """``pytest -k mtp --pairs FILE`` names no path: pytest then knows only the root
    conftest's options, so the suites' options must be declared there. (The file is named
    relative to the root and outside ``attngroup/suites/``: pytest takes a path under ``attngroup/suites/``
    that follows an unknown option for a test path and loads the suites' conftest.)"""
    pairs_file = "attngroup/reference_engine/configs/pairs.yaml"
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"),
            *("--pairs", pairs_file, "--engine", "reference", "--device", "cpu"),
            *("--run-record", str(tmp_path / "record.json"), "tests/test_shard.py"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == pytest.ExitCode.OK, completed.stderr
