"""A 1,000-run sweep's report.html: its size, and how long Debian's Chromium takes to open it.

The issue's bar: under 5 MB, and open in under 2 s. The page is a function of the sweep's manifest
rows (``dsgen.reporting.html.sweep_page``), so the 8 runs of ``examples/sweep/sweep.yaml`` are solved for real
and their rows repeated, with their own names and varied values, to 1,000. The page is then opened
headless through Playwright (``tests/test_html_reports.py`` uses the same browser) and the time to
the load event, and until the table is sorted by a click, is printed (median of 5 opens).

Run: python bench/html_report_scale.py [RUNS]   (needs Debian's chromium and playwright)
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dsgen.api import run_sweep_to  # noqa: E402
from dsgen.reporting.html.sweep_page import sweep_page  # noqa: E402


def main(runs: int = 1000) -> None:
    solved = run_sweep_to(REPO / "examples" / "sweep" / "sweep.yaml", None)
    rows = []
    for index in range(runs):
        row = dict(solved.rows[index % len(solved.rows)])
        row["name"] = f"{row['name']}-{index:04d}"
        row["vars"] = {**row["vars"], "index": index}
        rows.append(row)
    varied = (*solved.sweep.varied_keys, "index")
    started = time.perf_counter()
    page = sweep_page(rows, varied, "sweep.yaml")
    render_s = time.perf_counter() - started
    path = Path(tempfile.mkdtemp(prefix="dsgen_report_")) / "report.html"
    path.write_text(page, encoding="utf-8")
    size = path.stat().st_size
    print(f"runs {runs}: report.html {size / 1e6:.2f} MB (bar 5 MB), rendered in {render_s:.2f} s")

    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        sys.exit("Debian's chromium is not installed")
    loads, sorts = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        for _ in range(5):
            tab = browser.new_page()
            started = time.perf_counter()
            tab.goto(path.as_uri(), wait_until="load")
            loads.append(time.perf_counter() - started)
            # in the page: the click's handler, then the layout it forces (what a user waits for)
            sorts.append(
                tab.evaluate(
                    """() => { const header = [...document.querySelectorAll('#runs thead th')]
                        .find(h => h.textContent.trim() === 'tokens/s');
                      const start = performance.now(); header.click(); document.body.offsetHeight;
                      return (performance.now() - start) / 1000; }"""
                )
            )
            tab.close()
        browser.close()
    print(f"open (to the load event): median {statistics.median(loads):.3f} s, worst {max(loads):.3f} s (bar 2 s)")
    print(f"sort {runs} rows by a click: median {statistics.median(sorts):.3f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
