"""What a suite test is about: ``@pytest.mark.case(pair=..., backend=..., dtype=..., ...)``.

The run record's model pair x check matrix reads this marker (``attngroup.reports.pytest_plugin``)
instead of guessing from parameter names. A parametrization helper may set it itself
(``attngroup.suites.spec_decode.harness.case_marks`` names the backend and dtype its tests run on
without taking them as arguments); every other suite test gets it at collection from the
arguments ``CASE_ARGUMENTS`` names. An argument named for a pair must hold a model pair
(a ``ModelPair``, or the name of a registered one), so a test parameter such as ``large-then-small`` cannot become a matrix row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from attngroup.reference_engine.model_pairs import MODEL_PAIRS, ModelPair

CASE_MARKER = "case"
# marker keyword -> the suites' argument names that hold it (first present wins)
CASE_ARGUMENTS = {
    "pair": ("pair", "pair_name"),
    "backend": ("backend", "backend_name"),
    "dtype": ("dtype",),
    "tp": ("tp",),
    "k": ("k",),
    "policy": ("policy",),
}


class CaseArgumentError(ValueError):
    """A suite argument named for a model pair holds something else."""


def case_of(nodeid: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The marker's keywords for a test with these parameters."""
    case = {}
    for keyword, names in CASE_ARGUMENTS.items():
        name = next((name for name in names if name in params), None)
        if name is not None:
            case[keyword] = params[name]
    pair = case.get("pair")
    if isinstance(pair, ModelPair):
        case["pair"] = pair.name
    elif pair is not None and pair not in MODEL_PAIRS:
        name = next(name for name in CASE_ARGUMENTS["pair"] if name in params)
        raise CaseArgumentError(
            f"{nodeid}: argument {name!r} is {pair!r}, not a model pair; rename the argument "
            "(arguments named pair or pair_name are the report's model-pair rows)"
        )
    return case


def mark_case(item: pytest.Item) -> None:
    """Give ``item`` its case marker from its arguments, unless it carries one already."""
    if item.get_closest_marker(CASE_MARKER) is not None:
        return
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    item.add_marker(getattr(pytest.mark, CASE_MARKER)(**case_of(item.nodeid, params)))
