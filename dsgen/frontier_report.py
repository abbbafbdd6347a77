"""Present a frontier: its JSON object, a terminal table with a bar chart, and an optional plot.

The plot uses matplotlib, an optional extra (``pip install 'dsgen[plot]'``), so the core install
stays light; without it ``--plot`` is a clear error, exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError
from dsgen.frontier import FrontierPoint, Over
from dsgen.report import evaluation_dict, text_table
from dsgen.units import gib

PLOT_SUFFIXES = (".svg", ".png")


def _key(over: Over) -> str:
    return "max_sequence_length" if over == "sequence_length" else "max_micro_batch_size"


def point_dict(point: FrontierPoint, over: Over) -> dict[str, Any]:
    """One point: the largest value, and the plan, memory and step time there (``solve --json``'s)."""
    shown = point.result.best if point.result.best is not None else point.result.closest
    assert shown is not None
    body = evaluation_dict(shown, point.result.spec) if point.value is not None else {}
    return {
        _key(over): point.value,
        "at_search_limit": point.at_limit,
        "plan": body.get("plan"),
        "memory": body.get("memory"),
        "step_time_s": body.get("step_time_s"),
        "reason": None if point.value is not None else shown.reason(),
        "stopped_by": _stopped_by(point, over),
        "sequence_parallel_ceiling": point.sequence_parallel_ceiling,
    }


def _stopped_by(point: FrontierPoint, over: Over) -> dict[str, Any] | None:
    """One granule past the frontier: the value, what runs out (``gpu``, ``host``, ``nvme``,
    ``kernel``) and the closest plan's reason, with its numbers."""
    e = point.nearest_beyond
    if e is None or point.beyond is None or not point.runs_out:
        return None
    at = point.beyond.spec
    next_value = at.training.sequence_length if over == "sequence_length" else at.constraints.micro_batch_size
    return {over: next_value, "runs_out": list(point.runs_out), "reason": e.reason()}


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
        e = p.result.best if p.result.best is not None else p.result.closest
        assert e is not None
        value = "none fits" if p.value is None else _count(p.value) + ("+" if p.at_limit else "")
        plan = e.plan.describe() if p.value is not None else e.reason()
        peak = f"{e.memory.gpu.total / (1 << 30):.1f} GiB" if p.value is not None else "-"
        step = f"{e.step.total_s:.2f} s" if p.value is not None else "-"
        rows.append([str(p.gpus), value, plan, peak, step])
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


def _what_stops(points: list[FrontierPoint], over: Over) -> list[str]:
    """Per GPU count, what runs out one step past the frontier (by how much, for the plan that
    misses by least), and what caps the Ulysses degree."""
    lines = []
    for p in points:
        stop, e = _stopped_by(p, over), p.nearest_beyond
        if stop is not None and e is not None:
            over_by = {
                "gpu": f"GPU memory, over by {_amount(e.memory.gpu.total - e.usable_gpu_bytes)} "
                f"of {gib(e.usable_gpu_bytes)} usable",
                "host": f"host RAM, over by {_amount(e.memory.cpu.total - e.usable_cpu_bytes)} "
                f"of {gib(e.usable_cpu_bytes)} usable per node{e.host_capacity_note}",
                "nvme": f"NVMe ({e.reason()})",
                "kernel": f"a kernel limit ({e.kernel_limit})",
            }
            where = f"{stop[over]:,} tokens" if over == "sequence_length" else f"micro-batch {stop[over]}"
            lines.append(f"  {p.gpus:>5} GPUs, at {where}: " + "; ".join(over_by[r] for r in p.runs_out))
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
