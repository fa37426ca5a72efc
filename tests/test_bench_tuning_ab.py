"""The launch-variant A/B's pure parts: variant configs and the per-kind candidates."""

from __future__ import annotations

import pytest

from attngroup.benchmarks.tuning.ab import CURRENT, VARIANTS, Variant, candidates
from attngroup.kernels.ops.triton_launch_config import LaunchConfig

HEURISTIC = LaunchConfig(block_m=32, tile_size=64, num_warps=4, num_stages=2, num_segments=6)
E2B_VERIFY = "verify.gemma4-e2b-sliding-d256.b16x32k"
E4B_VERIFY = "verify.gemma4-e4b-sliding-d256.b64x8k"
E2B_DECODE = "decode.gemma4-e2b-sliding-d256.b64x8k"


def test_current_is_the_launchers_choice_and_variants_refit_segments() -> None:
    assert Variant(CURRENT).config(HEURISTIC) is None
    halved = Variant("v", {"value_splits": 2}, tile_divisor=2).config(HEURISTIC)
    assert halved == LaunchConfig(32, 32, 4, 2, None, value_splits=2)
    fixed = Variant("s", {"num_segments": 2}).config(HEURISTIC)
    assert fixed == LaunchConfig(32, 64, 4, 2, 2)  # a fixed count is kept, not refitted
    assert len({variant.name for variant in VARIANTS}) == len(VARIANTS)


def _row(variant: str, ratio: float | None, correct: bool = True, **config) -> dict:
    base = {"tile_size": 64, "num_warps": 4, "num_stages": 2, "value_splits": 1}
    row = {"variant": variant, "correct": correct, "config": base | config}
    row["config"].setdefault("prefetch_block_table", False)
    row["config"].setdefault("tma_kv", False)
    if ratio is not None:
        row["over_current"] = ratio
    return row


def _report(**ratios: tuple[float, float, float]) -> dict:
    """Per variant, its ratio on the two head-256 verify cases and the head-256 decode."""
    rows = {name: [_row(CURRENT, 1.0)] for name in (E2B_VERIFY, E4B_VERIFY, E2B_DECODE)}
    for variant, (first, second, decode) in ratios.items():
        rows[E2B_VERIFY].append(_row(variant, first, value_splits=2))
        rows[E4B_VERIFY].append(_row(variant, second, value_splits=2))
        rows[E2B_DECODE].append(_row(variant, decode, value_splits=2))
    return rows


@pytest.mark.parametrize(
    ("ratios", "verify_choice", "decode_choice"),
    [
        pytest.param({"a": (0.90, 0.99, 1.2)}, "a", CURRENT, id="faster-on-every-verify"),
        pytest.param({"a": (0.90, 0.999, 0.9)}, CURRENT, "a", id="level-on-one-verify"),
        pytest.param({"a": (0.95, 0.95, 1), "b": (0.90, 0.98, 1)}, "b", CURRENT, id="geomean"),
    ],
)
def test_a_candidate_is_faster_on_every_case_of_its_kind(
    ratios: dict, verify_choice: str, decode_choice: str
) -> None:
    entries = candidates(_report(**ratios))
    chosen = {entry["several_tokens"]: entry for entry in entries if entry["group_size"] is None}
    assert chosen[True]["variant"] == verify_choice
    assert chosen[False]["variant"] == decode_choice
    expected = {} if verify_choice == CURRENT else {"value_splits": 2}
    assert {k: v for k, v in chosen[True]["options"].items() if k == "value_splits"} == expected


def test_a_wrong_variant_is_never_a_candidate() -> None:
    report = _report(a=(0.5, 0.5, 0.5))
    report[E4B_VERIFY][1] = _row("a", None, correct=False)
    chosen = {
        (entry["several_tokens"], entry["group_size"]): entry["variant"]
        for entry in candidates(report)
    }
    assert chosen == {(True, None): CURRENT, (True, 4): CURRENT, (True, 8): "a", (False, None): "a"}


def test_a_group_size_gets_its_own_candidate_only_where_the_kind_has_none() -> None:
    """The e2b verify (8 query heads per KV head) faster, the e4b one (4) level: an entry for
    group size 8 alone; a kind-wide winner leaves no per-group entries."""
    level = {
        (entry["several_tokens"], entry["group_size"]): entry["variant"]
        for entry in candidates(_report(a=(0.90, 0.999, 1.0)))
    }
    assert level == {
        (True, None): CURRENT,
        (True, 4): CURRENT,
        (True, 8): "a",
        (False, None): CURRENT,
    }
    wide = candidates(_report(a=(0.90, 0.98, 1.0)))
    assert [(e["several_tokens"], e["group_size"], e["variant"]) for e in wide] == [
        (False, None, CURRENT),
        (True, None, "a"),
    ]


def test_rows_per_program_enter_an_entry_only_from_a_variant_that_sets_them() -> None:
    report = _report(**{"rows-16": (0.9, 1.0, 1.0), "half-tile": (1.0, 1.0, 0.9)})
    for name in report:
        for row in report[name]:
            row["config"]["block_m"] = 16
    options = {
        (entry["several_tokens"], entry["group_size"]): entry["options"]
        for entry in candidates(report)
    }
    assert options[(True, 8)]["block_m"] == 16
    assert "block_m" not in options[(False, None)]


def test_a_forced_path_is_the_variants_and_never_a_candidate() -> None:
    """A variant that forces the 2D launch keeps its path, and however fast it is, no tuned
    entry is proposed from it (the path is select_path's decision)."""
    from attngroup.benchmarks.tuning.ab import find_case

    case = find_case(E2B_DECODE)
    forced = next(variant for variant in VARIANTS if variant.path == "2d")
    assert forced.launch_path(case) == "2d"
    assert Variant(CURRENT).launch_path(case) == "3d"
    report = _report(**{forced.name: (0.5, 0.5, 0.5)})
    assert {entry["variant"] for entry in candidates(report)} == {CURRENT}
