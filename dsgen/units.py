"""Byte sizes every estimate and message shares, defined once."""

from __future__ import annotations

GIB = 1 << 30  # bytes in a GiB: specs and GPU presets give memory in GiB
FP32 = 4  # bytes of one fp32 element (master weights, fp32 gradients, Adam moments)
HALF = 2  # bytes of one bf16/fp16 element (mixed-precision weights and gradients)
