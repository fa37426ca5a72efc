"""The report rendered by headless Chromium: scripts run, nothing injected, fits a laptop,
and the model pair x check matrix reads well (one row per pair, every test on click).

CI installs the browser (``apt-get update && apt-get install -y chromium``) and sets
CI=true, so there a missing browser fails; elsewhere the test skips with that reason.
``docs/report-matrix.png`` is such a screenshot of the matrix (see the closing note of
the change that added it for the records it was built from).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from attngroup.reports.cli import main
from attngroup.reports.record import write_record
from tests.reports.records import (
    HOSTILE_SELECTION,
    MATRIX_PAIRS,
    SKIPPED_KERNEL_TESTS,
    hostile_history,
    matrix_run,
)

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LAPTOP_WIDTH, LAPTOP_HEIGHT = 1366, 768
BROWSER_TIMEOUT_S = 120
# Test-only instrumentation appended to a copy of the report: what the page looks like
# after its own script ran, and whether the test table filter works.
PROBE = """<script>
(function () {
  var rows = Array.from(document.querySelectorAll("#all-tests tbody tr"));
  var search = document.getElementById("test-filter");
  search.value = "test_decode";
  search.dispatchEvent(new Event("input"));
  document.body.setAttribute("data-probe", JSON.stringify({
    ready: document.documentElement.getAttribute("data-report-ready"),
    injected: typeof window.injected,
    overflow: document.documentElement.scrollWidth - window.innerWidth,
    rows: rows.length,
    visible_after_filter: rows.filter(function (row) { return !row.hidden; }).length,
    title: document.querySelector("h1").textContent
  }));
})();
</script>
</body>"""


# Shows the matrix alone in a screenshot: the page's other sections are hidden.
MATRIX_ONLY = "<style>main > section:not(#matrix), .toc { display: none; }</style></head>"
# Opens a skipped-only cell, then a failed one, and reports what the page shows.
MATRIX_PROBE = """<script>
(function () {
  var table = document.getElementById("matrix-table");
  var skipped = table.querySelector('td[data-status="skipped"] details');
  var failed = table.querySelector('td[data-status="failed"] details');
  var kernels = Array.from(table.querySelectorAll("td details")).filter(function (cell) {
    return cell.querySelectorAll("li").length > 25;
  })[0];
  var result = {
    pairs: Array.from(table.querySelectorAll("tbody th.pair")).map(function (th) {
      return th.textContent;
    }),
    overflow: document.documentElement.scrollWidth - window.innerWidth,
    skipped_summary: skipped.querySelector(".cell-total").textContent.trim()
  };
  kernels.querySelector("summary").click();
  var panel = kernels.querySelector(".cell-tests");
  var box = panel.getBoundingClientRect();
  result.listed = panel.querySelectorAll("li").length;
  result.panel_on_screen = box.top >= 0 && box.bottom <= window.innerHeight && box.width > 0;
  failed.querySelector("summary").click();
  result.open_cells = table.querySelectorAll("details[open]").length;
  result.failed_open = failed.open;
  document.body.setAttribute("data-matrix-probe", JSON.stringify(result));
})();
</script>
</body>"""


@pytest.fixture(scope="module")
def chromium() -> str:
    found = next((path for path in map(shutil.which, BROWSERS) if path), None)
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(
                "CI=true but Chromium is missing: run `apt-get update && apt-get install -y chromium`"
            )
        pytest.skip("Chromium is not installed (apt-get install -y chromium); CI runs this test")
    return found


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """A report built by the CLI from a run with a planted regression and hostile strings."""
    folder = tmp_path_factory.mktemp("render")
    baseline, current = hostile_history()
    write_record(baseline, folder / "baseline.json")
    write_record(current, folder / "run.json")
    (folder / "selection.json").write_text(json.dumps(HOSTILE_SELECTION))
    assert (
        main(
            [
                "build",
                "--run",
                str(folder / "run.json"),
                "--baseline",
                str(folder / "baseline.json"),
                "--selection",
                str(folder / "selection.json"),
                "-o",
                str(folder / "report.html"),
            ]
        )
        == 0
    )
    probed = folder / "probed.html"
    probed.write_text((folder / "report.html").read_text().replace("</body>", PROBE))
    return probed


def run_browser(chromium: str, profile: Path, *arguments: str) -> subprocess.CompletedProcess:
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={LAPTOP_WIDTH},{LAPTOP_HEIGHT}",
        *arguments,
    ]
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=False
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed


@pytest.fixture(scope="module")
def rendered_dom(chromium, report, tmp_path_factory) -> str:
    profile = tmp_path_factory.mktemp("profile")
    return run_browser(chromium, profile, "--dump-dom", report.as_uri()).stdout


@pytest.fixture(scope="module")
def probe(rendered_dom) -> dict:
    match = re.search(r'data-probe="([^"]*)"', rendered_dom)
    assert match, "the probe script did not run"
    return json.loads(html.unescape(match.group(1)))


def test_report_script_ran(probe):
    assert probe["ready"] == "1"
    assert probe["title"] == "Regressions"


def test_no_test_string_was_executed(probe, rendered_dom):
    assert probe["injected"] == "undefined"
    assert "test_groups[&lt;script&gt;window.injected=1&lt;/script&gt;" in rendered_dom
    assert "&lt;img src=x onerror=" in rendered_dom


def test_fits_a_laptop_screen_without_sideways_scrolling(probe):
    assert probe["overflow"] <= 0


def test_test_table_filter_works(probe):
    assert probe["rows"] == 2
    assert probe["visible_after_filter"] == 1


def test_screenshot_at_laptop_size(chromium, report, tmp_path):
    screenshot = tmp_path / "report.png"
    run_browser(chromium, tmp_path / "profile", f"--screenshot={screenshot}", report.as_uri())
    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (LAPTOP_WIDTH, LAPTOP_HEIGHT)
    assert len(data) > 20_000  # a rendered page, not a blank canvas


@pytest.fixture(scope="module")
def matrix_report(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("matrix")
    write_record(matrix_run(), folder / "run.json")
    assert (
        main(["build", "--run", str(folder / "run.json"), "-o", str(folder / "report.html")]) == 0
    )
    return folder / "report.html"


@pytest.fixture(scope="module")
def matrix_probe(chromium, matrix_report, tmp_path_factory) -> dict:
    probed = matrix_report.with_name("probed.html")
    probed.write_text(matrix_report.read_text().replace("</body>", MATRIX_PROBE))
    profile = tmp_path_factory.mktemp("matrix-profile")
    dom = run_browser(chromium, profile, "--dump-dom", probed.as_uri()).stdout
    match = re.search(r'data-matrix-probe="([^"]*)"', dom)
    assert match, "the matrix probe did not run"
    return json.loads(html.unescape(match.group(1)))


def test_matrix_has_one_row_per_pair(matrix_probe):
    assert matrix_probe["pairs"] == [*sorted(MATRIX_PAIRS), "no model pair"]
    assert matrix_probe["overflow"] <= 0


def test_skipped_only_cell_says_skipped(matrix_probe):
    assert matrix_probe["skipped_summary"] == "2 skip"


def test_cell_click_lists_every_test_on_screen(matrix_probe):
    assert matrix_probe["listed"] == SKIPPED_KERNEL_TESTS + 3  # FlashInfer and step tests
    assert matrix_probe["panel_on_screen"]


def test_one_cell_list_open_at_a_time(matrix_probe):
    assert matrix_probe["open_cells"] == 1
    assert matrix_probe["failed_open"]


def test_matrix_screenshot(chromium, matrix_report, tmp_path):
    page = tmp_path / "matrix.html"
    page.write_text(matrix_report.read_text().replace("</head>", MATRIX_ONLY, 1))
    screenshot = tmp_path / "matrix.png"
    run_browser(chromium, tmp_path / "profile", f"--screenshot={screenshot}", page.as_uri())
    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (LAPTOP_WIDTH, LAPTOP_HEIGHT)
    assert len(data) > 20_000  # a rendered table, not a blank page
