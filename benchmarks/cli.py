"""What the benchmark command lines share: ``python -m benchmarks.NAME`` as the
program name, the module docstring shown as written (its example commands stay
on their own lines), and the exit-status contract."""

from __future__ import annotations

import argparse

EXIT_STATUS = (
    "exit status: 0 ok; 1 a result disagreed with the oracle; "
    "2 bad input or environment (bad arguments, no CUDA device)"
)


def argument_parser(module: str, doc: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=doc,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
