"""Accelerator descriptions: memory, precision support, peak throughput and link bandwidths."""

from __future__ import annotations

from dataclasses import dataclass

from dsgen.units import GIB

FLASH_ATTENTION_MIN_MAJOR = 8  # compute capability major version FlashAttention-2 needs
FLASH_ATTENTION_3_MAJOR = 9  # FlashAttention-3 is written for Hopper (sm90) only


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator model.

    ``memory_gib`` is the capacity the CUDA/ROCm runtime reports as total device memory (what
    ``torch.cuda.mem_get_info()`` returns as total), not the marketing figure. Throughputs are
    dense (no sparsity) peaks in TFLOP/s; bandwidths are GB/s (1e9 bytes per second), one
    direction, per GPU.
    """

    name: str
    memory_gib: float
    bf16: bool
    fp16: bool = True
    peak_tflops_bf16: float = 0.0
    peak_tflops_fp16: float = 0.0
    peak_tflops_fp32: float = 0.0
    memory_bandwidth_gbps: float = 0.0
    interconnect_bandwidth_gbps: float = 0.0  # intra-node GPU-to-GPU (NVLink/xGMI, or PCIe)
    pcie_bandwidth_gbps: float = 25.0  # host link, used for CPU offload transfers
    vendor: str = "nvidia"
    compute_capability: str = ""
    description: str = ""

    @property
    def compute_major(self) -> int | None:
        """NVIDIA compute capability's major version (9 for Hopper); None for other vendors or
        when the spec does not state it."""
        if self.vendor != "nvidia" or not self.compute_capability:
            return None
        return int(self.compute_capability.split(".")[0])

    @property
    def is_hopper(self) -> bool:
        """Known to be a Hopper GPU (compute capability 9.x: H100, H200)."""
        return self.compute_major == FLASH_ATTENTION_3_MAJOR

    @property
    def runs_flash_attention(self) -> bool:
        """FlashAttention-2 runs on NVIDIA compute capability 8.0 and newer (Ampere, Ada, Hopper,
        Blackwell; its README: "Turing GPUs not supported yet"); V100 (7.0) and T4 (7.5) cannot.
        A GPU without a stated compute capability is not judged."""
        return self.compute_major is None or self.compute_major >= FLASH_ATTENTION_MIN_MAJOR

    @property
    def runs_flash_attention_3(self) -> bool:
        """FlashAttention-3 runs on Hopper, compute capability 9.0 (flash-attention's hopper/
        README: "H100 / H800 GPU"); not on Ampere, Ada or Blackwell. Not judged without a stated
        compute capability."""
        return self.compute_major is None or self.is_hopper

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for the precision the plan trains in (fp32 falls back to TF32-free FP32)."""
        if precision == "bf16":
            return self.peak_tflops_bf16
        if precision == "fp16":
            return self.peak_tflops_fp16
        return self.peak_tflops_fp32
