"""A sweep's ``report.html``: every run in one sortable table with its verdict, memory and
throughput, and columns charts of GPU fill and tokens/s across the runs.

It is built from the manifest rows the sweep writes (``manifest.jsonl``), so the page and the
manifest cannot disagree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from dsgen import __version__
from dsgen.reporting.html.charts import NEUTRAL, VERDICT_COLOURS, columns
from dsgen.reporting.html.labels import plan_summary
from dsgen.reporting.html.page import render_page
from dsgen.search.verdict import SAFE_LINE


def _colour(row: dict[str, Any]) -> str:
    return VERDICT_COLOURS.get(row["verdict"] or "", NEUTRAL)


def sweep_page(rows: Sequence[dict[str, Any]], varied_keys: Sequence[str], sweep_name: str) -> str:
    """The page for a sweep's manifest ``rows`` (in run order) and the keys it varies."""
    fills = [(row["name"], row["fill"] or 0.0, _colour(row)) for row in rows]
    throughput = [(row["name"], row["tokens_per_s"] or 0.0, _colour(row)) for row in rows]
    return render_page(
        "sweep.html.j2",
        {
            "version": __version__,
            "sweep_name": sweep_name,
            "rows": rows,
            "varied_keys": list(varied_keys),
            "statuses": sorted(Counter(row["status"] for row in rows).items()),
            "verdicts": sorted(Counter(row["verdict"] for row in rows if row["verdict"]).items()),
            "verdict_colours": VERDICT_COLOURS,
            "safe_line": SAFE_LINE,
            "fill_chart": columns(fills, guide=SAFE_LINE, guide_label=f"safe line {SAFE_LINE:.0%}"),
            "throughput_chart": columns(throughput),
            "summaries": [plan_summary(row) if row.get("zero_stage") is not None else "" for row in rows],
        },
    )
