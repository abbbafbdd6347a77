"""How fast the fused attention kernels run, where a measurement is published (docs/throughput-model.md,
"Long context").

At 100K+ tokens the attention core is most of a step's work, and it does not run at the MFU the rest
of the model's matmuls reach: FlashAttention-2 does not use Hopper's warpgroup matrix instructions,
so on an H100 it reaches about a third of the dense peak, while FlashAttention-3, written for Hopper,
reaches more than half. The figures are the FlashAttention-3 paper's (Shah et al. 2024,
arXiv 2407.08608, the forward and backward speed figures for head dim 128 on H100 80GB SXM5, at 16K
tokens): forward with a causal mask, FlashAttention-2 335 and FlashAttention-3 616 TFLOPs/s;
backward, 322 and 561. Its benchmark counts a causal forward as half the full ``4·s²·d`` per head
and the backward as 2.5 forwards; :func:`attention_seconds` prices with the same accounting. They are
kept as shares of that GPU's dense 16-bit peak (989 TFLOPs/s), so an H200 (the same chip) gets the same
rate. PyTorch's SDPA on CUDA runs FlashAttention-2's kernel for causal 16-bit attention.
"""

from __future__ import annotations

from dsgen.catalog.gpu import GpuSpec

_H100_SXM_PEAK_TFLOPS = 989.4
# (forward, backward) TFLOPs/s on H100 SXM5, head dim 128, 16K tokens, causal forward
_FLASH_ATTENTION_2_TFLOPS = (335.0, 322.0)
_HOPPER_TFLOPS = {"flash": _FLASH_ATTENTION_2_TFLOPS, "sdpa": _FLASH_ATTENTION_2_TFLOPS, "flash3": (616.0, 561.0)}
BACKWARD_FORWARDS = 2.5  # FlashAttention's benchmark: a backward is 2.5 forwards of FLOPs


def kernel_shares(gpu: GpuSpec, attention: str) -> tuple[float, float] | None:
    """(forward, backward) shares of ``gpu``'s dense 16-bit peak the causal attention kernel
    reaches, or None where no measurement is published (then the plan's MFU prices it)."""
    rates = _HOPPER_TFLOPS.get(attention)
    if rates is None or not gpu.is_hopper:
        return None
    forward, backward = rates
    return forward / _H100_SXM_PEAK_TFLOPS, backward / _H100_SXM_PEAK_TFLOPS


def attention_seconds(forward_flops: float, forwards: int, peak_flops: float, shares: tuple[float, float]) -> float:
    """Seconds of ``forwards`` forward passes and one backward of a causal attention core whose forward
    is ``forward_flops`` (already halved for the mask) at the kernel's measured shares of ``peak_flops``."""
    forward, backward = shares
    return forward_flops * (forwards / (forward * peak_flops) + BACKWARD_FORWARDS / (backward * peak_flops))
