"""Command-line options that name a model pair beyond the registered ones.

``--pairs FILE`` (default ``$AGC_PAIRS``) registers a pairs file's pairs;
``--target-config`` / ``--draft-config`` / ``--method`` build one pair from two
checkpoint configs for a one-off check. Both go through
``attngroup.reference_engine.pairs.pair_configs``; a bad file or config is a ``PairSourceError``
naming the file and field, which the commands report with exit code 2.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

PAIRS_ENV = "AGC_PAIRS"
METHODS = ("mtp", "eagle", "draft_model")


def pairs_file_from_env() -> Path | None:
    """The pairs file ``$AGC_PAIRS`` names, if any (CI sets it for every suite)."""
    value = os.environ.get(PAIRS_ENV)
    return Path(value) if value else None


def add_pair_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pairs",
        type=Path,
        default=pairs_file_from_env(),
        metavar="FILE",
        help=f"a pairs file (YAML) whose pairs can be named (default: ${PAIRS_ENV})",
    )
    parser.add_argument(
        "--target-config", type=Path, metavar="PATH", help="target config.json (instead of PAIR)"
    )
    parser.add_argument("--draft-config", type=Path, metavar="PATH", help="draft config.json")
    parser.add_argument("--method", choices=METHODS, help="speculative method of the draft")
    parser.add_argument(
        "--draft-kv",
        default=None,
        help="how the draft gets its K/V: own | shared:last-of-type (default: the draft's kind)",
    )


def pair_name_from_args(args: argparse.Namespace) -> str:
    """Register what the options name and return the pair's name (raises ``ValueError``
    subclasses naming the file and field)."""
    from attngroup.reference_engine.model_pairs import MODEL_PAIRS, register_pairs
    from attngroup.reference_engine.pairs.pair_configs import PairConfigError, pair_from_configs
    from attngroup.reference_engine.pairs.pairs_file import register_pairs_file

    if args.pairs is not None:
        register_pairs_file(args.pairs)
    configs = (args.target_config, args.draft_config, args.method)
    if not any(configs):
        if args.pair is None:
            raise PairConfigError(
                "name a PAIR, or give --target-config, --draft-config and --method"
            )
        return args.pair
    if args.pair is not None or not all(configs):
        raise PairConfigError(
            "--target-config, --draft-config and --method go together, without a PAIR name"
        )
    name = f"{_stem(args.target_config)}+{_stem(args.draft_config)}"
    if name not in MODEL_PAIRS:
        register_pairs(
            [
                pair_from_configs(
                    name, args.target_config, args.draft_config, args.method, draft_kv=args.draft_kv
                )
            ]
        )
    return name


def _stem(path: Path) -> str:
    """The checkpoint folder's name for ``.../NAME/config.json``, else the file's stem."""
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem
