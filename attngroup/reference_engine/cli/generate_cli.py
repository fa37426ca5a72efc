"""``python -m attngroup.reference_engine generate PAIR``: run the engine and report speed and acceptance.

Prompts are random token ids drawn from ``--seed``, so a run is reproducible.
A progress bar (tqdm) goes to stderr when it is a terminal, unless
``--no-progress``; the summary (tokens per second, acceptance
rate, mean accepted length, time per step split into draft, verify and
metadata building) to stdout, as text or ``--json``. Under ``--policy legacy``
a mixed pair fails at engine start-up with the strict check's exact message
on stderr (exit 1); bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from attngroup.reference_engine.grouping_policy import GroupingPolicy
from attngroup.reference_engine.model_pairs import (
    MODEL_PAIRS,
    UnknownModelPairError,
    get_model_pair,
)
from attngroup.reference_engine.pairs.pair_options import add_pair_options, pair_name_from_args

if TYPE_CHECKING:  # torch loads when a run starts, so --help and bad arguments answer at once
    import torch
    from tqdm import tqdm

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # -> torch attribute


def positive_int(text: str) -> int:
    """argparse ``type`` for counts (prompts, tokens, blocks): an integer >= 1.

    The one copy, shared with ``benchmarks``: they import this package, never the reverse.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _spec_tokens(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 8:
        raise argparse.ArgumentTypeError(f"must be in 0..8 (0 decodes without drafts), got {value}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate", help="run a pair with speculative decoding and print a speed/acceptance summary"
    )
    parser.add_argument(
        "pair", nargs="?", metavar="PAIR", help=f"model pair name ({', '.join(MODEL_PAIRS)}, ...)"
    )
    add_pair_options(parser)
    parser.add_argument("--backend", choices=["triton", "flashinfer", "torch"], default="torch")
    parser.add_argument(
        "--num-spec-tokens", type=_spec_tokens, default=3, help="k drafts per step (0..8)"
    )
    parser.add_argument("--batch", type=positive_int, default=4, help="number of prompts")
    parser.add_argument("--prompt-len", type=positive_int, default=16, help="tokens per prompt")
    parser.add_argument(
        "--max-tokens", type=positive_int, default=16, help="tokens to generate per prompt"
    )
    parser.add_argument("--policy", choices=[p.value for p in GroupingPolicy], default="split")
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the weights, prompts and sampling"
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument(
        "--num-blocks", type=positive_int, default=256, help="KV-cache blocks per group"
    )
    parser.add_argument(
        "--cuda-graph",
        action="store_true",
        help="run decode, verify and draft steps from CUDA graphs (per batch-size bucket); "
        "the plan, and every group left eager with its reason, go to stderr",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it is drawn only when stderr is a terminal)",
    )
    parser.set_defaults(run=run, usage_error=parser.error)


class DeviceError(ValueError):
    """The requested device does not exist here."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``--dtype`` choice (``fp32``, ``bf16``, ``fp16``)."""
    import torch

    return getattr(torch, DTYPES[name])


def _device(requested: str | None) -> torch.device:
    """The device to run on; a name torch does not know, or CUDA on a build or
    machine without it, raises ``DeviceError``."""
    import torch

    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise DeviceError(f"unknown device {requested!r}; try cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            f"--device {requested}: this torch ({torch.__version__}) sees no CUDA device; "
            "leave --device out to run on the CPU"
        )
    return device


def _prompts(vocab_size: int, batch: int, prompt_len: int, seed: int) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, prompt_len), generator=generator).tolist()


def progress_bar(total: int, stream: TextIO, *, silent: bool = False) -> tqdm:
    """A tqdm bar of generated tokens on ``stream``; off when ``silent`` or when ``stream``
    is not a terminal (a log file or a pipe gets no ``\\r`` lines)."""
    from tqdm import tqdm  # imported when a run starts: --help stays fast

    return tqdm(total=total, unit="tok", desc="generate", file=stream, disable=silent or None)


def summarize(engine: Any, wall_seconds: float) -> dict:
    """The run's speed and acceptance, per-step times in milliseconds."""
    stats, runner_timings = engine.stats, engine.runner.timings
    steps = max(stats.num_steps, 1)
    return {
        "pair": engine.config.pair,
        "backend": engine.config.backend,
        "policy": engine.config.policy,
        "num_spec_tokens": engine.config.num_spec_tokens,
        "steps": stats.num_steps,
        "generated_tokens": stats.num_generated_tokens,
        "wall_seconds": wall_seconds,
        "tokens_per_second": stats.num_generated_tokens / wall_seconds if wall_seconds else 0.0,
        "acceptance_rate": stats.spec.acceptance_rate,
        "mean_accepted_length": stats.spec.mean_accepted_length,
        "draft_tokens": stats.spec.num_draft_tokens,
        "accepted_tokens": stats.spec.num_accepted_tokens,
        "preemptions": engine.scheduler.num_preemptions,
        "ms_per_step": {
            "draft": 1e3 * runner_timings.draft_forward / steps,
            "verify": 1e3 * runner_timings.target_forward / steps,
            "metadata": 1e3 * runner_timings.metadata / steps,
            "schedule": 1e3 * stats.timings.schedule / steps,
            "sampling": 1e3 * stats.timings.sampling / steps,
        },
    }


def format_summary(summary: dict) -> str:
    per_step = summary["ms_per_step"]
    return "\n".join(
        [
            f"{summary['pair']} backend={summary['backend']} policy={summary['policy']} "
            f"k={summary['num_spec_tokens']}: {summary['generated_tokens']} tokens in "
            f"{summary['steps']} steps, {summary['wall_seconds']:.2f} s",
            f"  tokens/s              {summary['tokens_per_second']:.2f}",
            f"  acceptance rate       {summary['acceptance_rate']:.3f} "
            f"({summary['accepted_tokens']}/{summary['draft_tokens']} drafts)",
            f"  mean accepted length  {summary['mean_accepted_length']:.3f}",
            f"  time per step (ms)    draft {per_step['draft']:.1f} | verify {per_step['verify']:.1f} "
            f"| metadata {per_step['metadata']:.1f} (part of draft + verify) "
            f"| schedule {per_step['schedule']:.1f} | sampling {per_step['sampling']:.1f}",
            f"  preemptions           {summary['preemptions']}",
        ]
    )


def run(args: argparse.Namespace) -> int:
    if args.temperature < 0:
        print(f"error: --temperature must be >= 0, got {args.temperature}", file=sys.stderr)
        return 2
    try:
        device = str(_device(args.device))
    except DeviceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the KV write is a Triton kernel
    # Imported here: the engine pulls in the models and triton, after the line above.
    from attngroup.reference_engine.engine.llm_engine import EngineConfig, LLMEngine
    from attngroup.reference_engine.engine.request import SamplingParams
    from attngroup.reference_engine.pairs.pair_configs import PairConfigError

    try:
        name = pair_name_from_args(args)
        pair = get_model_pair(name)
    except PairConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except UnknownModelPairError as error:
        args.usage_error(str(error))  # usage and exit 2, as a bad choice of PAIR
    config = EngineConfig(
        pair=name,
        backend=args.backend,
        device=device,
        dtype=torch_dtype(args.dtype),
        policy=args.policy,
        num_blocks=args.num_blocks,
        num_spec_tokens=args.num_spec_tokens,
        seed=args.seed,
        max_num_seqs=max(args.batch, 1),
        cuda_graph=args.cuda_graph,
    )
    try:
        engine = LLMEngine(config)
    except AssertionError as error:  # the strict check at start-up: LEGACY on a mixed pair
        print(f"AssertionError: {error}", file=sys.stderr)
        return 1
    except ValueError as error:  # a configuration the engine refuses (backend, device, dtype)
        print(f"error: {error}", file=sys.stderr)
        return 2
    graphs = engine.runner.cuda_graphs
    if graphs is not None:
        print("\n".join(f"CUDA graphs: {line}" for line in graphs.plan.describe()), file=sys.stderr)
    prompts = _prompts(pair.target_config().vocab_size, args.batch, args.prompt_len, args.seed)
    total = args.batch * args.max_tokens
    started = time.perf_counter()
    with progress_bar(total, sys.stderr, silent=args.no_progress) as bar:
        engine.generate(
            prompts,
            SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature),
            on_step=lambda e: bar.update(e.stats.num_generated_tokens - bar.n),
        )
    summary = summarize(engine, time.perf_counter() - started)
    engine.check_no_leaks()
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0
