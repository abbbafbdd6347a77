"""The three HTML reports rendered in a real browser (Debian's Chromium, headless, driven by
Playwright): no console errors, the sweep table sorts, and every number the page shows equals the
command's own JSON (``solve --json``, ``frontier --json``, the sweep's ``manifest.jsonl``), read back
from the page's DOM and printed text.

The expected text of each number is written here from the JSON value, independently of dsgen's
formatter: GiB to one decimal (TiB to two from 1 TiB), percentages to whole numbers, seconds to
two decimals, counts with thousands separators.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli
from conftest import REPO_ROOT, _missing, require_module

EXAMPLES = REPO_ROOT / "examples"
GIB = 1 << 30

pytestmark = pytest.mark.browser


def _expected_text(value: float, kind: str) -> str:
    if kind == "gib":
        return f"{value / (1024 * GIB):.2f} TiB" if value >= 1024 * GIB else f"{value / GIB:.1f} GiB"
    if kind == "percent":
        return f"{round(value * 100):.0f}%"
    if kind == "seconds":
        return f"{value:.2f} s"
    assert kind == "number", kind
    return f"{value:,.0f}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = require_module("playwright.sync_api")
    executable = shutil.which("chromium")
    if executable is None:
        _missing("Debian's chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield launched
        launched.close()


class Page:
    """A report opened in the browser, with every console error and uncaught exception it raised."""

    def __init__(self, browser: Any, path: Path, width: int = 1000) -> None:
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.goto(path.as_uri())

    def numbers(self) -> list[dict[str, str | None]]:
        return list(
            self.page.eval_on_selector_all(
                "[data-json]",
                """els => els.map(e => ({path: e.getAttribute('data-json'), value: e.getAttribute('data-value'),
                    format: e.getAttribute('data-format'), text: e.textContent.trim()}))""",
            )
        )


def _at(body: Any, path: str) -> Any:
    for part in path.split("."):
        body = body[int(part)] if isinstance(body, list) else body[part]
    return body


def _check_numbers(page: Page, body: Any) -> int:
    """Every element the page ties to a JSON path shows that path's value; returns how many."""
    shown = page.numbers()
    for item in shown:
        path = str(item["path"])
        expected = _at(body, path)
        if item["format"] is not None:
            assert item["value"] is not None and float(item["value"]) == pytest.approx(expected, rel=1e-12), path
            assert item["text"] == _expected_text(expected, str(item["format"])), (path, item["text"], expected)
        elif expected is None:
            assert item["text"] == "", (path, item["text"])
        elif isinstance(expected, bool):
            assert item["text"] in (json.dumps(expected), "yes" if expected else "no"), (path, item["text"])
        elif isinstance(expected, str):
            assert item["text"] == expected, (path, item["text"])
        else:
            assert json.loads(str(item["text"])) == expected, (path, item["text"])
    return len(shown)


def test_explain_page_shows_solves_numbers_with_no_errors(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = str(EXAMPLES / "dpo-llama-3.1-8b-8xh100.yaml")
    html = tmp_path / "report.html"
    explained = run_cli(["explain", spec, "--target", "hf-trainer", "--html", str(html)], capsys)
    assert explained.exit_code == 0, explained.stderr
    body = json.loads(run_cli(["solve", spec, "--target", "hf-trainer", "--json"], capsys).stdout)
    page = Page(browser, html)
    assert page.errors == []
    assert _check_numbers(page, body) >= 40
    assert page.page.title().startswith("dsgen explain: llama-3.1-8b")
    # one stacked bar per phase, the capacity and safe-line marks, every phase's terms in the table
    assert page.page.locator("svg").first.locator("rect").count() >= 8
    assert page.page.locator("#verdict strong").inner_text().lower() == body["verdict"]


def test_explain_page_escapes_what_the_spec_says(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "<img src=x onerror=document.title='pwned'>"
    html = tmp_path / "report.html"
    spec = str(EXAMPLES / "llama-3.1-8b-8xh100.yaml")
    assert run_cli(["explain", spec, "--set", f'model.name="{name}"', "--html", str(html)], capsys).exit_code == 0
    page = Page(browser, html)
    assert page.errors == []
    assert page.page.locator("img").count() == 0
    assert name in page.page.locator("h1").inner_text()
    assert page.page.title().startswith(f"dsgen explain: {name} on ")  # shown as text, never run


def test_sweep_page_sorts_and_shows_the_manifest(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    assert run_cli(["sweep", str(EXAMPLES / "sweep" / "sweep.yaml"), "-o", str(out)], capsys).exit_code == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    page = Page(browser, out / "report.html")
    assert page.errors == []
    assert _check_numbers(page, rows) >= 5 * len(rows)
    table = page.page.locator("#runs")
    header = table.locator("thead th", has_text="GPU memory")
    column = [h.strip() for h in table.locator("thead th").all_inner_texts()].index("GPU memory")

    def memory_column() -> list[float]:
        cells = table.locator(f"tbody tr td:nth-child({column + 1})")
        return [float(v) for v in cells.evaluate_all("cs => cs.map(c => c.getAttribute('data-sort'))") if v]

    header.click()
    ascending = memory_column()
    assert ascending == sorted(ascending) and len(ascending) == len(rows)
    assert header.get_attribute("aria-sort") == "ascending"
    header.click()
    assert memory_column() == sorted(ascending, reverse=True)
    names = table.locator("thead th", has_text="run").first
    names.click()
    shown = table.locator("tbody tr td:first-child").all_inner_texts()
    assert shown == sorted(row["name"] for row in rows)


def test_frontier_page_shows_each_points_plan(browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(EXAMPLES / "llama-3.1-8b-8xh100.yaml")
    html = tmp_path / "frontier.html"
    args = ["frontier", spec, "--gpus", "1,8,16"]
    assert run_cli([*args, "--html", str(html)], capsys).exit_code == 0
    body = json.loads(run_cli([*args, "--json"], capsys).stdout)
    page = Page(browser, html)
    assert page.errors == []
    assert _check_numbers(page, body) >= 3 * len(body["points"])
    assert page.page.locator("#points tbody tr").count() == len(body["points"])


def test_pages_fit_a_phone(browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At a phone's width the page does not scroll sideways; wide tables scroll inside their box."""
    html = tmp_path / "report.html"
    assert run_cli(["explain", str(EXAMPLES / "llama-3.1-8b-8xh100.yaml"), "--html", str(html)], capsys).exit_code == 0
    page = Page(browser, html, width=390)
    overflow = page.page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0


def test_a_bad_html_destination_is_bad_input_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = str(EXAMPLES / "llama-3.1-8b-8xh100.yaml")
    result = run_cli(["explain", spec, "--html", str(tmp_path)], capsys)  # a directory
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    result = run_cli(
        ["explain", spec, "--set", "training.sequence_length=-1", "--html", str(tmp_path / "x.html")], capsys
    )
    assert result.exit_code == 2 and not (tmp_path / "x.html").exists()
