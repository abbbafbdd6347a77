"""Plain-text tables for the terminal (solve --top, presets, sweep --dry-run)."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> str:
    """Columns as wide as their widest cell, so every row lines up whatever its labels' lengths.

    Columns whose index is in ``right`` are right-aligned (numbers); the rest left-aligned.
    """
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return " ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join(line(cells) for cells in (header, *rows))
