"""One process per tensor-parallel rank, launched the way ``torchrun`` does.

``launch(entry, kwargs, world_size=..., device_type=..., work_dir=...)`` starts
``world_size`` copies of ``python -m attngroup.suites.tp_launch`` with torchrun's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``). Each rank joins the default process group
(NCCL on CUDA with device ``cuda:LOCAL_RANK``, gloo on the CPU), calls
``entry`` (``"module:function"``) as ``function(RankContext, **kwargs)``, and
saves what it returns (tensors, lists, dicts) to ``work_dir/rank<R>.pt``;
``launch`` returns those results in rank order. The runner suite and the
spec-decode suite both run their ranks through it, so the CPU (gloo) cases
cover everything but the NCCL transport.

A rank that exits non-zero stops the others at once and raises
``TPLaunchError`` naming the rank, its exit code and the end of its log; a
launch that outlives ``timeout_s`` (a rank stuck in a collective) kills every
rank and names the ones still running. Under a real ``torchrun`` the child
works unchanged: ``torchrun --nproc-per-node 2 -m attngroup.suites.tp_launch ENTRY
--work-dir DIR --device cuda`` (with ``DIR/kwargs.json``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from attngroup import atomic_write
from attngroup.reference_engine.pairs.pair_options import PAIRS_ENV, pairs_file_from_env
from attngroup.reference_engine.pairs.pairs_file import PairsFileError, register_pairs_file

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_TAIL_CHARS = 4000
POLL_INTERVAL_S = 0.1
#: How long a collective may wait for a peer inside a rank (the launch has its own timeout).
COLLECTIVE_TIMEOUT_S = 600


class TPLaunchError(RuntimeError):
    """A tensor-parallel launch could not start, a rank failed, or the ranks timed out."""


@dataclass(frozen=True)
class RankContext:
    """What a rank's entry function gets: who it is and where it runs."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    group: Any = field(default=None, compare=False)  # the default process group


def process_group_backend(device_type: str) -> str:
    """NCCL between CUDA devices, gloo between CPU processes."""
    if device_type == "cuda":
        return "nccl"
    if device_type == "cpu":
        return "gloo"
    raise TPLaunchError(f"tensor parallelism runs on cuda or cpu, not {device_type!r}")


def missing_devices_reason(device_type: str, world_size: int) -> str | None:
    """Why ``world_size`` ranks cannot run on ``device_type`` here, or None.

    NCCL refuses two ranks on one GPU, so CUDA needs one device per rank.
    """
    process_group_backend(device_type)
    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    if device_type == "cuda":
        found = torch.cuda.device_count()
        if found < world_size:
            return (
                f"tensor parallelism over NCCL needs {world_size} CUDA devices (one per rank; "
                f"NCCL refuses two ranks on one GPU), found {found}"
            )
    return None


def resolve_entry(entry: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function, or a TPLaunchError saying what is wrong."""
    module_name, colon, function_name = entry.partition(":")
    if not colon or not module_name or not function_name:
        raise TPLaunchError(f"rank entry {entry!r} must read 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise TPLaunchError(f"rank entry {entry!r}: no module {error.name!r}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise TPLaunchError(f"rank entry {entry!r}: {module_name} has no function {function_name}")
    return function


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_env(rank: int, world_size: int, port: int, device_type: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }
    if device_type == "cpu":
        env["TRITON_INTERPRET"] = "1"  # before triton is imported: the KV write is a Triton kernel
    return env


def _log_tail(path: Path) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-LOG_TAIL_CHARS:] or "(no output)"


def _stop(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.kill()
    for worker in workers:
        worker.wait()


def launch(
    entry: str,
    kwargs: Mapping[str, Any],
    *,
    world_size: int,
    device_type: str,
    work_dir: Path,
    timeout_s: float,
) -> list[Any]:
    """Run ``entry`` on ``world_size`` ranks; its return value per rank, in rank order."""
    resolve_entry(entry)
    reason = missing_devices_reason(device_type, world_size)
    if reason is not None:
        raise TPLaunchError(reason)
    work_dir.mkdir(parents=True, exist_ok=True)
    for stale in work_dir.glob("rank*.pt"):  # an earlier launch's results are not this one's
        stale.unlink()
    (work_dir / "kwargs.json").write_text(json.dumps(dict(kwargs)))
    port = _free_port()
    logs = [work_dir / f"rank{rank}.log" for rank in range(world_size)]
    command = [sys.executable, "-m", "attngroup.suites.tp_launch", entry]
    command += ["--work-dir", str(work_dir), "--device", device_type]
    workers = []
    try:
        for rank in range(world_size):
            with logs[rank].open("w") as log:
                workers.append(
                    subprocess.Popen(
                        command,
                        cwd=REPO_ROOT,
                        env=_rank_env(rank, world_size, port, device_type),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        _wait(workers, logs, timeout_s)
    finally:
        _stop(workers)
    return [_result(work_dir, rank, logs[rank]) for rank in range(world_size)]


def _wait(workers: list[subprocess.Popen], logs: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [worker.poll() for worker in workers]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            running = [rank for rank, code in enumerate(codes) if code is None]
            _stop(workers)
            exits = ", ".join(f"rank {rank} exited with code {codes[rank]}" for rank in failed)
            tails = "\n".join(
                f"--- rank {rank} log (end) ---\n{_log_tail(logs[rank])}" for rank in failed
            )
            raise TPLaunchError(
                f"tp launch of {len(workers)} ranks failed: {exits}"
                f"{f'; stopped ranks {running}' if running else ''}\n{tails}"
            )
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            running = [rank for rank, code in enumerate(codes) if code is None]
            _stop(workers)
            tails = "\n".join(
                f"--- rank {rank} log (end) ---\n{_log_tail(logs[rank])}" for rank in running
            )
            raise TPLaunchError(
                f"tp ranks {running} of {len(workers)} still running after {timeout_s:g} s "
                f"(stuck in start-up or waiting for a peer in a collective); killed them\n{tails}"
            )
        time.sleep(POLL_INTERVAL_S)


def _result(work_dir: Path, rank: int, log: Path) -> Any:
    path = work_dir / f"rank{rank}.pt"
    if not path.exists():
        raise TPLaunchError(
            f"tp rank {rank} exited with 0 but wrote no result {path}\n"
            f"--- rank {rank} log (end) ---\n{_log_tail(log)}"
        )
    return torch.load(path, weights_only=True)


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None or not value.isdigit():
        raise TPLaunchError(
            f"environment variable {name} must be a non-negative integer, got {value!r}"
        )
    return int(value)


def init_rank(device_type: str) -> RankContext:
    """Join the default process group from torchrun's environment variables."""
    rank, world_size, local_rank = (_env_int(n) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    backend = process_group_backend(device_type)
    device = torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")
    options: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        options["device_id"] = device  # binds the NCCL communicator to this rank's GPU
    dist.init_process_group(
        backend,
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        **options,
    )
    return RankContext(rank, world_size, local_rank, device, dist.group.WORLD)


def _register_env_pairs() -> None:
    """The pairs of the pairs file the suites run with (``--pairs`` sets ``$AGC_PAIRS`` for
    the processes they start), so that a rank finds a pair the launching test named."""
    path = pairs_file_from_env()
    if path is not None:
        try:
            register_pairs_file(path)
        except PairsFileError as error:
            raise TPLaunchError(f"${PAIRS_ENV}: {error}") from None


def main(argv: list[str] | None = None) -> int:
    """One rank: exit 2 on a bad entry or environment, 1 (with its traceback) when the entry raises."""
    parser = argparse.ArgumentParser(
        description="one tensor-parallel rank (see attngroup.suites.tp_launch)"
    )
    parser.add_argument("entry", help="package.module:function, called as function(ctx, **kwargs)")
    parser.add_argument("--work-dir", type=Path, required=True, help="holds kwargs.json")
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    args = parser.parse_args(argv)
    kwargs_file = args.work_dir / "kwargs.json"
    try:
        _register_env_pairs()
        function = resolve_entry(args.entry)
        if not kwargs_file.is_file():
            raise TPLaunchError(f"{kwargs_file}: missing (the entry's keyword arguments as JSON)")
        try:
            kwargs = json.loads(kwargs_file.read_text())
        except json.JSONDecodeError as error:
            raise TPLaunchError(f"{kwargs_file}: not JSON ({error})") from None
        context = init_rank(args.device)
    except TPLaunchError as error:
        print(f"tp rank: error: {error}", file=sys.stderr)
        return 2
    result = function(context, **kwargs)  # a failure leaves the group to the launcher's kill
    dist.destroy_process_group()
    atomic_write.write_with(
        args.work_dir / f"rank{context.rank}.pt", lambda temporary: torch.save(result, temporary)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
