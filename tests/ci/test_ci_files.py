"""Files ``ci`` writes: atomic, with the umask's mode, and refused up front when impossible."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from attngroup.ci.atomic_write import write_atomically
from attngroup.ci.deps.fix import add_dependencies
from attngroup.ci.errors import CIInputError
from tests.ci.helpers import RUN_CONFIG, init_repo, run_cli, write_tree

AREA = """\
group: G
steps:
  - label: Unit
    key: unit
    device: cpu
    commands: [python -m pytest tests]
"""


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_file_follows_the_umask(tmp_path, umask_022):
    target = tmp_path / "out.yaml"
    write_atomically(target, "a: 1\n")
    assert target.read_text() == "a: 1\n" and _mode(target) == 0o644
    assert [path.name for path in tmp_path.iterdir()] == ["out.yaml"]


def test_replaced_file_keeps_its_mode(tmp_path, umask_022):
    target = tmp_path / "area.yaml"
    target.write_text("old\n")
    target.chmod(0o664)
    write_atomically(target, "new\n")
    assert target.read_text() == "new\n" and _mode(target) == 0o664


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "area.yaml"
    target.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomically(target, "\udcff unencodable")
    assert target.read_text() == "old\n"
    assert [path.name for path in tmp_path.iterdir()] == ["area.yaml"]


@pytest.fixture
def repo(tmp_path):
    return init_repo(
        tmp_path / "repo",
        {".buildkite/ci_config.yaml": RUN_CONFIG, ".buildkite/test_areas/a.yaml": AREA},
    )


@pytest.mark.parametrize(
    ("relative", "message"),
    [
        ("missing/p.yaml", "cannot write {target}: directory {tmp}/missing does not exist"),
        ("a-file/p.yaml", "cannot write {target}: {tmp}/a-file is not a directory"),
        ("a-dir", "{target} is a directory; give a file name"),
    ],
    ids=["missing-directory", "under-a-file", "onto-a-directory"],
)
def test_pipeline_output_that_cannot_be_written_is_bad_input(repo, tmp_path, relative, message):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    target = tmp_path / relative
    result = run_cli("pipeline", "--repo", str(repo), "--all", "--output", str(target))
    assert result.exit_code == 2
    assert result.stderr == f"error: {message.format(target=target, tmp=tmp_path)}\n"


def test_pipeline_output_follows_the_umask(repo, tmp_path, umask_022):
    target = tmp_path / "pipeline.yaml"
    assert run_cli("pipeline", "--repo", str(repo), "--all", "--output", str(target)).exit_code == 0
    assert _mode(target) == 0o644


FIRST_KEY_COMMANDS = """\
group: G
steps:
  - label: First
    source_file_dependencies:
      - src/
    commands: [pytest a]
  - commands:
      - pytest b
    label: Second
    key: second
"""


def test_fix_adds_the_block_to_the_step_whose_first_key_is_commands(tmp_path, umask_022):
    write_tree(tmp_path, {"area.yaml": FIRST_KEY_COMMANDS})
    (tmp_path / "area.yaml").chmod(0o644)
    assert add_dependencies(tmp_path / "area.yaml", {"second": ["lib/"]}) == ["second: lib/"]
    assert (tmp_path / "area.yaml").read_text() == FIRST_KEY_COMMANDS.replace(
        "    label: Second\n",
        "    source_file_dependencies:\n      - lib/\n    label: Second\n",
    )
    assert _mode(tmp_path / "area.yaml") == 0o644


def test_fix_refuses_a_flow_style_step(tmp_path):
    write_tree(tmp_path, {"area.yaml": "steps:\n  - {label: S, key: s, commands: [x]}\n"})
    with pytest.raises(CIInputError, match=r"area\.yaml:2: cannot add to a flow-style step"):
        add_dependencies(tmp_path / "area.yaml", {"s": ["lib/"]})
