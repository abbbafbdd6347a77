"""Present a frontier: its JSON object, a terminal table with a bar chart, and an optional plot.

The plot uses matplotlib, an optional extra (``pip install 'dsgen[plot]'``), so the core install
stays light; without it ``--plot`` is a clear error, exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError
from dsgen.reporting.report import evaluation_dict, text_table
from dsgen.search.evaluation import Evaluation
from dsgen.search.frontier import FrontierPoint, Over
from dsgen.spec.types import Spec
from dsgen.units import gib

PLOT_SUFFIXES = (".svg", ".png")


def _key(over: Over) -> str:
    return "max_sequence_length" if over == "sequence_length" else "max_micro_batch_size"


def point_dict(point: FrontierPoint, over: Over) -> dict[str, Any]:
    """One point: the largest value, and the plan, memory and step time there (``solve --json``'s)."""
    best = point.result.best
    body = evaluation_dict(best, point.result.spec) if point.value is not None and best is not None else {}
    return {
        _key(over): point.value,
        "at_search_limit": point.at_limit,
        "plan": body.get("plan"),
        "memory": body.get("memory"),
        "step_time_s": body.get("step_time_s"),
        "reason": _no_fit_reason(point),
        "stopped_by": _stopped_by(point, over),
        "sequence_parallel_ceiling": point.sequence_parallel_ceiling,
    }


def _no_fit_reason(point: FrontierPoint) -> str | None:
    """Why not even the smallest value fits: the closest plan's reason, as ``solve`` gives it
    (``None`` when a value fits)."""
    miss = point.miss
    if miss is None:
        return None
    return miss.reason() or f"{miss.plan.describe()} does not fit"


def _value_of(spec: Spec, over: Over) -> int:
    """The searched value a frontier probe's spec was solved at."""
    value = spec.training.sequence_length if over == "sequence_length" else spec.constraints.micro_batch_size
    assert value is not None  # the frontier pins the micro-batch it probes
    return value


def _stopped_by(point: FrontierPoint, over: Over) -> dict[str, Any] | None:
    """One granule past the frontier: the value, what runs out (``gpu``, ``host``, ``nvme``,
    ``kernel``) and the closest plan's reason, with its numbers."""
    e = point.nearest_beyond
    if e is None or point.beyond is None or not point.runs_out:
        return None
    return {over: _value_of(point.beyond.spec, over), "runs_out": list(point.runs_out), "reason": e.reason()}


def frontier_dict(points: list[FrontierPoint], over: Over, with_points: bool) -> dict[str, Any]:
    """``dsgen frontier --json``: the first point's keys at the top, and with ``--gpus`` a
    ``points`` list, one per GPU count, with the same keys plus ``gpus``."""
    body: dict[str, Any] = {"over": over, "gpus": points[0].gpus, **point_dict(points[0], over)}
    if with_points:
        body["points"] = [{"gpus": p.gpus, **point_dict(p, over)} for p in points]
    return body


def _count(value: int) -> str:
    """12,582,912 -> '12,582,912 (12M)': the exact value and its size in binary units."""
    for scale, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if value >= scale:
            return f"{value:,} ({value / scale:.3g}{suffix})"
    return f"{value:,}"


def frontier_table(points: list[FrontierPoint], over: Over, width: int = 32) -> str:
    """A table (GPUs, largest value, plan, peak GPU memory, step time) and a bar per GPU count."""
    header = ["GPUs", "max " + over.replace("_", " "), "plan", "GPU peak", "step"]
    rows = []
    for p in points:
        e = p.result.best
        if p.value is None or e is None:
            rows.append([str(p.gpus), "none fits", _no_fit_reason(p) or "", "-", "-"])
            continue
        value = _count(p.value) + ("+" if p.at_limit else "")
        rows.append([str(p.gpus), value, e.plan.describe(), gib(e.memory.gpu.total), f"{e.step.total_s:.2f} s"])
    top = max((p.value or 0 for p in points), default=0)
    bars = [
        f"{p.gpus:>6} GPUs |{'#' * (round(width * (p.value or 0) / top) if top else 0):<{width}}| "
        f"{_count(p.value) if p.value else 'none fits'}"
        for p in points
    ]
    note = ["", "+: the search limit fits (2**24 tokens / 65,536 sequences); the frontier lies beyond it"]
    shown = note if any(p.at_limit for p in points) else []
    return "\n".join([text_table(header, rows, right={0, 1, 3, 4}), "", *bars, *shown, *_what_stops(points, over)])


def _amount(n_bytes: int) -> str:
    """An overshoot: MiB below a GiB (a frontier's next step often misses by a few MiB)."""
    return gib(n_bytes) if n_bytes >= 1 << 30 else f"{max(n_bytes, 0) / (1 << 20):,.0f} MiB"


def _where(over: Over, value: int) -> str:
    return f"{value:,} tokens" if over == "sequence_length" else f"micro-batch {value}"


def _over_by(e: Evaluation) -> str:
    """What ``e`` runs out of, each by how much against its limit (capacity less the headroom)."""
    over_by = {
        "gpu": f"GPU memory, over by {_amount(e.memory.gpu.total - e.usable_gpu_bytes)} "
        f"of the {gib(e.usable_gpu_bytes)} limit",
        "host": f"host RAM, over by {_amount(e.memory.cpu.total - e.usable_cpu_bytes)} "
        f"of the {gib(e.usable_cpu_bytes)} limit per node{e.host_capacity_note}",
        "nvme": f"NVMe ({e.reason()})",
        "kernel": f"a kernel limit ({e.kernel_limit})",
    }
    return "; ".join(over_by[r] for r in e.runs_out)


def _what_stops(points: list[FrontierPoint], over: Over) -> list[str]:
    """Per GPU count, what runs out one step past the frontier (by how much, for the plan that
    misses by least; at the smallest value when nothing fits), and what caps the Ulysses degree."""
    lines = []
    for p in points:
        stop, e = _stopped_by(p, over), p.nearest_beyond
        if stop is not None and e is not None:
            lines.append(f"  {p.gpus:>5} GPUs, at {_where(over, stop[over])}: {_over_by(e)}")
        miss = p.miss
        if miss is not None and miss.runs_out:
            smallest = _value_of(p.result.spec, over)
            lines.append(f"  {p.gpus:>5} GPUs, none fits, already at {_where(over, smallest)}: {_over_by(miss)}")
        if p.sequence_parallel_ceiling is not None:
            lines.append(f"  {p.gpus:>5} GPUs: no larger {p.sequence_parallel_ceiling}")
    return ["", "what runs out one step further (the plan that misses by least):", *lines] if lines else []


def write_plot(points: list[FrontierPoint], over: Over, path: Path) -> None:
    """Draw the capacity curve (largest value per GPU count) to ``path`` (.svg or .png)."""
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise DsgenError(f"the plot must be a .svg or .png file, got {path.name}", path="--plot")
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise DsgenError(
            "--plot needs matplotlib, which is not installed", path="--plot", hint="pip install 'dsgen[plot]'"
        ) from None
    figure, axes = pyplot.subplots(figsize=(6, 4))
    xs = [p.gpus for p in points]
    ys = [p.value or 0 for p in points]
    axes.plot(xs, ys, marker="o")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("GPUs")
    axes.set_ylabel(f"largest {over.replace('_', ' ')} that fits")
    spec = points[0].result.spec
    axes.set_title(f"{spec.model.name} on {spec.hardware.gpu.name}")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
