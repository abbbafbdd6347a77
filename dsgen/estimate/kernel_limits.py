"""What stops a plan before memory does: FlashAttention-2's 32-bit indexing.

FlashAttention-2 computes some of its backward's offsets in 32-bit integers: once one rank's
query tensor holds 2^31 elements or more, the kernel reads and writes out of bounds and the run
dies with "CUDA error: an illegal memory access was encountered", however much memory is free.
The evidence, each in docs/memory-model.md ("Kernel limits"):

- flash-attention PR #1500 (merged 2025-03-02) promoted ``row_offset_dq_accum`` in the backward
  to 64 bits after it overflowed; flash-attention issue #767: past ``tensor.numel() > 2^31`` the
  ALST authors were told to use FlashAttention-3, which "solved the problem", and that
  FlashAttention-2 "will not be fixed since FA3 is going to replace FA2";
- every published ALST maximum with FlashAttention-2 sits just under it (micro-batch 1, one
  rank's ``sequence x query heads / SP x head_dim``): Llama-3.1-8B 500K on one H100 (2.05e9;
  the recipe's next try, 555K, "Triton Error [CUDA]: an illegal memory access was encountered"),
  3.8M on 8 (1.95e9), 8M on 16 (2.05e9), 15.5M on 32 (1.98e9); Qwen3-32B 4M on 16 (2.05e9); while
  the H200 recipes that go past it, 650K and 1.2M on one GPU, switch to FlashAttention-3.

Under Ulysses SP a rank's attention sees the whole sequence and ``heads / SP`` of the heads, so
the query tensor is ``micro x sequence x q_size / SP`` elements; without it, the local sequence
is the whole one. FlashAttention-3 and SDPA are not limited here.
"""

from __future__ import annotations

from dsgen.catalog.model_shape import ModelShape
from dsgen.plan import Plan

#: Elements in one tensor from which FlashAttention-2's 32-bit offsets overflow.
INDEX_LIMIT = 2**31
#: The ways out of :func:`kernel_limit`, as solve and doctor both give them.
KERNEL_LIMIT_HINT = (
    "use attention: flash3 (FlashAttention-3, Hopper GPUs) or sdpa in the spec and the script, a larger "
    "constraints.sequence_parallel_size (more GPUs), or a shorter training.sequence_length"
)


def attention_query_elements(shape: ModelShape, plan: Plan, sequence_length: int) -> int:
    """Elements of one rank's query tensor inside attention (after Ulysses' all-to-all)."""
    return plan.micro_batch_size * sequence_length * shape.q_size // plan.long_context.sequence_parallel_size


def kernel_limit(shape: ModelShape, plan: Plan, sequence_length: int, attention: str) -> str | None:
    """Why ``plan`` crashes a kernel regardless of memory (None when it does not)."""
    if attention != "flash":
        return None
    elements = attention_query_elements(shape, plan, sequence_length)
    if elements < INDEX_LIMIT:
        return None
    return (
        f"FlashAttention-2 indexes with 32-bit offsets: one rank's queries would hold {elements:,} elements, "
        f"{elements / INDEX_LIMIT:.2f} x 2^31 (its backward fails with an illegal memory access)"
    )
