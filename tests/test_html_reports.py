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
import re
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


def _spelled(text: str) -> str:
    """Text reduced to its letters and digits, lower case: a label spells its JSON value if the
    value's letters appear in it ("LoRA" spells "lora", "adapter disabled" "adapter-disabled")."""
    return "".join(ch for ch in text.lower() if ch.isalnum())


def _check_numbers(page: Page, body: Any) -> int:
    """Every element the page ties to a JSON path shows that path's value; returns how many."""
    shown = page.numbers()
    for item in shown:
        path = str(item["path"])
        expected = _at(body, path)
        if item["format"] == "label":  # a readable word for a JSON string ("adapter disabled")
            assert item["value"] == expected, (path, item["value"], expected)
            assert _spelled(expected) in _spelled(str(item["text"])), (path, item["text"], expected)
        elif item["format"] is not None:
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
    # the rule's reason for the plan, as solve --json and explain give it
    assert body["decided_by"] and page.page.locator("#decided-by").inner_text() == f"Why this plan: {body['decided_by']}"


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


# ---- issue 48: the page tells the same story as explain, readably, at every width ------------

WIDTHS = (360, 390, 1280, 1920)
#: GRPO on the DPO example: the sequence is the prompt plus the completion (the loader refuses
#: anything else), so the spec states both.
GRPO = [
    "--set",
    "training.objective=grpo",
    "--set",
    "training.sequence_length=768",
    "--set",
    "training.generation.max_prompt_length=512",
    "--set",
    "training.generation.max_completion_length=256",
]
#: Ulysses SP pinned on the 128k example: its plan then carries the longest field name,
#: seq_parallel_communication_data_type, whose "fp32" once wrapped a letter per line.
PINNED_SP = ["--set", "constraints.sequence_parallel_size=4"]
#: ZeRO++ in full (qwZ, qgZ, hpZ) on ZeRO-3 over four nodes.
ZEROPP = ["--set", "hardware.nodes=4", "--set", "constraints.zero_stage=3", "--set", "constraints.zeropp=full"]
#: Every plan has these; each other plan key is a dimension the page lists only when it is on.
ALWAYS_SHOWN = {"precision", "zero_stage", "micro_batch_size", "gradient_accumulation_steps"}
ALWAYS_SHOWN |= {"data_parallel_size", "global_batch_size"}

#: Everything in the plan grid that does not fit its cell: a cell that scrolls, an element drawn
#: outside its cell, or a label or value broken inside a word (more lines than words).
PLAN_GRID_PROBLEMS = """() => Array.from(document.querySelectorAll('#plan > div')).flatMap(cell => {
  const box = cell.getBoundingClientRect();
  const problems = [];
  if (cell.scrollWidth > cell.clientWidth) { problems.push(cell.textContent + ': scrolls'); }
  for (const el of cell.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.left < box.left - 0.5 || r.right > box.right + 0.5) { problems.push(el.textContent + ': outside its cell'); }
  }
  for (const el of cell.children) {
    const range = document.createRange();
    range.selectNodeContents(el);
    const lines = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.bottom / 4))).size;
    const words = el.textContent.trim().split(/\\s+/).length;
    if (lines > words) { problems.push(el.textContent + ': ' + lines + ' lines for ' + words + ' words'); }
  }
  return problems;
})"""


def _explain(tmp_path: Path, capsys: pytest.CaptureFixture[str], example: str, *args: str) -> tuple[Path, Any]:
    """``explain --html`` on an example (with ``args``), and ``solve --json`` on the same."""
    spec = str(EXAMPLES / example)
    html = tmp_path / f"explain-{len(list(tmp_path.glob('explain-*')))}.html"
    result = run_cli(["explain", spec, *args, "--html", str(html)], capsys)
    assert result.exit_code == 0, result.stderr
    return html, json.loads(run_cli(["solve", spec, *args, "--json"], capsys).stdout)


def _is_on(key: str, value: Any, plan: dict[str, Any]) -> bool:
    """Whether a plan dimension departs from DeepSpeed's default of leaving the feature out."""
    if key == "seq_parallel_communication_data_type":
        return bool(plan["sequence_parallel_size"] > 1)  # DeepSpeed ignores it without Ulysses SP
    if key == "offload_optimizer_ratio":
        return bool(0 < value < 1)  # a partial offload; a whole one is the offload row itself
    if key == "zeropp":
        return bool(value["hpz_partition_size"] > 1 or value["quantized_weights"] or value["quantized_gradients"])
    if key.endswith("_size"):
        return bool(value != 1)
    return value not in (False, None, "none")


def test_pages_fit_every_width(browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """From a phone (360 px) to a wide screen (1,920 px): nothing scrolls sideways but a wide table
    in its own box, and every label and value of the plan grid stays whole inside its cell."""
    pages = [
        _explain(tmp_path, capsys, "llama-3.1-8b-128k-8xh100.yaml", *PINNED_SP),
        _explain(tmp_path, capsys, "qwen3-30b-a3b-8xh100.yaml"),
        _explain(tmp_path, capsys, "llama-3.1-70b-8xa100.yaml", *ZEROPP),
        _explain(tmp_path, capsys, "dpo-llama-3.1-8b-8xh100.yaml", *GRPO),
    ]
    assert pages[0][1]["plan"]["sequence_parallel_size"] == 4  # the pin holds: the long field is shown
    frontier = tmp_path / "frontier.html"
    args = ["frontier", str(EXAMPLES / "llama-3.1-8b-8xh100.yaml"), "--gpus", "1,8,16", "--html", str(frontier)]
    assert run_cli(args, capsys).exit_code == 0
    assert (
        run_cli(["sweep", str(EXAMPLES / "sweep" / "sweep.yaml"), "-o", str(tmp_path / "runs")], capsys).exit_code == 0
    )
    for width in WIDTHS:
        for path in [*(html for html, _ in pages), frontier, tmp_path / "runs" / "report.html"]:
            page = Page(browser, path, width=width)
            assert page.errors == []
            sideways = page.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert sideways <= 0, (path.name, width, sideways)
            if path in [html for html, _ in pages]:
                assert page.page.evaluate(PLAN_GRID_PROBLEMS) == [], (path.name, width)
            page.page.close()


def test_explain_plan_shows_what_the_plan_turns_on_in_words(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for html, body in (
        _explain(tmp_path, capsys, "llama-3.1-8b-128k-8xh100.yaml", *PINNED_SP),
        _explain(tmp_path, capsys, "llama-3.1-70b-8xa100.yaml", *ZEROPP),
        _explain(tmp_path, capsys, "qwen3-30b-a3b-8xh100.yaml"),
    ):
        page = Page(browser, html)
        assert _check_numbers(page, body) >= 30
        grid = page.page.locator("#plan")
        labels = [label.strip() for label in grid.locator(".k").all_inner_texts()]
        assert all("_" not in label for label in labels), labels  # no raw field names
        assert "{" not in grid.inner_text()  # no JSON objects
        plan = body["plan"]
        for key, value in plan.items():
            shown = grid.locator(f'[data-json="plan.{key}"], [data-json^="plan.{key}."]').count() > 0
            expected = key in ALWAYS_SHOWN or _is_on(key, value, plan)
            if key == "zeropp" and expected:  # the flags are words (qwZ, qgZ), only hpZ's size a number
                expected = value["hpz_partition_size"] > 1
                assert "ZeRO++" in labels
            assert shown == expected, (html.name, key, value)
        zeropp = plan["zeropp"]
        if _is_on("zeropp", zeropp, plan):  # ZeRO++'s own names for its three features
            row = grid.locator("div", has=page.page.locator(".k", has_text="ZeRO++")).inner_text()
            assert ("qwZ" in row) == zeropp["quantized_weights"], row
            assert ("qgZ" in row) == zeropp["quantized_gradients"], row
            assert (f"hpZ {zeropp['hpz_partition_size']}" in row) == (zeropp["hpz_partition_size"] > 1), row
        page.page.close()


@pytest.mark.parametrize(
    ("example", "args"),
    [
        ("dpo-llama-3.1-8b-8xh100.yaml", []),
        ("qlora-qwen2.5-7b-rtx4090.yaml", []),
        ("llama-3.1-8b-8xh100.yaml", []),
        ("dpo-llama-3.1-8b-8xh100.yaml", GRPO),
    ],
)
def test_explain_header_names_method_and_objective(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], example: str, args: list[str]
) -> None:
    html, body = _explain(tmp_path, capsys, example, *args)
    page = Page(browser, html)
    _check_numbers(page, body)  # each label below spells its JSON value
    header = page.page.locator("#header")
    for key in ("method", "objective"):
        assert header.locator(f'[data-json="finetuning.{key}"]').count() == 1, key
        assert _spelled(body["finetuning"][key]) in _spelled(header.inner_text()), key


def test_explain_alternatives_include_the_model_parallel_layouts(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    html, body = _explain(tmp_path, capsys, "qwen3-30b-a3b-8xh100.yaml")
    assert body["model_parallel_alternatives"], "the MoE example prices AutoEP layouts"
    page = Page(browser, html)
    _check_numbers(page, body)
    table = page.page.locator("#alternatives")
    lists = ("alternatives", "model_parallel_alternatives", "offload_alternatives")
    for name in lists:
        for index, alt in enumerate(body.get(name) or []):
            row = table.locator("tbody tr", has=page.page.locator(f'[data-json="{name}.{index}.feasible"]'))
            assert row.count() == 1, (name, index)
            if name == "model_parallel_alternatives":
                assert alt["layout"] in row.inner_text()
    listed = sum(len(body.get(name) or []) for name in lists)
    assert table.locator("tbody tr").count() == listed + 1  # and the chosen plan, to compare against


def test_explain_step_legend_lists_every_term_generation_included(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    html, body = _explain(tmp_path, capsys, "dpo-llama-3.1-8b-8xh100.yaml", *GRPO)
    assert body["step_time"]["generation_s"] > 0, "GRPO generates"
    page = Page(browser, html)
    _check_numbers(page, body)
    legend = page.page.locator("#step-legend li[data-term]")
    terms = legend.evaluate_all("items => items.map(i => i.getAttribute('data-term'))")
    assert terms == list(body["step_time"])
    values = page.page.locator("#step-legend [data-json]").evaluate_all(
        "els => els.map(e => [e.getAttribute('data-json'), Number(e.getAttribute('data-value'))])"
    )
    assert [path for path, _ in values] == [f"step_time.{term}" for term in body["step_time"]]
    assert sum(value for _, value in values) == pytest.approx(body["step_time_s"], abs=1e-5)
    # each drawn segment has its legend entry's colour
    swatches = dict(
        legend.evaluate_all(
            "items => items.map(i => [i.getAttribute('data-term'), i.querySelector('.swatch').style.backgroundColor])"
        )
    )
    for term, colour in page.page.locator("#step-chart rect[data-term]").evaluate_all(
        "rs => rs.map(r => [r.getAttribute('data-term'), r.getAttribute('fill')])"
    ):
        assert _rgb(colour) == swatches[term], term
    assert page.page.locator("#step-chart rect[data-term='generation_s']").count() == 1


def _rgb(hex_colour: str) -> str:
    """A ``#rrggbb`` colour as the browser reports a computed style: ``rgb(r, g, b)``."""
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def test_explain_page_states_memory_as_one_percentage(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One figure for GPU memory: the fill of GPU memory, never a share of the usable part."""
    html, body = _explain(tmp_path, capsys, "qwen3-30b-a3b-8xh100.yaml")
    page = Page(browser, html)
    text = page.page.locator("body").inner_text()
    assert not re.search(r"%\s*of\s+usable", text)
    fill = page.page.locator("#gpu-fill")
    assert fill.locator('[data-json="fill"]').count() == 1
    assert f"{_expected_text(body['fill'], 'percent')} of GPU memory" in fill.inner_text()


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_examples_page_shows_the_plans_and_numbers_solve_gives(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], example: str
) -> None:
    """Issue 48: solve, explain and the page tell one story. Every number the page shows equals
    ``solve --json``'s, the chosen plan and each alternative (ZeRO stage, layout, offload) in the
    JSON's order, and the rule's reason."""
    html, body = _explain(tmp_path, capsys, example)
    page = Page(browser, html)
    assert page.errors == []
    assert _check_numbers(page, body) >= 20
    shown = [item["path"] for item in page.numbers()]
    for name in ("alternatives", "model_parallel_alternatives", "offload_alternatives"):
        rows = [path for path in shown if path.startswith(f"{name}.") and path.endswith(".feasible")]
        assert rows == [f"{name}.{index}.feasible" for index in range(len(body[name]))], name
    if body["decided_by"]:
        assert page.page.locator('[data-json="decided_by"]').inner_text() == body["decided_by"]
