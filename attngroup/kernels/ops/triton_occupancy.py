"""How many programs of a compiled Triton kernel a device runs at once (one "wave").

The split-KV launch sizes its segment count by whole waves. ``measure_wave_slots`` is the
one place that compiles a kernel to read its registers and shared memory; the launch plan
receives it as an injected probe, so planning itself never touches a device.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch
import triton

from attngroup.kernels.metadata import cdiv

H200_SMS = 132
H200_WAVE_SLOTS = 3 * H200_SMS
"""Programs the H200 holds at once for the head-256 decode kernel (168 registers per thread and
76 KB of shared memory allow 3 per SM, per Nsight Compute)."""
REGISTERS_PER_SM = 65536
"""32-bit registers per SM on every NVIDIA GPU since Maxwell."""


def resident_programs_per_sm(
    *,
    registers_per_thread: int,
    shared_bytes: int,
    num_warps: int,
    max_threads_per_sm: int,
    shared_bytes_per_sm: int,
    warp_size: int = 32,
) -> int:
    """Programs of a compiled kernel one SM holds at once: the tightest of its register file
    (allocated per warp in 256-register units), shared memory (1 KiB reserved per program) and
    thread limits. Nsight Compute's "Block Limit" figures follow the same rules."""
    registers_per_warp = cdiv(registers_per_thread * warp_size, 256) * 256
    by_registers = REGISTERS_PER_SM // (registers_per_warp * num_warps)
    by_shared = shared_bytes_per_sm // (shared_bytes + 1024)
    by_threads = max_threads_per_sm // (num_warps * warp_size)
    return max(1, min(by_registers, by_shared, by_threads))


_WAVE_SLOTS: dict[tuple, int] = {}


def measure_wave_slots(
    kernel: triton.JITFunction,
    arguments: Sequence[object],
    constexprs: Mapping[str, object],
    options: Mapping[str, int],
    device: torch.device,
) -> int:
    """Programs of this kernel variant the device runs at once. On a GPU: SMs times resident
    programs, from the compiled kernel's registers and shared memory (compiled ahead of its
    first launch, as Triton's softmax tutorial does, and cached per variant). Under the
    interpreter: one program per CPU core."""
    if device.type != "cuda":
        return os.cpu_count() or 1
    dtypes = tuple(a.dtype for a in arguments if isinstance(a, torch.Tensor))
    name = f"{kernel.fn.__module__}.{kernel.fn.__qualname__}"
    key = (name, device.index, dtypes, *sorted(constexprs.items()), *sorted(options.items()))
    if key not in _WAVE_SLOTS:
        compiled = kernel.warmup(*arguments, grid=(1,), **constexprs, **options)
        compiled._init_handles()
        properties = torch.cuda.get_device_properties(device)
        resident = resident_programs_per_sm(
            registers_per_thread=compiled.n_regs,
            shared_bytes=compiled.metadata.shared,
            num_warps=options["num_warps"],
            max_threads_per_sm=properties.max_threads_per_multi_processor,
            shared_bytes_per_sm=properties.shared_memory_per_multiprocessor,
        )
        _WAVE_SLOTS[key] = properties.multi_processor_count * resident
    return _WAVE_SLOTS[key]
