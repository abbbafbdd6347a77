"""``dsgen explain SPEC --html FILE``: the plan, its memory per phase against capacity and the safe
line, host RAM per phase, the step-time split, each alternative and why it lost, the verdict."""

from __future__ import annotations

from typing import Any

from dsgen import __version__
from dsgen.html.charts import TERM_COLOURS, stacked_bars
from dsgen.html.page import render_page
from dsgen.report import PHASE_LABELS

HOST_PHASES = {"startup": "start-up", "training": "training", "checkpoint_save": "checkpoint save"}
STEP_PARTS = {
    "compute_s": "compute",
    "exposed_comm_s": "exposed communication",
    "offload_s": "offload",
    "generation_s": "generation",
}


def _gpu_chart(body: dict[str, Any]) -> Any:
    gpu = body["memory"]["gpu"]
    rows = [(PHASE_LABELS[phase], terms) for phase, terms in gpu["phase_terms"].items()]
    marks = {"capacity": gpu["capacity"], "safe line": body["safe_line"] * gpu["capacity"]}
    return stacked_bars(rows, marks)


def _host_chart(body: dict[str, Any]) -> Any:
    cpu = body["memory"]["cpu"]
    rows = [(label, {phase: cpu["phases"][phase]}) for phase, label in HOST_PHASES.items()]
    return stacked_bars(rows, {"capacity": cpu["capacity"], "usable": cpu["usable"]})


def _step_chart(body: dict[str, Any]) -> Any:
    return stacked_bars([("one step", {part: body["step_time"][part] for part in STEP_PARTS})], {})


def explain_page(body: dict[str, Any], explanation: str, spec_name: str) -> str:
    """The page for ``body`` (``solve --json``'s object for the same spec and options) and the text
    ``dsgen explain`` prints; ``spec_name`` is the spec file's name, for the title."""
    phases = body["memory"]["gpu"]["phase_terms"].values()
    gpu_terms = sorted({term for terms in phases for term, value in terms.items() if value})
    return render_page(
        "explain.html.j2",
        {
            "version": __version__,
            "spec_name": spec_name,
            "body": body,
            "phase_labels": PHASE_LABELS,
            "host_phases": HOST_PHASES,
            "step_parts": STEP_PARTS,
            "gpu_chart": _gpu_chart(body),
            "host_chart": _host_chart(body),
            "step_chart": _step_chart(body),
            "gpu_legend": [(term, TERM_COLOURS.get(term, "#BBBBBB")) for term in gpu_terms],
            "explanation": explanation,
        },
    )
