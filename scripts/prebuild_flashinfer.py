"""Compile FlashInfer's attention modules in one parallel build before a GPU run uses them.

FlashInfer compiles each (wrapper, head size, flags) variant when first used, one
module at a time (about 20 s each on the H200 machine): a benchmark over every
wrapper at three head sizes would spend minutes compiling between timings. This
hands FlashInfer's own JIT specs for the variants the benchmark and the suites use
to one ninja build over all cores; later uses find them in FlashInfer's JIT cache.
It compiles nothing FlashInfer would not: any variant left out is still compiled on
first use.

Usage (on the GPU machine, FlashInfer importable):
    python scripts/prebuild_flashinfer.py [--head-dims 128,256,512] [--sliding-window false,true]
"""

from __future__ import annotations

import argparse
import sys
import time
from itertools import product

FA3_MAX_HEAD_DIM = 256  # FA3's templates stop at 256 (a 512-wide head fails to build)


def booleans(text: str) -> list[bool]:
    values = {"true": True, "false": False}
    try:
        return [values[item.strip().lower()] for item in text.split(",") if item]
    except KeyError as error:
        raise argparse.ArgumentTypeError(f"expected true/false, got {error}") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dims", default="128,256,512")
    parser.add_argument("--dtypes", default="bfloat16", help="comma-separated: bfloat16,float16")
    parser.add_argument("--sliding-window", type=booleans, default=[False])
    parser.add_argument("--soft-cap", type=booleans, default=[False])
    parser.add_argument("--no-fa3", action="store_true", help="leave out FA3 prefill")
    return parser.parse_args(argv)


def jit_specs(args: argparse.Namespace) -> list:
    """The CUDA-core decode, FA2 (prefill and tensor-core decode) and FA3 prefill modules
    of every requested variant."""
    import torch
    from flashinfer.jit.attention.modules import (
        _gen_batch_prefill_primary_module,
        gen_batch_decode_module,
        gen_batch_prefill_module,
    )

    specs = []
    head_dims = [int(item) for item in args.head_dims.split(",")]
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    for head_dim, dtype, window, soft_cap in product(
        head_dims, dtypes, args.sliding_window, args.soft_cap
    ):
        common = (dtype, dtype, dtype, torch.int32, head_dim, head_dim, 0, window, soft_cap)
        specs.append(gen_batch_decode_module(*common))
        specs.append(_gen_batch_prefill_primary_module("fa2", *common, False))
        if head_dim <= FA3_MAX_HEAD_DIM and not args.no_fa3:
            specs.append(gen_batch_prefill_module("fa3", *common, False))
    return specs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from flashinfer.jit import build_jit_specs

    specs = jit_specs(args)
    started = time.perf_counter()
    build_jit_specs(specs, verbose=False)
    missing = [spec.name for spec in specs if not spec.is_compiled]
    if missing:
        print(f"error: not built: {missing}", file=sys.stderr)
        return 1
    print(f"{len(specs)} FlashInfer modules ready in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
