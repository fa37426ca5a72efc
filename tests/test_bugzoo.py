"""The bug zoo's runner on a tiny repository: a caught patch passes, an uncaught one fails
the zoo, and so do a patch that does not apply and a baseline that fails.

(The zoo itself is ``nox -s bugzoo``; it takes minutes, so it is not part of the tests.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from attngroup.bugzoo.__main__ import REPOSITORY, ZOO, main
from attngroup.bugzoo.zoo import ZooError, git_apply, load_entries, markdown_table, run_zoo
from tests.json_schemas import assert_file_matches_schema

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS_PAGE = REPO_ROOT / "docs" / "bugzoo.md"
TABLE_START = "<!-- generated: python -m attngroup.bugzoo --table -->"
TABLE_END = "<!-- end of the generated table -->"
SOURCE = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def make_patch(repo: Path, name: str, edited_source: str) -> str:
    """A diff of calc.py against HEAD, as the zoo stores it; the file is restored."""
    (repo / "calc.py").write_text(edited_source)
    diff = git(repo, "diff", "--", "calc.py")
    git(repo, "checkout", "--", "calc.py")
    (repo / "zoo" / "patches" / f"{name}.diff").write_text(diff)
    return f"patches/{name}.diff"


def entry(name: str, patch: str) -> dict:
    return {
        "id": name,
        "kind": "mutation",
        "bug": f"{name} planted",
        "source": "this test",
        "affected": "the tiny repository",
        "patch": patch,
        "tests": ["test_calc.py::test_add"],
    }


def make_repo(root: Path) -> Path:
    """A tiny repository: calc.py, its test, and an empty zoo."""
    (root / "calc.py").write_text(SOURCE)
    (root / "test_calc.py").write_text(TEST)
    (root / "zoo" / "patches").mkdir(parents=True)
    git(root, "init", "-q")
    git(root, "add", "calc.py", "test_calc.py")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny")
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


def write_entries(repo: Path, entries: list[dict]) -> Path:
    zoo = repo / "zoo"
    (zoo / "entries.yaml").write_text(yaml.safe_dump({"entries": entries}))
    return zoo


def test_caught_and_uncaught_patches(repo: Path) -> None:
    caught = make_patch(repo, "subtracts", SOURCE.replace("a + b", "a - b"))
    uncaught = make_patch(repo, "comment", SOURCE + "# harmless\n")
    zoo = write_entries(repo, [entry("subtracts", caught), entry("comment", uncaught)])
    outcomes, baseline = run_zoo(repo, zoo, workers=0, budget=60, log=lambda _: None)
    assert baseline.caught and baseline.verdict == "passes"
    assert [(o.id, o.caught) for o in outcomes] == [("subtracts", True), ("comment", False)]
    assert outcomes[1].verdict.startswith("NOT CAUGHT")
    assert (repo / "calc.py").read_text() == SOURCE, "the runner touched the repository"


def test_an_uncaught_patch_fails_the_zoo(repo: Path, capsys: pytest.CaptureFixture) -> None:
    uncaught = make_patch(repo, "comment", SOURCE + "# harmless\n")
    zoo = write_entries(repo, [entry("comment", uncaught)])
    results = repo / "out" / "zoo.json"
    assert main(["--root", str(repo), "--zoo", str(zoo), "-n", "0", "--json", str(results)]) == 1
    assert "FAILED comment: NOT CAUGHT" in capsys.readouterr().err
    assert_file_matches_schema(results, "bugzoo-results")
    document = json.loads(results.read_text())
    assert document["baseline"]["caught"] and not document["entries"][0]["caught"]


def test_a_caught_patch_passes_the_zoo(repo: Path) -> None:
    caught = make_patch(repo, "subtracts", SOURCE.replace("a + b", "a - b"))
    zoo = write_entries(repo, [entry("subtracts", caught)])
    assert main(["--root", str(repo), "--zoo", str(zoo), "-n", "0"]) == 0


def test_a_patch_that_does_not_apply_fails(repo: Path) -> None:
    patch = make_patch(repo, "stale", SOURCE.replace("a + b", "a - b"))
    (repo / "calc.py").write_text("def add(a, b):\n    return b + a\n")  # the code moved on
    zoo = write_entries(repo, [entry("stale", patch)])
    outcomes, _ = run_zoo(repo, zoo, workers=0, budget=60, log=lambda _: None)
    assert not outcomes[0].caught
    assert outcomes[0].verdict.startswith("the patch does not apply")


def test_a_failing_baseline_fails_the_zoo(repo: Path, capsys: pytest.CaptureFixture) -> None:
    patch = make_patch(repo, "subtracts", SOURCE.replace("a + b", "a - b"))
    (repo / "test_calc.py").write_text(TEST.replace("== 5", "== 6"))
    zoo = write_entries(repo, [entry("subtracts", patch)])
    assert main(["--root", str(repo), "--zoo", str(zoo), "-n", "0"]) == 1
    assert "FAILED baseline: FAILS unpatched" in capsys.readouterr().err


def test_a_named_test_skipped_unpatched_fails_the_zoo(
    repo: Path, capsys: pytest.CaptureFixture
) -> None:
    """A skipped test passes pytest but can catch nothing: the baseline fails."""
    patch = make_patch(repo, "subtracts", SOURCE.replace("a + b", "a - b"))
    skipping = "import pytest\n\n\n@pytest.mark.skip(reason='off')\n" + TEST.split("\n\n\n")[1]
    (repo / "test_calc.py").write_text(TEST.split("\n\n\n")[0] + "\n\n\n" + skipping)
    zoo = write_entries(repo, [entry("subtracts", patch)])
    assert main(["--root", str(repo), "--zoo", str(zoo), "-n", "0"]) == 1
    assert "FAILED baseline: FAILS unpatched: 1 named tests skipped" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "guess"}, "kind must be one of"),
        ({"patch": "patches/missing.diff"}, "no patch file patches/missing.diff"),
        ({"tests": "test_calc.py"}, "tests must be a list"),
        ({"bug": ""}, "missing ['bug']"),
    ],
    ids=["kind", "patch", "tests", "missing-field"],
)
def test_bad_entries_name_the_problem(repo: Path, change: dict, message: str) -> None:
    patch = make_patch(repo, "subtracts", SOURCE.replace("a + b", "a - b"))
    zoo = write_entries(repo, [{**entry("subtracts", patch), **change}])
    with pytest.raises(ZooError, match="entry 1") as raised:
        load_entries(zoo / "entries.yaml")
    assert message in str(raised.value)
    assert main(["--root", str(repo), "--zoo", str(zoo)]) == 2


def test_table_lists_the_entries_without_running_them(
    repo: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--table`` prints every entry and runs nothing: an uncaught patch and a failing
    baseline do not change its exit status or output."""
    uncaught = make_patch(repo, "comment", SOURCE + "# harmless\n")
    (repo / "test_calc.py").write_text(TEST.replace("== 5", "== 6"))
    zoo = write_entries(
        repo, [entry("comment", uncaught), {**entry("b", uncaught), "kind": "historical"}]
    )
    assert main(["--root", str(repo), "--zoo", str(zoo), "--table"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 entries: 1 historical, 1 mutations.")
    assert (
        "| `comment`: comment planted | this test | the tiny repository | `test_calc.py::test_add` |"
        in out
    )
    assert "baseline" not in out and " of 2 caught" not in out
    assert not (repo / "out").exists()


def test_docs_table_is_the_generated_one() -> None:
    """docs/bugzoo.md's table is ``python -m attngroup.bugzoo --table``'s output, verbatim."""
    page = DOCS_PAGE.read_text(encoding="utf-8")
    assert page.count(TABLE_START) == 1 and page.count(TABLE_END) == 1
    documented = page.split(TABLE_START)[1].split(TABLE_END)[0].strip()
    generated = markdown_table(load_entries(REPO_ROOT / "attngroup" / "bugzoo" / "entries.yaml"))
    assert documented == generated, (
        "docs/bugzoo.md is stale: paste `python -m attngroup.bugzoo --table` between its markers"
    )


def test_default_root_is_the_repository_the_patches_are_against() -> None:
    """The patches name paths from the repository root (attngroup/..., schemas/...), so
    the default tree to copy is that root, where pyproject.toml is."""
    assert (REPOSITORY / "pyproject.toml").is_file()
    for entry_ in load_entries(ZOO / "entries.yaml"):
        patch = (ZOO / entry_.patch).read_text(encoding="utf-8")
        for line in patch.splitlines():
            if line.startswith("+++ b/"):
                assert (REPOSITORY / line.removeprefix("+++ b/")).is_file(), (entry_.id, line)


@pytest.mark.parametrize("entry_", load_entries(ZOO / "entries.yaml"), ids=lambda e: e.id)
def test_every_patch_applies_to_this_tree(entry_) -> None:
    """A change that rewrites the lines a patch plants its bug in breaks that entry; the zoo
    itself takes minutes and runs outside the tests, so the test run catches it here."""
    message = git_apply(REPOSITORY, ZOO / entry_.patch, check=True)
    assert message is None, (
        f"{entry_.patch} no longer applies: plant the bug again in today's code and store "
        f"`git diff` as the patch ({message})"
    )
