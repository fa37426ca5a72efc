"""``--shard INDEX/COUNT``: disjoint slices that together run every test once."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
NUM_TESTS = 40


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(REPO_CONFTEST.read_text())
    pytester.makepyfile(
        test_many=f"""
        import pytest

        @pytest.mark.parametrize("case", range({NUM_TESTS}))
        def test_case(case):
            assert case >= 0
        """
    )
    return pytester


def _passed_ids(run: pytest.HookRecorder) -> set[str]:
    return {
        report.nodeid
        for report in run.getreports("pytest_runtest_logreport")
        if report.when == "call" and report.passed
    }


@pytest.mark.parametrize("count", [1, 2, 3], ids=["one-shard", "two-shards", "three-shards"])
def test_shards_partition_the_tests(suite: pytest.Pytester, count: int) -> None:
    runs = [suite.inline_run(f"--shard={index}/{count}") for index in range(count)]
    passed = [_passed_ids(run) for run in runs]
    assert sum(len(ids) for ids in passed) == NUM_TESTS
    assert len(set().union(*passed)) == NUM_TESTS
    deselected = [len(run.getcalls("pytest_deselected")) for run in runs]
    assert all(calls == (1 if count > 1 else 0) for calls in deselected)


@pytest.mark.parametrize(
    "value",
    ["2/2", "1", "a/2", "0/0", "-1/2"],
    ids=["index-too-large", "no-count", "not-a-number", "zero-shards", "negative"],
)
def test_bad_shard_is_a_usage_error(suite: pytest.Pytester, value: str) -> None:
    result = suite.runpytest(f"--shard={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--shard {value!r}*"])
