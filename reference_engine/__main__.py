"""Command line of the reference engine: ``python -m reference_engine --help``."""

from __future__ import annotations

import argparse
import sys

from reference_engine import generate_cli, inspect_cli
from reference_engine.layers import TensorParallelError
from reference_engine.model_pairs import MODEL_PAIRS, UnknownModelPairError


def _list_pairs(args: argparse.Namespace) -> int:
    for pair in MODEL_PAIRS.values():
        tp = ",".join(map(str, pair.supported_tp_sizes))
        mixed = "mixed q heads" if pair.is_mixed else "uniform"
        print(f"{pair.name:<22} {pair.spec_method:<12} {mixed:<14} tp {tp:<8} {pair.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reference_engine", description=__doc__)
    subparsers = parser.add_subparsers(required=True, metavar="COMMAND")
    pairs = subparsers.add_parser("pairs", help="list the model pairs")
    pairs.set_defaults(run=_list_pairs)
    inspect_cli.add_parser(subparsers)
    generate_cli.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (UnknownModelPairError, TensorParallelError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
