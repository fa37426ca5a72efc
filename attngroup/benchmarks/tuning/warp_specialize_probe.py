"""Whether Triton's automatic warp specialization splits an attention loop for sm_90.

``tl.range(..., warp_specialize=True)`` asks Triton to split a loop into a producer partition
(the tensor-memory-accelerator loads) and consumer partitions (the dots), as FlashInfer's and
FlashAttention 3's Hopper kernels are written by hand. This compiles loops for sm_90 on a
machine without a GPU, each with the flag and without it: a matrix product, the case Triton's
tutorials use, and the attention kernel's tensor-descriptor loop in miniature (a page number
from the block table, one 16-key page of K and of V, two dots and an online softmax), its
query rows loaded by pointer, as the attention kernel does, or through a tensor descriptor.
Each row says whether the flagged loop came out split (``ttg.warp_specialize`` in the TTGIR)
and at what cost (warps, registers, stack, shared memory, programs per H200 SM), unchanged, or
refused by the compiler, with the pass that refused it and why.

    python -m attngroup.benchmarks.tuning.warp_specialize_probe --head-sizes 256,512 --rows 16,64 --warps 4,8

Triton's interpreter compiles nothing: run it without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from attngroup.benchmarks.cli import argument_parser

if TYPE_CHECKING:  # triton loads after the arguments are parsed
    from attngroup.benchmarks.tuning.offline_compile import CompiledKernel

PAGE_SIZE = 16
"""Keys per page, and per iteration of the attention loop (the tensor-descriptor entry's)."""
MATRIX_TILE = 64
NUM_STAGES = 3
"""The tensor-descriptor entry's stages."""
Loop = Literal["matmul", "attention-query-pointer", "attention-query-descriptor"]
Outcome = Literal["split", "unchanged", "refused"]


@dataclass(frozen=True)
class ProbeKey:
    """One loop and how it is compiled."""

    loop: Loop
    head_size: int | None
    """None for the matrix product (``MATRIX_TILE`` square)."""
    rows: int | None
    """Query rows per program (tokens x grouped heads); None for the matrix product."""
    num_warps: int
    warp_specialize: bool


@dataclass(frozen=True)
class ProbeRow:
    key: ProbeKey
    outcome: Outcome
    compiled: CompiledKernel | None
    """What the compiled kernel costs (None where refused): partitions add warps."""
    setmaxnreg: int | None
    """``setmaxnreg`` instructions in the PTX: partitions trading registers."""
    refusal: str | None
    """The compiler's message where it refused: the failing pass and what it printed."""

    def as_json(self) -> dict[str, object]:
        return {
            "key": asdict(self.key),
            "outcome": self.outcome,
            "compiled": None if self.compiled is None else self.compiled.as_json(),
            "setmaxnreg": self.setmaxnreg,
            "refusal": self.refusal,
        }


def _kernels():
    """The loops, defined once Triton is imported (after the arguments are parsed)."""
    import triton
    import triton.language as tl

    @triton.jit
    def matmul_loop(
        a_desc, b_desc, c_ptr, k_len, TILE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr
    ):
        acc = tl.zeros([TILE, TILE], tl.float32)
        for k in tl.range(0, k_len, TILE, warp_specialize=WARP_SPECIALIZE):
            acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
        offsets = tl.arange(0, TILE)
        tl.store(c_ptr + offsets[:, None] * TILE + offsets[None, :], acc)

    @triton.jit
    def attention_loop(
        query,
        key_desc,
        value_desc,
        block_table_ptr,
        output_ptr,
        num_pages,
        ROWS: tl.constexpr,
        PAGE: tl.constexpr,
        HEAD_SIZE: tl.constexpr,
        QUERY_DESCRIPTOR: tl.constexpr,
        WARP_SPECIALIZE: tl.constexpr,
    ):
        rows = tl.arange(0, ROWS)
        dims = tl.arange(0, HEAD_SIZE)
        if QUERY_DESCRIPTOR:
            q = query.load([0, 0])
        else:
            q = tl.load(query + rows[:, None] * HEAD_SIZE + dims[None, :])
        running_max = tl.full([ROWS], float("-inf"), tl.float32)
        running_sum = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, HEAD_SIZE], tl.float32)
        for tile in tl.range(0, num_pages, warp_specialize=WARP_SPECIALIZE):
            page = tl.load(block_table_ptr + tile)
            k = key_desc.load([page * PAGE, 0])
            v = value_desc.load([page * PAGE, 0])
            scores = tl.dot(q, tl.trans(k))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            probs = tl.exp2(scores - new_max[:, None])
            rescale = tl.exp2(running_max - new_max)
            running_sum = running_sum * rescale + tl.sum(probs, axis=1)
            acc = tl.dot(probs.to(tl.bfloat16), v, acc * rescale[:, None])
            running_max = new_max
        out = acc / running_sum[:, None]
        tl.store(output_ptr + rows[:, None] * HEAD_SIZE + dims[None, :], out)

    return matmul_loop, attention_loop


@contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """The process's file descriptor 2 while the block runs: MLIR's pass failures and
    assertions are printed there by C++, not raised."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines.extend(capture.read().splitlines())


def _refusal(error: Exception, stderr: list[str]) -> str:
    """The failing pass and why, from MLIR's messages (an op's error or an assertion), else the
    exception."""
    failed_pass = next(
        (m.group(1) for line in stderr if (m := re.search(r"executing \[`(\w+)`", line))), None
    )
    if failed_pass is None:
        return f"{type(error).__name__}: {error}"
    reasons = []
    for line in stderr:
        if assertion := re.search(r"([\w.]+:\d+): .*(Assertion .*)", line):
            reasons.append(f"{assertion.group(1)}: {assertion.group(2)}")
        elif "LLVM ERROR: " in line:
            reasons.append(line.split("LLVM ERROR: ", 1)[1].strip())
        elif "error: " in line and "Failures have been detected" not in line:
            reasons.append(line.split("error: ", 1)[1].strip())
    return "; ".join([f"pass {failed_pass}", *dict.fromkeys(reasons)])


def _source(key: ProbeKey):
    """The loop's ``ASTSource``: its kernel, argument types and constants."""
    from triton.compiler import ASTSource

    matmul_loop, attention_loop = _kernels()
    if key.loop == "matmul":
        tile = f"tensordesc<bf16[{MATRIX_TILE},{MATRIX_TILE}]>"
        return ASTSource(
            matmul_loop,
            {"a_desc": tile, "b_desc": tile, "c_ptr": "*fp32", "k_len": "i32",
             "TILE": "constexpr", "WARP_SPECIALIZE": "constexpr"},
            {"TILE": MATRIX_TILE, "WARP_SPECIALIZE": key.warp_specialize},
        )  # fmt: skip
    query_descriptor = key.loop == "attention-query-descriptor"
    page = f"tensordesc<bf16[{PAGE_SIZE},{key.head_size}]>"
    return ASTSource(
        attention_loop,
        {"query": f"tensordesc<bf16[{key.rows},{key.head_size}]>" if query_descriptor else "*bf16",
         "key_desc": page, "value_desc": page, "block_table_ptr": "*i32", "output_ptr": "*fp32",
         "num_pages": "i32", "ROWS": "constexpr", "PAGE": "constexpr", "HEAD_SIZE": "constexpr",
         "QUERY_DESCRIPTOR": "constexpr", "WARP_SPECIALIZE": "constexpr"},
        {"ROWS": key.rows, "PAGE": PAGE_SIZE, "HEAD_SIZE": key.head_size,
         "QUERY_DESCRIPTOR": query_descriptor, "WARP_SPECIALIZE": key.warp_specialize},
    )  # fmt: skip


def probe(key: ProbeKey) -> ProbeRow:
    """``key``'s loop compiled for sm_90, and what came of ``warp_specialize``."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile

    from attngroup.benchmarks.tuning.offline_compile import (
        SM90,
        CompiledKernel,
        cubin_resource_usage,
    )

    options = {"num_warps": key.num_warps, "num_stages": NUM_STAGES}
    with _captured_stderr() as stderr:
        try:
            compiled = compile(_source(key), target=GPUTarget(*SM90), options=options)
        except RuntimeError as error:
            failure: RuntimeError | None = error
        else:
            failure = None
    if failure is not None:
        return ProbeRow(key, "refused", None, None, _refusal(failure, stderr))
    registers, stack = cubin_resource_usage(compiled.asm["cubin"])
    ptx = compiled.asm["ptx"]
    kernel = CompiledKernel(
        registers=registers,
        stack_bytes=stack,
        shared_bytes=compiled.metadata.shared,
        num_warps=compiled.metadata.num_warps,
    )
    split = "ttg.warp_specialize(" in compiled.asm["ttgir"]
    return ProbeRow(key, "split" if split else "unchanged", kernel, ptx.count("setmaxnreg"), None)


def _line(row: ProbeRow) -> str:
    key = row.key
    shape = f"{key.loop} head {key.head_size} rows {key.rows}" if key.rows else key.loop
    text = f"{shape:<48} {key.num_warps} warps  warp_specialize={key.warp_specialize!s:<5}  {row.outcome}"
    if row.compiled is None:
        return f"{text}: {row.refusal}"
    kernel = row.compiled
    return (
        f"{text}: {kernel.num_warps} warps, {kernel.registers} regs, {kernel.stack_bytes} B stack,"
        f" {kernel.shared_bytes / 1024:.1f} KiB, {kernel.programs_per_sm} per SM,"
        f" setmaxnreg {row.setmaxnreg}"
    )


def probe_keys(
    head_sizes: Sequence[int], rows: Sequence[int], warps: Sequence[int]
) -> list[ProbeKey]:
    """The matrix product, then each attention loop, each with and without the flag."""
    shapes: list[tuple[Loop, int | None, int | None]] = [("matmul", None, None)]
    shapes += [
        (loop, head_size, row_count)
        for loop in ("attention-query-pointer", "attention-query-descriptor")
        for head_size in head_sizes
        for row_count in rows
    ]
    return [
        ProbeKey(loop, head_size, row_count, num_warps, warp_specialize)
        for loop, head_size, row_count in shapes
        for num_warps in warps
        for warp_specialize in (False, True)
    ]


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(
        "attngroup.benchmarks.tuning.warp_specialize_probe",
        __doc__.split("\n\n")[0],
        "exit status: 0 every loop compiled or was refused as reported; 2 bad input or "
        "environment (the interpreter is on, a loop without the flag failed to compile)",
    )
    parser.add_argument("--head-sizes", type=_int_list, default=[256, 512])
    parser.add_argument("--rows", type=_int_list, default=[16, 64])
    parser.add_argument("--warps", type=_int_list, default=[4, 8])
    parser.add_argument("--json", type=Path, help="write the rows to this JSON file")
    args = parser.parse_args(argv)
    from attngroup.benchmarks.tuning.offline_compile import refuse_the_interpreter

    refuse_the_interpreter(parser)
    import triton

    print(f"Triton {triton.__version__}, sm_90, {NUM_STAGES} stages, {PAGE_SIZE}-key pages")
    rows = []
    for key in probe_keys(args.head_sizes, args.rows, args.warps):
        row = probe(key)
        print(_line(row))
        if row.outcome == "refused" and not key.warp_specialize:
            print(f"warp_specialize_probe: the loop without the flag failed to compile: "
                  f"{row.refusal}", file=sys.stderr)  # fmt: skip
            return 2
        rows.append(row)
    if args.json is not None:
        from attngroup.atomic_write import write_text

        record = {"triton": triton.__version__, "rows": [row.as_json() for row in rows]}
        write_text(args.json, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
