"""What the engine's and the benchmarks' command lines share: one positive-integer
validator, and ``generate``'s tqdm progress bar that stays off the logs."""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable

import pytest

from attngroup.benchmarks import bench_spec_decode
from attngroup.reference_engine.cli import generate_cli


def _generate_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    generate_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["generate", "gemma4-e2b-mtp", *argv])


PARSERS: dict[str, Callable[[list[str]], argparse.Namespace]] = {
    "generate": _generate_args,
    "bench_spec_decode": bench_spec_decode.parse_args,
}


@pytest.mark.parametrize("command", PARSERS)
@pytest.mark.parametrize("text", ["0", "-3", "two", "1.5"])
def test_counts_that_are_not_positive_integers_exit_2(
    command: str, text: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as raised:
        PARSERS[command](["--batch", text])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --batch: expected a positive integer, got {text!r}" in err, err


@pytest.mark.parametrize("command", PARSERS)
def test_a_positive_count_is_taken_as_an_int(command: str) -> None:
    assert PARSERS[command](["--batch", "7", "--prompt-len", "1"]).batch == 7


def test_one_validator_serves_both_command_lines() -> None:
    """No second copy: the benchmarks import the engine's validator."""
    assert bench_spec_decode.positive_int is generate_cli.positive_int


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "silent", "drawn"),
    [
        pytest.param(_Terminal(), False, True, id="terminal"),
        pytest.param(_Terminal(), True, False, id="terminal-no-progress"),
        pytest.param(io.StringIO(), False, False, id="not-a-terminal"),
    ],
)
def test_progress_bar_draws_only_on_a_terminal_unless_silenced(
    stream: io.StringIO, silent: bool, drawn: bool
) -> None:
    with generate_cli.progress_bar(8, stream, silent=silent) as bar:
        for done in (3, 8):
            bar.update(done - bar.n)
    text = stream.getvalue()
    assert ("8/8" in text and "\r" in text) if drawn else text == ""


def test_no_progress_is_an_option_of_generate() -> None:
    assert _generate_args(["--no-progress"]).no_progress is True
    assert _generate_args([]).no_progress is False
