"""``dsgen explain SPEC --html FILE``: the method, the plan (only what it turns on), its memory per
phase against capacity and the safe line, host RAM per phase, the step-time split with every term,
each alternative (ZeRO stage, model-parallel layout, offload) and why it lost, the verdict."""

from __future__ import annotations

from typing import Any

from dsgen import __version__
from dsgen.reporting.html.charts import NEUTRAL, TERM_COLOURS, stacked_bars
from dsgen.reporting.html.labels import (
    alternative_rows,
    memory_label,
    method_parts,
    plan_items,
    plan_summary,
    step_terms,
)
from dsgen.reporting.html.page import render_page
from dsgen.reporting.report import PHASE_LABELS

HOST_PHASES = {"startup": "start-up", "training": "training", "checkpoint_save": "checkpoint save"}


def _gpu_chart(body: dict[str, Any]) -> Any:
    gpu = body["memory"]["gpu"]
    rows = [(PHASE_LABELS[phase], terms) for phase, terms in gpu["phase_terms"].items()]
    marks = {"capacity": gpu["capacity"], "safe line": body["safe_line"] * gpu["capacity"]}
    return stacked_bars(rows, marks)


def _host_chart(body: dict[str, Any]) -> Any:
    cpu = body["memory"]["cpu"]
    rows = [(label, {phase: cpu["phases"][phase]}) for phase, label in HOST_PHASES.items()]
    return stacked_bars(rows, {"capacity": cpu["capacity"], "limit": cpu["usable"]})


def _step_chart(body: dict[str, Any]) -> Any:
    """One bar of every term the JSON's ``step_time`` carries (generation included), in its order."""
    return stacked_bars([("one step", dict(body["step_time"]))], {})


def explain_page(body: dict[str, Any], explanation: str, spec_name: str) -> str:
    """The page for ``body`` (``solve --json``'s object for the same spec and options) and the text
    ``dsgen explain`` prints; ``spec_name`` is the spec file's name, for the title."""
    phases = body["memory"]["gpu"]["phase_terms"].values()
    gpu_terms = sorted({term for terms in phases for term, value in terms.items() if value})
    terms = step_terms(body["step_time"])
    gpu_legend = [(term, memory_label(term), TERM_COLOURS.get(term, NEUTRAL)) for term in gpu_terms]
    return render_page(
        "explain.html.j2",
        {
            "version": __version__,
            "spec_name": spec_name,
            "body": body,
            "method": method_parts(body.get("finetuning")),
            "plan_items": plan_items(body["plan"]) if body.get("plan") else [],
            "phase_labels": PHASE_LABELS,
            "host_phases": HOST_PHASES,
            "step_terms": terms,
            "alternatives": alternative_rows(body),
            "chosen_summary": plan_summary(body["plan"]) if body.get("plan") else "",
            "gpu_chart": _gpu_chart(body),
            "host_chart": _host_chart(body),
            "step_chart": _step_chart(body),
            "gpu_legend": gpu_legend,
            "gpu_legend_names": [(label, colour) for _, label, colour in gpu_legend],
            "gpu_labels": {term: label for term, label, _ in gpu_legend},
            "step_labels": {term.key: term.label for term in terms},
            "explanation": explanation,
        },
    )
