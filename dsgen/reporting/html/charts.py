"""Chart geometry for the HTML reports, as plain values the templates draw as inline SVG.

The pages must open with no network and print well, so charts are SVG written into the page, not a
script library. Only three shapes are needed (stacked horizontal bars against capacity marks,
columns over many runs, and points over a few GPU counts); each function here turns numbers into
coordinates in a fixed viewBox and leaves drawing to the template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: One colour per term name, stable across bars and pages (colour-blind-safe Okabe-Ito order,
#: then neutrals); a term not listed takes the neutral grey.
TERM_COLOURS = {
    "parameters": "#0072B2",
    "gradients": "#56B4E9",
    "optimizer_states": "#009E73",
    "activations": "#E69F00",
    "buffers": "#CC79A7",
    "transient": "#D55E00",
    "overhead": "#999999",
    "frozen_parameters": "#004C73",
    "reference_model": "#7F6A00",
    "value_model": "#5E3C99",
    "vllm_reserved": "#B2ABD2",
    "generation": "#F0E442",
    "generation_gather": "#B8860B",
    "compute_s": "#0072B2",
    "exposed_comm_s": "#D55E00",
    "offload_s": "#009E73",
    "generation_s": "#F0E442",
    "startup": "#999999",
    "training": "#0072B2",
    "checkpoint_save": "#E69F00",
}
VERDICT_COLOURS = {"fits": "#009E73", "tight": "#E69F00", "oom": "#D55E00", "host-oom": "#CC79A7"}
NEUTRAL = "#BBBBBB"

WIDTH = 640.0  # viewBox width of every chart; the page scales it to the screen
LABEL_WIDTH = 150.0  # left margin of horizontal bars, for their labels
BAR_HEIGHT = 22.0
BAR_GAP = 10.0
MARK_LINE = 13.0  # each mark's label gets its own line under the bars, so close marks stay legible


@dataclass(frozen=True)
class Segment:
    name: str
    value: float
    x: float
    width: float
    colour: str


@dataclass(frozen=True)
class Bar:
    label: str
    total: float
    y: float
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class Mark:
    """A vertical line across the bars (capacity, the safe line)."""

    label: str
    value: float
    x: float


@dataclass(frozen=True)
class StackedBars:
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    height: float
    left: float
    right: float
    bar_height: float = BAR_HEIGHT


def stacked_bars(rows: Sequence[tuple[str, Mapping[str, float]]], marks: Mapping[str, float]) -> StackedBars:
    """Horizontal bars, one per ``(label, {term: value})`` row, stacked in the row's order and drawn
    to one scale with ``marks`` (e.g. capacity and the safe line); zero terms are left out."""
    right = WIDTH - 10
    peak = max([*(sum(terms.values()) for _, terms in rows), *marks.values(), 1.0])
    scale = (right - LABEL_WIDTH) / peak
    bars = []
    for index, (label, terms) in enumerate(rows):
        x = LABEL_WIDTH
        segments = []
        for name, value in terms.items():
            if value <= 0:
                continue
            width = value * scale
            segments.append(Segment(name, value, x, width, TERM_COLOURS.get(name, NEUTRAL)))
            x += width
        bars.append(Bar(label, sum(terms.values()), 10 + index * (BAR_HEIGHT + BAR_GAP), tuple(segments)))
    drawn = tuple(Mark(label, value, LABEL_WIDTH + value * scale) for label, value in marks.items())
    height = 10 + len(rows) * (BAR_HEIGHT + BAR_GAP) + MARK_LINE * len(drawn)
    return StackedBars(tuple(bars), drawn, height, LABEL_WIDTH, right)


@dataclass(frozen=True)
class Column:
    label: str
    value: float
    x: float
    y: float
    width: float
    height: float
    colour: str


@dataclass(frozen=True)
class Columns:
    """Vertical columns over many runs, with an optional horizontal guide (e.g. the safe line)."""

    columns: tuple[Column, ...]
    guide: float | None  # the guide's y, or None
    guide_label: str
    peak: float
    height: float
    base: float  # y of the axis


def columns(
    items: Sequence[tuple[str, float, str]], *, guide: float | None = None, guide_label: str = "", height: float = 170.0
) -> Columns:
    """One column per ``(label, value, colour)``, left to right, scaled to the largest value (or
    the guide, if higher); a thousand runs still fit the width (columns get thinner)."""
    top, base = 12.0, height - 18.0
    peak = max([*(value for _, value, _ in items), guide or 0.0, 1e-12])
    step = (WIDTH - 20) / max(len(items), 1)
    width = max(step * 0.8, 0.3)
    drawn = []
    for index, (label, value, colour) in enumerate(items):
        h = max(value, 0.0) / peak * (base - top)
        drawn.append(Column(label, value, 10 + index * step, base - h, width, h, colour))
    guide_y = None if guide is None else base - guide / peak * (base - top)
    return Columns(tuple(drawn), guide_y, guide_label, peak, height, base)
