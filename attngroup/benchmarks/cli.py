"""What the benchmark command lines share: ``python -m attngroup.benchmarks.NAME`` as the
program name, the module docstring shown as written (its example commands stay
on their own lines), and the exit-status contract."""

from __future__ import annotations

import argparse

EXIT_STATUS = (
    "exit status: 0 ok; 1 a result disagreed with the oracle; "
    "2 bad input or environment (bad arguments, no CUDA device)"
)


def argument_parser(
    module: str, doc: str, exit_status: str = EXIT_STATUS
) -> argparse.ArgumentParser:
    """``exit_status`` replaces the contract's wording for a command that checks nothing."""
    return argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=doc,
        epilog=exit_status,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
