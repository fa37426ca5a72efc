"""Grouping policy at engine level: LEGACY on a mixed pair fails at start-up with
vLLM's exact assertion (engine and CLI); on a uniform pair both policies give the
same tokens."""

from __future__ import annotations

import argparse
import re

import pytest

from attngroup.reference_engine.cli import generate_cli
from attngroup.reference_engine.model_pairs import get_model_pair
from attngroup.suites.spec_decode.harness import (
    MIXED_PAIRS,
    UNIFORM_PAIRS,
    case_marks,
    greedy_generate,
    prompts_for,
)

MESSAGE = re.compile(
    r"All layers in one attention group must share num_heads; got \{(\d+), (\d+)\} for \[(.+)\]\.$"
)


def _cases(pairs) -> list:
    return [
        pytest.param(pair, marks=case_marks(pair, "torch", "fp32"), id=f"{pair}-torch-fp32")
        for pair in pairs
    ]


def _check_message(pair: str, message: str) -> None:
    match = MESSAGE.fullmatch(message)
    assert match, f"not vLLM's assertion message: {message!r}"
    heads = {layer.num_heads_q for layer in get_model_pair(pair).layers() if layer.is_attention}
    assert {int(match[1]), int(match[2])} == heads
    named = set(re.findall(r"'([^']+)'", match[3]))
    roles = get_model_pair(pair).layer_roles()
    assert named & set(roles["target"]) and named & set(roles["draft"]), (
        "must name target and draft layers"
    )


@pytest.mark.parametrize("pair", _cases(MIXED_PAIRS))
def test_legacy_policy_fails_at_engine_start(engines, pair: str) -> None:
    with pytest.raises(AssertionError) as raised:
        engines.engine(pair, policy="legacy", num_spec_tokens=1)
    _check_message(pair, str(raised.value))


@pytest.mark.parametrize("pair", _cases(MIXED_PAIRS[:1]))
def test_generate_cli_legacy_exits_1_with_the_message(
    pair: str, capsys: pytest.CaptureFixture
) -> None:
    parser = argparse.ArgumentParser()
    generate_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["generate", pair, "--policy", "legacy", "--device", "cpu", "--batch", "1"]
    )
    assert args.run(args) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("AssertionError: ")
    _check_message(pair, captured.err.removeprefix("AssertionError: ").rstrip("\n"))


@pytest.mark.parametrize("pair", _cases(UNIFORM_PAIRS))
def test_uniform_pair_same_tokens_under_both_policies(
    engines, target_only_tokens, pair: str
) -> None:
    prompts = prompts_for(pair)
    reference = target_only_tokens(pair, "torch", "fp32")
    oracle = {tuple(prompt): output for prompt, output in zip(prompts, reference, strict=True)}
    engine = engines.engine(pair, policy="legacy", num_spec_tokens=1, oracle=oracle)
    assert greedy_generate(engine, prompts) == reference
