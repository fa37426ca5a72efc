"""The tensor-parallel launcher (``attngroup.suites.tp_launch``): torchrun's environment,
one process group per launch (gloo here, NCCL on two GPUs), failing and hung
ranks named, bad entries refused before any rank starts.

The entries below run inside the rank processes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from attngroup.reference_engine.model_pairs import get_model_pair
from attngroup.reference_engine.pairs.pair_options import PAIRS_ENV
from attngroup.suites.tp_launch import (
    RankContext,
    TPLaunchError,
    launch,
    main,
    missing_devices_reason,
    process_group_backend,
)

TP_SIZE = 2
REGRESSION_PAIRS = (
    Path(__file__).resolve().parents[1] / "attngroup" / "suites" / "data" / "regression_pairs.yaml"
)
TIMEOUT_S = 300
HANG_TIMEOUT_S = 5
TORCHRUN_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def all_reduce_ranks(ctx: RankContext, offset: int) -> dict:
    value = torch.tensor([float(ctx.rank + offset)], device=ctx.device)
    dist.all_reduce(value, group=ctx.group)
    return {
        "context": [ctx.rank, ctx.world_size, ctx.local_rank, str(ctx.device)],
        "env": {name: os.environ[name] for name in TORCHRUN_ENV},
        "backend": dist.get_backend(ctx.group),
        "sum": value.item(),
    }


def fail_on_rank(ctx: RankContext, failing_rank: int) -> None:
    if ctx.rank == failing_rank:
        raise ValueError(f"deliberate failure on rank {ctx.rank}")
    time.sleep(TIMEOUT_S)


def hang(ctx: RankContext) -> None:
    time.sleep(TIMEOUT_S)


def known_pair(ctx: RankContext, name: str) -> str:
    return get_model_pair(name).name


@pytest.mark.parametrize("device_type", ["cpu", "cuda"], ids=["gloo", "nccl-tp2"])
def test_every_rank_joins_one_group_with_torchrun_env(tmp_path: Path, device_type: str) -> None:
    reason = missing_devices_reason(device_type, TP_SIZE)
    if reason is not None:
        pytest.skip(reason)
    results = launch(
        f"{__name__}:all_reduce_ranks",
        {"offset": 10},
        world_size=TP_SIZE,
        device_type=device_type,
        work_dir=tmp_path,
        timeout_s=TIMEOUT_S,
    )
    ports = {result["env"]["MASTER_PORT"] for result in results}
    assert len(ports) == 1
    for rank, result in enumerate(results):
        device = f"cuda:{rank}" if device_type == "cuda" else "cpu"
        assert result["context"] == [rank, TP_SIZE, rank, device]
        assert result["env"]["RANK"] == result["env"]["LOCAL_RANK"] == str(rank)
        assert result["env"]["WORLD_SIZE"] == result["env"]["LOCAL_WORLD_SIZE"] == str(TP_SIZE)
        assert result["backend"] == process_group_backend(device_type)
        assert result["sum"] == 0 + 1 + 2 * 10


def test_a_failing_rank_is_named_and_the_others_stopped(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(TPLaunchError) as error:
        launch(
            f"{__name__}:fail_on_rank",
            {"failing_rank": 1},
            world_size=TP_SIZE,
            device_type="cpu",
            work_dir=tmp_path,
            timeout_s=TIMEOUT_S,
        )
    message = str(error.value)
    assert "rank 1 exited with code 1" in message
    assert "stopped ranks [0]" in message
    assert "ValueError: deliberate failure on rank 1" in message
    assert time.monotonic() - start < TIMEOUT_S / 2, "the sleeping rank was not stopped"


def test_a_hung_launch_times_out_naming_the_ranks(tmp_path: Path) -> None:
    with pytest.raises(TPLaunchError, match=r"tp ranks \[0, 1\] of 2 still running after 5 s"):
        launch(
            f"{__name__}:hang",
            {},
            world_size=TP_SIZE,
            device_type="cpu",
            work_dir=tmp_path,
            timeout_s=HANG_TIMEOUT_S,
        )
    assert not list(tmp_path.glob("rank*.pt"))


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        pytest.param("tests.test_tp_launch", "must read 'package.module:function'", id="no-colon"),
        pytest.param("tests.no_such_module:f", "no module 'tests.no_such_module'", id="no-module"),
        pytest.param(f"{__name__}:missing", "has no function missing", id="no-function"),
    ],
)
def test_a_bad_entry_is_refused_before_any_rank_starts(
    tmp_path: Path, entry: str, expected: str
) -> None:
    with pytest.raises(TPLaunchError, match=expected):
        launch(entry, {}, world_size=TP_SIZE, device_type="cpu", work_dir=tmp_path, timeout_s=1)
    assert not list(tmp_path.iterdir()), "nothing may be written for a refused launch"


def test_cuda_needs_one_device_per_rank(tmp_path: Path) -> None:
    too_many = torch.cuda.device_count() + 1
    reason = missing_devices_reason("cuda", too_many)
    assert reason is not None and "NCCL" in reason and f"needs {too_many} CUDA devices" in reason
    with pytest.raises(TPLaunchError, match="NCCL refuses two ranks on one GPU"):
        launch(
            f"{__name__}:hang",
            {},
            world_size=too_many,
            device_type="cuda",
            work_dir=tmp_path,
            timeout_s=1,
        )


def test_backends_by_device() -> None:
    assert process_group_backend("cuda") == "nccl"
    assert process_group_backend("cpu") == "gloo"
    with pytest.raises(TPLaunchError, match="cuda or cpu, not 'mps'"):
        process_group_backend("mps")


@pytest.mark.parametrize(
    ("env", "kwargs", "expected"),
    [
        pytest.param({}, "{}", "RANK must be a non-negative integer, got None", id="no-rank"),
        pytest.param(
            {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, "{", "not JSON", id="bad-kwargs"
        ),
    ],
)
def test_a_rank_with_bad_input_exits_2_without_traceback(
    tmp_path: Path, monkeypatch, capsys, env: dict, kwargs: str, expected: str
) -> None:
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "kwargs.json").write_text(kwargs)
    code = main([f"{__name__}:hang", "--work-dir", str(tmp_path), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err and "Traceback" not in err


def test_ranks_know_the_pairs_of_the_suites_pairs_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pytest --pairs FILE`` sets ``$AGC_PAIRS``; a rank must find the file's pairs too."""
    monkeypatch.setenv(PAIRS_ENV, str(REGRESSION_PAIRS))
    results = launch(
        f"{__name__}:known_pair",
        {"name": "mistral-window8-draft"},
        world_size=TP_SIZE,
        device_type="cpu",
        work_dir=tmp_path,
        timeout_s=TIMEOUT_S,
    )
    assert results == ["mistral-window8-draft"] * TP_SIZE
