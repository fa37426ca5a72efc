"""scripts/mypy_ratchet.py: a module over its baseline fails by name, fewer errors pass,
``--update`` never grows the baseline, a bad baseline or environment exits 2.

mypy itself is replaced by canned ``mypy -O json`` output (``nox -s lint`` runs the real one)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "mypy_ratchet.py"


def _load_ratchet():
    spec = importlib.util.spec_from_file_location("mypy_ratchet", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


ratchet = _load_ratchet()

KERNEL_MODULE = """import triton
import triton.language as tl


def launch(x: int) -> int:
    return x + "host code is checked"


@triton.jit
def _helper(a, B: tl.constexpr):
    return a * B


@triton.jit(do_not_specialize=["n"])
def _kernel(
    ptr,
    n,
    BLOCK: tl.constexpr,
):
    offsets = tl.arange(0, BLOCK)
    tl.store(ptr + offsets, _helper(offsets, BLOCK))
"""


def _error(path: str, line: int, message: str = "Incompatible types", code: str = "arg-type"):
    return {
        "file": path,
        "line": line,
        "column": 0,
        "message": message,
        "hint": None,
        "code": code,
        "severity": "error",
    }


def _mypy_output(*records: dict) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A scratch repository with two plain modules and one holding Triton kernels."""
    package = tmp_path / "pkg"
    package.mkdir()
    for name in ("alpha", "beta"):
        (package / f"{name}.py").write_text("\n" * 40)
    (package / "kernels.py").write_text(KERNEL_MODULE)
    monkeypatch.setattr(ratchet, "REPO", tmp_path)
    return tmp_path


def _baseline(repo: Path, counts: dict) -> Path:
    path = repo / "baseline.json"
    path.write_text(json.dumps(counts))
    return path


def _run(baseline: Path, output: str, *flags: str) -> int:
    return ratchet.main(["--baseline", str(baseline), *flags], mypy=lambda: output)


ALPHA_TWICE = _mypy_output(
    _error("pkg/alpha.py", 3, 'Argument 1 to "f" has incompatible type "str"'),
    _error("pkg/alpha.py", 9, '"object" has no attribute "pair"', "attr-defined"),
)


def test_a_module_over_its_count_fails_naming_the_module_and_its_errors(repo, capsys):
    baseline = _baseline(repo, {"pkg/alpha.py": 1})
    assert _run(baseline, ALPHA_TWICE) == 1
    out = capsys.readouterr().out
    assert "pkg/alpha.py: 2 mypy errors, the baseline allows 1 (+1)" in out
    assert 'pkg/alpha.py:3: error: Argument 1 to "f" has incompatible type "str"  [arg-type]' in out
    assert 'pkg/alpha.py:9: error: "object" has no attribute "pair"  [attr-defined]' in out
    assert "failed: 1 modules over their baseline" in out


def test_a_module_the_baseline_does_not_name_is_allowed_no_errors(repo, capsys):
    baseline = _baseline(repo, {"pkg/alpha.py": 2})
    output = ALPHA_TWICE + _mypy_output(_error("pkg/beta.py", 5))
    assert _run(baseline, output) == 1
    out = capsys.readouterr().out
    assert "pkg/beta.py: 1 mypy errors, the baseline allows 0 (+1)" in out
    assert "pkg/alpha.py: 2 mypy errors" not in out


def test_fewer_errors_pass_and_say_the_baseline_can_shrink(repo, capsys):
    baseline = _baseline(repo, {"pkg/alpha.py": 4, "pkg/beta.py": 1})
    before = baseline.read_text()
    assert _run(baseline, ALPHA_TWICE) == 0
    out = capsys.readouterr().out
    assert "shrink it with --update" in out
    assert "pkg/alpha.py: 4 -> 2" in out
    assert "pkg/beta.py: 1 -> 0" in out
    assert "mypy within the baseline: 2 mypy errors in 1 modules" in out
    assert baseline.read_text() == before, "a check never rewrites the baseline"


def test_equal_counts_pass_without_a_shrink_note(repo, capsys):
    baseline = _baseline(repo, {"pkg/alpha.py": 2})
    assert _run(baseline, ALPHA_TWICE) == 0
    assert "shrink" not in capsys.readouterr().out


def test_update_shrinks_the_baseline_and_drops_clean_modules(repo):
    baseline = _baseline(repo, {"pkg/alpha.py": 4, "pkg/beta.py": 1})
    assert _run(baseline, ALPHA_TWICE, "--update") == 0
    assert json.loads(baseline.read_text()) == {"pkg/alpha.py": 2}
    assert _run(baseline, ALPHA_TWICE) == 0


def test_update_refuses_to_grow_the_baseline(repo, capsys):
    baseline = _baseline(repo, {"pkg/alpha.py": 1, "pkg/beta.py": 3})
    before = baseline.read_text()
    assert _run(baseline, ALPHA_TWICE, "--update") == 1
    out = capsys.readouterr().out
    assert "refused: the baseline never grows" in out
    assert "pkg/alpha.py: 2 mypy errors, the baseline allows 1 (+1)" in out
    assert baseline.read_text() == before, "a refused update leaves the baseline as it was"


def test_update_with_allow_growth_records_grown_counts(repo):
    baseline = _baseline(repo, {"pkg/alpha.py": 1, "pkg/beta.py": 3})
    assert _run(baseline, ALPHA_TWICE, "--update", "--allow-growth") == 0
    assert json.loads(baseline.read_text()) == {"pkg/alpha.py": 2}


def test_update_writes_a_first_baseline(repo):
    baseline = repo / "new-baseline.json"
    assert _run(baseline, ALPHA_TWICE, "--update") == 0
    assert json.loads(baseline.read_text()) == {"pkg/alpha.py": 2}
    assert [path.name for path in repo.iterdir() if path.name.startswith(".")] == []


def test_allow_growth_without_update_is_a_usage_error(repo, capsys):
    baseline = _baseline(repo, {"pkg/alpha.py": 2})
    with pytest.raises(SystemExit) as exit_info:
        _run(baseline, ALPHA_TWICE, "--allow-growth")
    assert exit_info.value.code == 2
    assert "--allow-growth only goes with --update" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"pkg/alpha.py": 2', "not a readable JSON file"),
        ('["pkg/alpha.py"]', "expected an object of module path -> error count"),
        ('{"pkg/alpha.py": -1}', "'pkg/alpha.py' has count -1"),
        ('{"pkg/alpha.py": "2"}', "'pkg/alpha.py' has count '2'"),
        ('{"pkg/alpha.py": 2.5}', "'pkg/alpha.py' has count 2.5"),
        ('{"pkg/alpha.py": true}', "'pkg/alpha.py' has count True"),
    ],
    ids=["truncated-json", "not-an-object", "negative", "string", "fraction", "boolean"],
)
@pytest.mark.parametrize("flags", [(), ("--update",)], ids=["check", "update"])
def test_a_corrupt_baseline_is_a_clear_error_with_exit_2(repo, capsys, text, problem, flags):
    baseline = repo / "baseline.json"
    baseline.write_text(text)
    assert _run(baseline, ALPHA_TWICE, *flags) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {baseline}: ")
    assert problem in captured.err
    assert "Traceback" not in captured.err
    assert baseline.read_text() == text, "a corrupt baseline is never overwritten"


def test_a_missing_baseline_says_how_to_write_one(repo, capsys):
    assert _run(repo / "absent.json", ALPHA_TWICE) == 2
    assert "no baseline (write one with --update)" in capsys.readouterr().err


def test_mypy_output_that_is_not_json_is_exit_2(repo, capsys):
    baseline = _baseline(repo, {"pkg/alpha.py": 2})
    assert _run(baseline, "pkg/alpha.py:3: error: plain text output\n") == 2
    assert "mypy's output line 1 is not a mypy JSON record" in capsys.readouterr().err


def test_notes_are_not_counted(repo):
    note = _error("pkg/alpha.py", 4, "By default the bodies of untyped functions are not checked")
    note["severity"] = "note"
    baseline = _baseline(repo, {"pkg/alpha.py": 2})
    assert _run(baseline, ALPHA_TWICE + _mypy_output(note)) == 0


def test_triton_kernel_bodies_are_left_out_and_host_code_is_counted(repo, capsys):
    lines = KERNEL_MODULE.splitlines()
    host_line = next(n for n, text in enumerate(lines, 1) if "host code" in text)
    kernel_lines = [
        n for n, text in enumerate(lines, 1) if "tl.store" in text or "return a * B" in text
    ]
    decorator_line = next(n for n, text in enumerate(lines, 1) if "do_not_specialize" in text)
    output = _mypy_output(
        _error("pkg/kernels.py", host_line, 'Unsupported operand types for + ("int" and "str")'),
        *(_error("pkg/kernels.py", n, "Kernel-language noise") for n in kernel_lines),
        _error("pkg/kernels.py", decorator_line, "Kernel-language noise"),
    )
    baseline = _baseline(repo, {})
    assert _run(baseline, output) == 1
    out = capsys.readouterr().out
    assert "pkg/kernels.py: 1 mypy errors, the baseline allows 0 (+1)" in out
    assert f"pkg/kernels.py:{host_line}: error: Unsupported operand" in out
    assert "Kernel-language noise" not in out


def test_triton_kernel_lines_span_decorator_to_last_body_line():
    lines = ratchet.triton_kernel_lines(KERNEL_MODULE)
    text = KERNEL_MODULE.splitlines()
    assert {text[n - 1].strip() for n in lines} >= {
        "@triton.jit",
        '@triton.jit(do_not_specialize=["n"])',
        "return a * B",
        "tl.store(ptr + offsets, _helper(offsets, BLOCK))",
    }
    assert not any("def launch" in text[n - 1] or "host code" in text[n - 1] for n in lines)


@pytest.mark.parametrize(
    ("installed", "problem"),
    [("2.3.0", "mypy 2.3.0 runs here, the lock pins 2.4.1"), (None, "mypy is not installed")],
    ids=["other-version", "missing"],
)
def test_another_mypy_version_is_refused(installed, problem):
    with pytest.raises(ratchet.RatchetError, match=problem):
        ratchet.check_mypy_version(installed, "2.4.1")


def test_the_committed_baseline_is_well_formed_and_sorted():
    counts = ratchet.load_baseline(ratchet.BASELINE)
    assert list(counts) == sorted(counts)
    assert all(count >= 1 for count in counts.values()), "clean modules are dropped"
    assert all((REPO / module).is_file() for module in counts), "a module the tree lacks"


def test_ci_runs_the_ratchet_in_the_lint_session():
    noxfile = (REPO / "noxfile.py").read_text()
    lint = noxfile[noxfile.index("def lint(") :].split("\n@nox.session", 1)[0]
    assert 'session.run("python", "scripts/mypy_ratchet.py")' in lint
    assert "nox -s lint" in (REPO / ".ci" / "run").read_text()
