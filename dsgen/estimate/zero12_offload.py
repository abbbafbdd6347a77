"""ZeRO-1/2 CPU optimizer offload by DeepSpeed release: what its host and GPU hold beyond the
0.19.8 tensors :class:`dsgen.estimate.model_states.ModelStates` records.

Three changes to ``stage_1_and_2.py`` (``DeepSpeedZeroOptimizer``), found with ``git log -S`` and
dated by ``git tag --contains``:

* deepspeedai/DeepSpeed#5301 (0.14.1) to #7309 (commit 17c8be0, 0.17.0): the step writes the
  updated weights back through an fp32 copy of the partition on the GPU
  (:data:`OFFLOAD_WRITE_BACK_COPY`);
* #7309 on: that write-back goes through a 16-bit host buffer of the partition instead
  (``param_buffer_of_bit16_for_cpu_offload_groups``), which earlier releases do not have
  (:func:`zero12_staging_bytes`);
* #7689 (commit c502d3a, 0.18.3): the fp32 master partition is pinned only when
  ``offload_optimizer.pin_memory`` asks; before, ``if self.cpu_offload:`` pinned it always
  (:data:`MASTER_PIN_FOLLOWS_CONFIG_SINCE`).

Pinned host blocks are rounded up to a power of two (:func:`dsgen.estimate.model_states.pinned`);
:func:`zero12_pinned_rounding` prices that for the partition-sized blocks.
"""

from __future__ import annotations

from dsgen.estimate.model_states import ModelStates, pinned
from dsgen.facts.release import release_key
from dsgen.plan import Plan
from dsgen.units import FP32

#: ZeRO-1/2 with CPU optimizer offload, from deepspeedai/DeepSpeed#5301 (0.14.1) until #7309
#: (0.17.0, which stages through a 16-bit host buffer instead): ``DeepSpeedZeroOptimizer.step``
#: writes the updated weights back with ``bit16_partitions[partition_id].data.copy_(
#: fp32_partition.to(get_accelerator().current_device_name()).data)``, an fp32 copy of the rank's
#: partition on the GPU (read in ``stage_1_and_2.py`` at v0.14.0, v0.14.1, v0.16.9 and v0.17.0).
#: The range is half-open: [first release with the copy, first release without it).
OFFLOAD_WRITE_BACK_COPY: tuple[tuple[int, ...], tuple[int, ...]] = ((0, 14, 1), (0, 17, 0))


def writes_back_through_gpu(deepspeed_version: str) -> bool:
    """Whether this release's ZeRO-1/2 CPU offload writes the weights back through a GPU fp32 copy."""
    since, until = OFFLOAD_WRITE_BACK_COPY
    return since <= release_key(deepspeed_version) < until


def offload_write_back_copy(plan: Plan, deepspeed_version: str) -> bool:
    """Whether this plan's optimizer step makes that copy (ZeRO-1/2, optimizer offloaded to the CPU)."""
    return plan.zero_stage in (1, 2) and plan.offload_optimizer == "cpu" and writes_back_through_gpu(deepspeed_version)


#: The first release with the 16-bit host staging buffer (#7309, the end of the GPU write-back).
HOST_STAGING_SINCE: tuple[int, ...] = OFFLOAD_WRITE_BACK_COPY[1]

#: The first release that pins the fp32 master partition only when the config asks (#7689, c502d3a).
MASTER_PIN_FOLLOWS_CONFIG_SINCE: tuple[int, ...] = (0, 18, 3)


def _zero12_cpu_offload(plan: Plan) -> bool:
    return plan.zero_stage in (1, 2) and plan.offload_optimizer == "cpu"


def zero12_staging_bytes(states: ModelStates, plan: Plan, deepspeed_version: str) -> int:
    """The 16-bit host staging buffer of the rank's partition that ``ModelStates.offloaded_optimizer``
    counts (0.19.8 has it) and this release lacks: subtract it. 0 where the release has it."""
    if not _zero12_cpu_offload(plan) or release_key(deepspeed_version) >= HOST_STAGING_SINCE:
        return 0
    return plan.dtype_bytes * states.partitioning.zero12_slice


def zero12_pinned_rounding(states: ModelStates, plan: Plan, deepspeed_version: str) -> int:
    """Host bytes per rank that ZeRO-1/2 CPU offload pins beyond its blocks' own sizes.

    Pinned, each its own block (``stage_1_and_2.py``, 0.19.8): the fp32 master partition
    (always before :data:`MASTER_PIN_FOLLOWS_CONFIG_SINCE`), and under ``pin_memory`` the fp32
    gradient partition (``initialize_optimizer_states``), the 16-bit staging buffer (from
    :data:`HOST_STAGING_SINCE`) and the largest-tensor gradient buffer
    (``temp_grad_buffer_for_cpu_offload``). The per-tensor accumulators of ZeRO-2 with gradient
    accumulation are pinned one by one too; their rounding is not priced."""
    if not _zero12_cpu_offload(plan):
        return 0
    release = release_key(deepspeed_version)
    pin = plan.knobs.pin_optimizer_offload
    w = plan.dtype_bytes
    partition = states.partitioning.zero12_slice
    blocks = []
    if pin or release < MASTER_PIN_FOLLOWS_CONFIG_SINCE:
        blocks.append(FP32 * partition)
    if pin:
        blocks += [FP32 * partition, w * states.partitioning.largest_tensor]
        if release >= HOST_STAGING_SINCE:
            blocks.append(w * partition)
    return sum(pinned(block) - block for block in blocks)
