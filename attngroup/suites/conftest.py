"""Suite-wide fixtures: the engine under test and the device.

Their options are declared in the repository's root ``conftest.py`` (pytest reads only
that one's options when a run names no path, as ``pytest -k mtp --pairs FILE`` does):
``--engine NAME`` picks the implementation the suites judge through the
adapter seam (``attngroup/suites/engines/NAME_adapter.py``); ``--device`` the device
kernels and the engine run on (CUDA when present, else the CPU, where Triton
kernels run under its interpreter); ``--pairs FILE`` (or ``$AGC_PAIRS``) adds
the model pairs of a pairs file to every suite.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before triton is imported anywhere.
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    # One torch thread per xdist worker: the workers already fill the cores, and a pool
    # per worker as wide as the machine oversubscribes them (a tiny model's step ran
    # 4x slower on 2 cores with 2 workers). OMP_NUM_THREADS, when set, decides instead.
    torch.set_num_threads(1)

from attngroup.reference_engine.pairs.pair_options import PAIRS_ENV
from attngroup.reference_engine.pairs.pairs_file import PairsFileError, register_pairs_file
from attngroup.suites.cases import CaseArgumentError, mark_case
from attngroup.suites.engines.base import EngineAdapter, EngineUnavailableError

SUITES_DIR = Path(__file__).resolve().parent
_ADAPTER_KEY = pytest.StashKey[EngineAdapter]()


def pytest_configure(config: pytest.Config) -> None:
    """Register the pairs file's pairs before the suites' modules list their pairs."""
    path = config.getoption("pairs")
    if path is not None:
        try:
            register_pairs_file(Path(path))
        except PairsFileError as error:
            raise pytest.UsageError(f"--pairs: {error}") from None
        os.environ[PAIRS_ENV] = str(Path(path).resolve())  # subprocesses the suites start


def _make_adapter(config: pytest.Config) -> EngineAdapter:
    if _ADAPTER_KEY not in config.stash:
        name = config.getoption("engine")
        try:
            module = importlib.import_module(f"attngroup.suites.engines.{name}_adapter")
        except ModuleNotFoundError as error:
            if error.name != f"attngroup.suites.engines.{name}_adapter":
                raise
            raise pytest.UsageError(
                f"--engine {name}: no adapter attngroup/suites/engines/{name}_adapter.py"
            ) from None
        config.stash[_ADAPTER_KEY] = module.make_adapter(config)
    return config.stash[_ADAPTER_KEY]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests that take ``policy`` run once per grouping policy the engine has."""
    if "policy" in metafunc.fixturenames and not any(
        "policy" in call.params for call in getattr(metafunc, "_calls", [])
    ):
        metafunc.parametrize("policy", _make_adapter(metafunc.config).policies)


@pytest.fixture(scope="session")
def engine(request: pytest.FixtureRequest) -> EngineAdapter:
    """The engine under test (``--engine``)."""
    return _make_adapter(request.config)


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> torch.device:
    chosen = request.config.getoption("device")
    return torch.device(chosen or ("cuda" if torch.cuda.is_available() else "cpu"))


@contextmanager
def _unavailable_as_skip() -> Iterator[None]:
    """A configuration the engine does not run is skipped with the engine's reason."""
    try:
        yield
    except EngineUnavailableError as error:
        pytest.skip(f"the engine does not run this configuration: {error}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> object:
    """The engine starts up in fixtures, so setup as well as the call may find it refuses."""
    with _unavailable_as_skip():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    with _unavailable_as_skip():
        return (yield)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every suite test says what it is about, for the run record (``attngroup/suites/cases.py``)."""
    for item in items:
        if item.path.is_relative_to(SUITES_DIR):
            try:
                mark_case(item)
            except CaseArgumentError as error:
                raise pytest.UsageError(str(error)) from None
