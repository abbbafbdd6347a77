"""Regenerate the screenshots of the three HTML reports that docs/ and the README show.

Renders ``explain --html`` (the DPO example), a sweep's ``report.html`` (examples/sweep) and
``frontier --html`` (Llama 3.1 8B over 1, 8, 16 and 64 H100s), opens each in Debian's Chromium
through Playwright at a 1,280 px wide window, and writes the top 1,100 px of each page's column
(the body, without the empty margins beside it) to ``docs/img/{explain,sweep,frontier}.png``;
prints each file's size.

Run: python bench/report_screenshots.py   (needs Debian's chromium and playwright)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DSGEN = [sys.executable, "-m", "dsgen"]
WIDTH, HEIGHT = 1280, 1100  # a laptop's window; the pages' column is 980 px wide at most


def main() -> None:
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="dsgen_shots_"))
    examples = REPO / "examples"
    pages = {
        "explain": tmp / "explain.html",
        "sweep": tmp / "runs" / "report.html",
        "frontier": tmp / "frontier.html",
    }
    for argv in (
        ["explain", str(examples / "dpo-llama-3.1-8b-8xh100.yaml"), "--html", str(pages["explain"])],
        ["sweep", str(examples / "sweep" / "sweep.yaml"), "-o", str(tmp / "runs")],
        [
            "frontier",
            str(examples / "llama-3.1-8b-8xh100.yaml"),
            "--gpus",
            "1,8,16,64",
            "--html",
            str(pages["frontier"]),
        ],
    ):
        subprocess.run([*DSGEN, *argv], check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    executable = shutil.which("chromium")
    if executable is None:
        sys.exit("Debian's chromium is not installed")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        for name, page_path in pages.items():
            tab = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            tab.goto(page_path.as_uri())
            out = REPO / "docs" / "img" / f"{name}.png"
            body = tab.evaluate("(() => { const r = document.body.getBoundingClientRect(); return [r.x, r.width]; })()")
            tab.screenshot(path=str(out), clip={"x": body[0], "y": 0, "width": body[1], "height": HEIGHT})
            print(f"{out.relative_to(REPO)}: {out.stat().st_size / 1e3:.0f} kB")
            tab.close()
        browser.close()


if __name__ == "__main__":
    main()
