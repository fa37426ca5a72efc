"""Semantic lint: rules that load but cannot mean what they say."""

from __future__ import annotations

import re

import pytest

from attngroup.ci.areas.config import RunConfig, Step, TestAreas
from attngroup.ci.areas.lint import lint_warnings


def _areas(*entries: str) -> TestAreas:
    step = Step(
        key="s",
        label="S",
        group="g",
        file="a.yaml",
        line=3,
        commands=("true",),
        source_file_dependencies=entries,
        depends_on=(),
    )
    return TestAreas((step,), ("a.yaml",))


@pytest.mark.parametrize(
    ("patterns", "entries", "warning"),
    [
        (["setup.py"], [], "'setup.py' has an unescaped '.'"),
        ([r"setup\.py", "csrc/.*"], [], None),
        ([], ["vllm/", "!vllm/distributed/"], None),
        ([], ["vllm/", "!tests/slow/"], "exclusion '!tests/slow/' lies under no included entry"),
    ],
    ids=["bare-dot", "escaped-dot-and-wildcard", "live-exclusion", "dead-exclusion"],
)
def test_lint_warnings(patterns, entries, warning):
    config = RunConfig(
        path="ci_config.yaml",
        job_dirs=("a",),
        run_all_patterns=tuple(re.compile(p) for p in patterns),
    )
    warnings = lint_warnings(config, _areas(*entries))
    if warning is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warning in warnings[0]
