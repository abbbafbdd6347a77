"""``dsgen frontier --html FILE``: the capacity curve (the largest sequence or micro-batch that fits
at each GPU count) with each point's plan, memory, step time and what stops it one step further."""

from __future__ import annotations

from typing import Any

from dsgen import __version__
from dsgen.reporting.html.charts import VERDICT_COLOURS, columns
from dsgen.reporting.html.labels import plan_summary
from dsgen.reporting.html.page import render_page


def frontier_page(body: dict[str, Any], spec_name: str, model: str, gpu: str) -> str:
    """The page for ``body`` (``frontier --json``'s object, with its ``points`` list)."""
    key = "max_sequence_length" if body["over"] == "sequence_length" else "max_micro_batch_size"
    items = [(f"{point['gpus']} GPUs", float(point[key] or 0), VERDICT_COLOURS["fits"]) for point in body["points"]]
    return render_page(
        "frontier.html.j2",
        {
            "version": __version__,
            "spec_name": spec_name,
            "model": model,
            "gpu": gpu,
            "body": body,
            "key": key,
            "chart": columns(items),
            "summaries": [plan_summary(point["plan"]) if point.get("plan") else "" for point in body["points"]],
        },
    )
