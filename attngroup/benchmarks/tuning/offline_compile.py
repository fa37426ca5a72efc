"""Compile a benchmark case's Triton kernels for sm_90 on a machine without a GPU.

What a launch variant costs in registers, spilled stack and shared memory, and how many of
its programs an H200 SM holds. The launch is planned on meta tensors, its
arguments specialized by Triton's own binder as a real launch is, compiled by Triton for
sm_90, and the cubin read with the ``cuobjdump`` Triton's wheel bundles: no device. Segment
counts are fitted to whole waves of the compiled kernel, as on the H200.

    python -m attngroup.benchmarks.tuning.offline_compile --cases decode.gemma4-e4b-full-d512.b64x8k --variants current,tma-prefetch-stages-3-registers-168

Triton's interpreter compiles nothing: run it without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attngroup.benchmarks.cli import argument_parser

if TYPE_CHECKING:  # torch, triton and the kernels load after the arguments are parsed
    from attngroup.benchmarks.attention_cases import Case
    from attngroup.benchmarks.tuning.ab import Variant
    from attngroup.kernels.ops.triton_launch_config import LaunchConfig, LaunchKind
    from attngroup.kernels.ops.triton_launch_plan import AttentionTensors, LaunchPlan

SM90 = ("cuda", 90, 32)
"""Triton's target: backend, compute capability, warp size (Hopper: the H100 and H200)."""
H200_SHARED_BYTES_PER_SM = 233472
H200_THREADS_PER_SM = 2048
H200_SHARED_BYTES_PER_PROGRAM = 232448
"""The H200's limits as torch reports them (``shared_memory_per_multiprocessor``,
``max_threads_per_multi_processor``, ``shared_memory_per_block_optin``); its SM count is
``triton_occupancy.H200_SMS``."""


class OfflineCompileError(RuntimeError):
    """The offline compile cannot run here (the interpreter is on, or Triton lacks a tool)."""


@dataclass(frozen=True)
class CompiledKernel:
    """What the compiled kernel costs and holds."""

    registers: int
    stack_bytes: int
    shared_bytes: int
    num_warps: int

    @property
    def programs_per_sm(self) -> int:
        """0 where one program needs more shared memory than an SM grants it: no launch."""
        from attngroup.kernels.ops.triton_occupancy import resident_programs_per_sm

        if self.shared_bytes > H200_SHARED_BYTES_PER_PROGRAM:
            return 0
        return resident_programs_per_sm(
            registers_per_thread=self.registers,
            shared_bytes=self.shared_bytes,
            num_warps=self.num_warps,
            max_threads_per_sm=H200_THREADS_PER_SM,
            shared_bytes_per_sm=H200_SHARED_BYTES_PER_SM,
        )

    def as_json(self) -> dict[str, int]:
        """The fields and ``programs_per_sm``, for a JSON report."""
        return asdict(self) | {"programs_per_sm": self.programs_per_sm}


def refuse_the_interpreter(parser: argparse.ArgumentParser) -> None:
    """A usage error (exit 2, nothing written) where ``TRITON_INTERPRET`` is set: Triton's
    interpreter compiles nothing."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("TRITON_INTERPRET is set: Triton's interpreter compiles nothing; unset it")


def compile_kernel(
    kernel: Any,
    arguments: Sequence[object],
    constexprs: Mapping[str, object],
    options: Mapping[str, int],
) -> CompiledKernel:
    """``kernel`` compiled for sm_90 with these launch arguments, specialized as Triton's
    launcher would specialize them (pointer alignment, integer divisibility)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend

    try:  # the launcher's own binder: internal to Triton, present from 3.6 to 3.9
        from triton.runtime.jit import create_function_from_signature
    except ImportError as error:
        raise OfflineCompileError(
            f"Triton {triton.__version__} has no triton.runtime.jit."
            f"create_function_from_signature, the launcher's binder this compile specializes "
            f"arguments with ({error})"
        ) from error
    if not isinstance(kernel, triton.JITFunction):
        raise OfflineCompileError(
            "Triton's interpreter is on (TRITON_INTERPRET=1): it compiles nothing; run the "
            "offline compile without it"
        )
    target = GPUTarget(*SM90)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    launch_options = {**constexprs, **options, "debug": False}
    bound, specialization, parsed = binder(*arguments, **launch_options)
    pack_args = getattr(kernel, "_pack_args", None)
    if pack_args is None:
        raise OfflineCompileError(
            f"Triton {triton.__version__}'s JITFunction has no _pack_args, the step that turns "
            "a launch's specialization into the compiler's signature"
        )
    parsed, signature, constants, attrs = pack_args(
        backend, launch_options, bound, specialization, parsed
    )
    compiled = compile(
        ASTSource(kernel, signature, constants, attrs), target=target, options=parsed.__dict__
    )
    registers, stack = cubin_resource_usage(compiled.asm["cubin"])
    return CompiledKernel(
        registers=registers,
        stack_bytes=stack,
        shared_bytes=compiled.metadata.shared,
        num_warps=compiled.metadata.num_warps,
    )


def cubin_resource_usage(cubin: bytes) -> tuple[int, int]:
    """Registers per thread and stack bytes of the cubin's kernel, by Triton's ``cuobjdump``."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.is_file():
        raise OfflineCompileError(f"Triton's wheel has no cuobjdump at {tool}")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run(
            [str(tool), "--dump-resource-usage", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    registers = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    if registers is None or stack is None:
        raise OfflineCompileError(f"cuobjdump printed no REG/STACK figures: {usage!r}")
    return int(registers.group(1)), int(stack.group(1))


def case_tensors(case: Case) -> AttentionTensors:
    """The case's query, caches, metadata and split-KV scratch as meta tensors (shapes,
    dtypes and strides only), in the benchmark's layout."""
    import torch

    from attngroup.benchmarks.attention_cases import BLOCK_SIZE
    from attngroup.kernels.ops.split_kv_scratch import SplitKVScratch
    from attngroup.kernels.ops.triton_launch_config import DEFAULT_NUM_SEGMENTS
    from attngroup.kernels.ops.triton_launch_plan import AttentionTensors

    meta = torch.device("meta")
    shape = case.shape
    tokens = case.batch_size * case.query_len
    pages_per_request = -(-case.context_len // BLOCK_SIZE)
    query = torch.empty(
        (tokens, case.num_heads_q, shape.head_size), dtype=torch.bfloat16, device=meta
    )
    cache_shape = (
        case.batch_size * pages_per_request,
        BLOCK_SIZE,
        shape.num_kv_heads,
        shape.head_size,
    )
    key_cache = torch.empty(cache_shape, dtype=torch.bfloat16, device=meta)

    def int32(*sizes: int) -> torch.Tensor:
        return torch.empty(sizes, dtype=torch.int32, device=meta)

    return AttentionTensors(
        query,
        key_cache,
        torch.empty_like(key_cache),
        torch.empty_like(query),
        query_start_loc=int32(case.batch_size + 1),
        seq_lens=int32(case.batch_size),
        block_table=int32(case.batch_size, pages_per_request),
        scratch=SplitKVScratch.allocate(
            tokens, case.num_heads_q, DEFAULT_NUM_SEGMENTS, shape.head_size, meta
        ),
    )


def plan_offline(
    case: Case, tensors: AttentionTensors, config: LaunchConfig | None, path: LaunchKind
) -> LaunchPlan:
    """The launcher's plan for the case on ``path`` (``config=None``: its own choice), its
    segments fitted to whole H200 waves of the offline-compiled kernel."""
    from attngroup.kernels.ops.triton_launch_plan import plan_launch
    from attngroup.kernels.ops.triton_occupancy import H200_SMS

    def wave_slots(plan: LaunchPlan) -> int:
        # A kernel no SM can hold is still planned (as one program per SM), so that its row
        # reports 0 programs per SM instead of the segment fit dividing by zero.
        return H200_SMS * max(attention_kernel(plan, tensors).programs_per_sm, 1)

    plan = plan_launch(
        tensors,
        max_query_len=case.query_len,
        max_seq_len=case.context_len,
        sm_scale=case.shape.head_size**-0.5,
        wave_slots=wave_slots,
        path=path,
        config=config,
    )
    assert plan is not None  # a benchmark case always has tokens
    return plan


def attention_kernel(plan: LaunchPlan, tensors: AttentionTensors) -> CompiledKernel:
    from attngroup.kernels.ops.triton_unified_attention import (
        _attention_arguments,
        _unified_attention_kernel,
    )

    attention = plan.attention
    arguments = _attention_arguments(plan, tensors)
    return compile_kernel(
        _unified_attention_kernel, arguments, attention.constexprs, attention.options
    )


def merge_kernel(plan: LaunchPlan, tensors: AttentionTensors) -> CompiledKernel | None:
    from attngroup.kernels.ops.triton_unified_attention import (
        _merge_arguments,
        _merge_segments_kernel,
    )

    if plan.merge is None:
        return None
    arguments = _merge_arguments(plan, tensors)
    return compile_kernel(
        _merge_segments_kernel, arguments, plan.merge.constexprs, plan.merge.options
    )


def compile_variant(case: Case, variant: Variant) -> dict[str, object]:
    """One JSON row: the variant's plan and its kernels compiled for sm_90."""
    from attngroup.benchmarks.case_launch import heuristic_launch_config

    tensors = case_tensors(case)
    config = variant.config(heuristic_launch_config(case))
    plan = plan_offline(case, tensors, config, variant.launch_path(case))
    merge = merge_kernel(plan, tensors)
    attention = attention_kernel(plan, tensors)
    return {
        "case": case.name,
        "variant": variant.name,
        "config": asdict(plan.config),
        "grid": list(plan.attention.grid),
        "attention": attention.as_json(),
        "merge": None if merge is None else merge.as_json(),
    }


def _line(row: dict[str, Any]) -> str:
    attention = row["attention"]
    text = (
        f"   {row['variant']:<36} {attention['registers']:>3} regs  {attention['stack_bytes']:>4} B stack"
        f"  {attention['shared_bytes'] / 1024:5.1f} KiB  {attention['programs_per_sm']} per SM"
        f"  grid {tuple(row['grid'])}"
    )
    if row["merge"] is not None:
        text += f"  merge: {row['merge']['registers']} regs"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(
        "attngroup.benchmarks.tuning.offline_compile", __doc__.split("\n\n")[0]
    )
    parser.add_argument("--cases", required=True, help="comma-separated benchmark case names")
    parser.add_argument(
        "--variants", default="current", help="comma-separated A/B variant names (default: current)"
    )
    parser.add_argument("--json", type=Path, help="write the rows to this JSON file")
    args = parser.parse_args(argv)
    refuse_the_interpreter(parser)
    from attngroup.benchmarks.tuning.ab import VARIANTS, find_case

    by_name = {variant.name: variant for variant in VARIANTS}
    unknown = [name for name in args.variants.split(",") if name not in by_name]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(by_name)}")
    try:
        cases = [find_case(name) for name in args.cases.split(",")]
    except ValueError as error:
        parser.error(str(error))
    import triton

    print(f"Triton {triton.__version__}, sm_90")
    rows = []
    for case in cases:
        print(case.name)
        for name in args.variants.split(","):
            try:
                row = compile_variant(case, by_name[name])
            except OfflineCompileError as error:
                print(f"offline compile: {error}", file=sys.stderr)
                return 2
            rows.append(row)
            print(_line(row))
    if args.json is not None:
        from attngroup.atomic_write import write_text

        write_text(args.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
