"""Per-pair verdicts of the grouping checks on the installed vLLM.

``python -m attngroup.suites.grouping.vllm_verdicts run OUT.json [--runner auto|v1|v2]
[--checkout DIR [--checkout-ref REF]]`` (in a venv with vLLM) judges every model pair at every TP size it
supports with the grouping suite's own checks and writes ``{"vllm": VERSION, "runner":
REQUESTED, "pairs": {pair: verdict}}``; with ``--checkout``, also ``"checkout"``: the source
tree's path, commit, branch and whether tracked files differ from the commit. A verdict is
``pass``, ``fail`` (the first failing check, its TP size, its first message and the vLLM
source line that makes it true), ``adapter error`` (the harness failed: its message and the
traceback's last frames, never a verdict on vLLM) or ``unavailable`` (the release lacks the
runner asked for, or refuses the config on the runner its switch names, with its reason);
each names the runner judged. ``attngroup.suites.grouping.vllm_timeline``
turns verdict files into the release timeline.

Exit status: 0; 2 when the venv's vLLM is not the checkout's (nothing written); 3 when any
pair hit an adapter error (the file is still written).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from attngroup.reference_engine.model_pairs import MODEL_PAIRS, ModelPair
from attngroup.reports.atomic import write_text_atomic
from attngroup.suites.engines.base import AdapterError
from attngroup.suites.engines.verdict_states import (
    ADAPTER_ERROR,
    ADAPTER_ERROR_EXIT,
    FAIL,
    PASS,
    RUNNER_CHOICES,
    UNAVAILABLE,
)
from attngroup.suites.engines.vllm_adapter import (
    NATIVE,
    RUNNER_ENV,
    VllmEngineAdapter,
    requested_runner,
)
from attngroup.suites.engines.vllm_checkout import identify
from attngroup.suites.engines.vllm_startup import RunnerUnavailableError
from attngroup.suites.grouping.checks import first_violation

SiteFinder = Callable[[str], dict[str, str]]

_CITED = re.compile(r"\((vllm/[^()]+\.py:\d+)\)\s*$")


def cited_site(message: str) -> str | None:
    """The vLLM line an engine error names (the adapter appends it to vLLM's errors)."""
    match = _CITED.search(message)
    return match.group(1) if match else None


def judge_pair(adapter: VllmEngineAdapter, pair: ModelPair, sites: SiteFinder) -> dict:
    """One pair's verdict: the first failing TP size, else pass."""
    runner = adapter.requested_runner
    for tp in pair.supported_tp_sizes:
        layers = pair.layers(tp)
        try:
            outcome = adapter.setup(layers, NATIVE, pair=pair)
        except RunnerUnavailableError as error:
            return {"verdict": UNAVAILABLE, "runner": runner, "message": str(error)}
        except AdapterError as error:
            return {
                "verdict": ADAPTER_ERROR,
                "runner": runner,
                "tp": tp,
                "message": str(error).splitlines()[0],
                "frames": list(error.frames),
            }
        runner = outcome.runner or runner
        failure = first_violation(outcome, layers)
        if failure is not None:
            source = cited_site(failure["message"]) or sites(runner).get(failure["check"])
            return {"verdict": FAIL, "runner": runner, "tp": tp, **failure, "source": source}
    return {"verdict": PASS, "runner": runner}


class CheckoutMismatchError(RuntimeError):
    """The venv imports vLLM from somewhere other than the checkout it was built for (a
    harness fault: no verdict on either tree)."""


def imported_checkout(source: Path, ref: str | None = None) -> dict:
    """The checkout's identity (named by ``ref`` when it was checked out at one), once the
    installed vLLM is known to be imported from it."""
    import vllm

    imported = Path(vllm.__file__).resolve().parent
    if not imported.is_relative_to(source.resolve()):
        raise CheckoutMismatchError(
            f"this venv imports vLLM from {imported}, not from the checkout {source}"
        )
    return identify(source.resolve(), ref).as_json()


def judge_installed_vllm(
    runner: str = "auto", checkout: Path | None = None, checkout_ref: str | None = None
) -> dict:
    """Verdicts of the installed vLLM for every pair on ``runner`` (with the identity of the
    source tree it is installed from, when it is a checkout)."""
    source = imported_checkout(checkout, checkout_ref) if checkout is not None else None
    adapter = VllmEngineAdapter(runner=runner)
    started = time.monotonic()
    pairs = {
        name: judge_pair(adapter, pair, lambda runner: adapter.startup.decision_sites(runner))
        for name, pair in MODEL_PAIRS.items()
    }
    verdicts = {
        "vllm": adapter.version,
        "runner": runner,
        "seconds": round(time.monotonic() - started, 1),
        "pairs": pairs,
    }
    return verdicts if source is None else {**verdicts, "checkout": source}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attngroup.suites.grouping.vllm_verdicts",
        description="Judge every model pair on the installed vLLM.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="write the verdict file OUT")
    run.add_argument("out", type=Path)
    run.add_argument(
        "--runner", choices=RUNNER_CHOICES, default=None, help=f"default: ${RUNNER_ENV} or auto"
    )
    run.add_argument(
        "--checkout", type=Path, default=None, help="the vLLM source tree the venv installs"
    )
    run.add_argument("--checkout-ref", default=None, help="the git ref the tree was checked out at")
    args = parser.parse_args(argv)
    try:
        verdicts = judge_installed_vllm(
            requested_runner(args.runner), args.checkout, args.checkout_ref
        )
    except CheckoutMismatchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_text_atomic(args.out, json.dumps(verdicts, indent=2) + "\n")
    errors = [name for name, v in verdicts["pairs"].items() if v["verdict"] == ADAPTER_ERROR]
    if errors:
        print(f"adapter error on {', '.join(errors)} (see {args.out})", file=sys.stderr)
        return ADAPTER_ERROR_EXIT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
