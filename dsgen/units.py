"""Byte sizes every estimate and message shares, defined once."""

from __future__ import annotations

GIB = 1 << 30  # bytes in a GiB: specs and GPU presets give memory in GiB
FP32 = 4  # bytes of one fp32 element (master weights, fp32 gradients, Adam moments)
HALF = 2  # bytes of one bf16/fp16 element (mixed-precision weights and gradients)


def gib(value: float) -> str:
    """A byte count as messages print it: GiB to one decimal, TiB to two from 1 TiB."""
    if value >= 1024 * GIB:
        return f"{value / (1024 * GIB):.2f} TiB"
    return f"{value / GIB:.1f} GiB"


def format_count(n: int) -> str:
    """1234567 -> '1.23 M', 8030261248 -> '8.03 B'."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f} {suffix}"
    return str(n)
