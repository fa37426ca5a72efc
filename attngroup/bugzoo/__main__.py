"""``python -m attngroup.bugzoo``: plant every bug of the zoo in a scratch copy and run its tests.

Exit 0 when the unpatched tree passes every named test and every patch is caught,
1 when some patch is not caught (or the baseline fails), 2 on bad input. ``--table``
prints the docs' table from the entries and runs nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from attngroup.bugzoo.zoo import ZooError, load_entries, markdown_table, run_zoo, write_results

ZOO = Path(__file__).resolve().parent
REPOSITORY = ZOO.parents[1]  # the patches are diffs against the repository root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attngroup.bugzoo", description=__doc__)
    parser.add_argument("--root", type=Path, default=REPOSITORY, help="repository to copy")
    parser.add_argument("--zoo", type=Path, default=ZOO, help="folder with entries.yaml")
    parser.add_argument("--only", nargs="*", default=(), metavar="ID", help="entries to run")
    parser.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per entry")
    parser.add_argument("--json", type=Path, help="write the outcomes here")
    parser.add_argument(
        "--table", action="store_true", help="print the docs' table of the entries; run nothing"
    )
    args = parser.parse_args(argv)
    try:
        entries = load_entries(args.zoo / "entries.yaml")
        if args.table:
            print(markdown_table(entries))
            return 0
        outcomes, baseline = run_zoo(
            args.root, args.zoo, only=args.only, workers=args.workers, budget=args.budget
        )
    except ZooError as error:
        print(f"bugzoo: {error}", file=sys.stderr)
        return 2
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"load average at the end: {load}")
    if args.json:
        write_results(args.json, outcomes, baseline, load)
    failures = [o for o in outcomes if not o.caught] + ([] if baseline.caught else [baseline])
    for failure in failures:
        print(f"FAILED {failure.id}: {failure.verdict}\n{failure.output_tail}", file=sys.stderr)
    slowest = max(outcomes, key=lambda outcome: outcome.seconds, default=None)
    if slowest is not None:
        print(f"slowest entry: {slowest.id} ({slowest.seconds} s); baseline {baseline.seconds} s")
    print(f"{sum(o.caught for o in outcomes)} of {len(outcomes)} caught")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
