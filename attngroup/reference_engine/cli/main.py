"""Command line of the reference engine: ``python -m attngroup.reference_engine --help``.

``--help``, argument errors and ``pairs`` answer without loading torch or
transformers; a command imports the engine only when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from attngroup.kernels.registry import NotAnAttentionBackendError, UnknownBackendError
from attngroup.reference_engine.cli import generate_cli, inspect_cli
from attngroup.reference_engine.layers import TensorParallelError
from attngroup.reference_engine.model_pairs import MODEL_PAIRS, UnknownModelPairError

EXIT_STATUS = (
    "exit status: 0 ok; 1 the check found a problem (a head-count collision, "
    "the engine's start-up check); 2 bad input or environment (unknown pair or "
    "backend, a TP size the heads do not divide over, a missing device)"
)
USER_ERRORS = (
    UnknownModelPairError,
    UnknownBackendError,
    NotAnAttentionBackendError,
    TensorParallelError,
)


def _list_pairs(args: argparse.Namespace) -> int:
    for pair in MODEL_PAIRS.values():
        line = f"{pair.name:<22} {pair.spec_method:<12}"
        if args.details:  # builds each pair's configs: loads transformers
            tp = ",".join(map(str, pair.supported_tp_sizes))
            mixed = "mixed q heads" if pair.is_mixed else "uniform"
            line += f" {mixed:<14} tp {tp:<8}"
        print(f"{line} {pair.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attngroup.reference_engine",
        description=__doc__.split("\n\n")[0],
        epilog=EXIT_STATUS,
    )
    subparsers = parser.add_subparsers(required=True, metavar="COMMAND")
    pairs = subparsers.add_parser("pairs", help="list the model pairs")
    pairs.add_argument(
        "--details",
        action="store_true",
        help="add whether query-head counts mix and the TP sizes (builds every pair's "
        "configs: takes seconds)",
    )
    pairs.set_defaults(run=_list_pairs)
    inspect_cli.add_parser(subparsers)
    generate_cli.add_parser(subparsers)
    for command in subparsers.choices.values():
        command.epilog = EXIT_STATUS
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader (``| head``) has what it wanted: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return 0
