"""Per-pair verdicts of the grouping checks on the installed vLLM, and the
version x pair table built from them.

``python -m attngroup.suites.grouping.vllm_verdicts run OUT.json`` (in a venv with vLLM)
judges every model pair at every TP size it supports with the grouping
suite's own checks and writes ``{"vllm": VERSION, "runner": ..., "pairs":
{pair: verdict}}``; a verdict is ``pass`` or the first failing check, its TP
size and its first message. ``python -m attngroup.suites.grouping.vllm_verdicts table
A.json B.json ...`` prints the Markdown table (no vLLM needed).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from attngroup.reference_engine.layers import LayerDescription
from attngroup.reference_engine.model_pairs import MODEL_PAIRS
from attngroup.suites.engines.base import GroupingOutcome
from attngroup.suites.grouping.checks import (
    check_builder_heads,
    check_homogeneity,
    check_kv_sharing,
    check_minimality,
    check_partition,
    check_started,
)

Check = Callable[[GroupingOutcome, Sequence[LayerDescription]], list[str]]

#: The suite's checks in the order a reader wants the first failure.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("start-up", lambda outcome, layers: check_started(outcome)),
    ("partition", check_partition),
    ("homogeneity", check_homogeneity),
    ("minimality", lambda outcome, layers: check_minimality(outcome)),
    ("builder heads", check_builder_heads),
    ("kv sharing", check_kv_sharing),
)
MESSAGE_LIMIT = 160


class VerdictFileError(ValueError):
    """A verdict file is missing or not one this module wrote."""


def verdict(outcome: GroupingOutcome, layers: Sequence[LayerDescription]) -> dict | None:
    """None when every check passes, else the first failing check and message."""
    for name, check in CHECKS:
        problems = check(outcome, layers)
        if problems:
            return {"check": name, "message": problems[0]}
    return None


def judge_installed_vllm() -> dict:
    """Verdicts of the installed vLLM for every pair (first failing TP size)."""
    from attngroup.suites.engines.vllm_adapter import NATIVE, VllmEngineAdapter

    adapter = VllmEngineAdapter()
    pairs = {}
    for name, pair in MODEL_PAIRS.items():
        pairs[name] = {"verdict": "pass"}
        for tp in pair.supported_tp_sizes:
            layers = pair.layers(tp)
            failure = verdict(adapter.setup(layers, NATIVE), layers)
            if failure is not None:
                pairs[name] = {"verdict": "fail", "tp": tp, **failure}
                break
    return {"vllm": adapter.version, "runner": adapter.runner, "pairs": pairs}


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise VerdictFileError(f"{path}: not a readable verdict file ({error})") from None
    if not isinstance(data, dict) or not {"vllm", "runner", "pairs"} <= data.keys():
        raise VerdictFileError(f"{path}: expected keys vllm, runner, pairs")
    return data


def _cell(result: dict) -> str:
    if result["verdict"] == "pass":
        return "pass"
    message = result["message"].replace("|", "\\|")
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    return f"**fail** (tp{result['tp']}, {result['check']}): `{message}`"


def markdown_table(verdict_sets: Sequence[dict]) -> str:
    """Rows: pairs; columns: vLLM versions in the order given."""
    ordered = sorted(verdict_sets, key=lambda v: tuple(int(p) for p in v["vllm"].split(".")[:3]))
    header = "| pair | " + " | ".join(f"vLLM {v['vllm']} ({v['runner']})" for v in ordered) + " |"
    lines = [header, "|" + " --- |" * (len(ordered) + 1)]
    pairs = list(dict.fromkeys(name for v in ordered for name in v["pairs"]))
    for pair in pairs:
        cells = [_cell(v["pairs"][pair]) if pair in v["pairs"] else "n/a" for v in ordered]
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)


USAGE = (
    "usage: python -m attngroup.suites.grouping.vllm_verdicts run OUT.json | table VERDICTS.json..."
)


def main(argv: Sequence[str]) -> int:
    if len(argv) == 2 and argv[0] == "run":
        _write_atomic(Path(argv[1]), json.dumps(judge_installed_vllm(), indent=2) + "\n")
        return 0
    if len(argv) >= 2 and argv[0] == "table":
        try:
            print(markdown_table([load(Path(p)) for p in argv[1:]]))
        except VerdictFileError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
