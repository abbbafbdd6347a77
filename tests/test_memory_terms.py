"""The non-model-state memory terms of dsgen/estimate/memory.py pinned to hand-computed values.

Buffers, the loss/recompute transient, the GPU overhead, host RAM and NVMe per node. Every
expected value is worked out here from the formulas in docs/memory-model.md and the published
architecture of the model (dsgen/catalog/data/models/llama-3.1-8b.yaml); the arithmetic is in the comments.
Nothing expected is read back from the function under test.
"""

from __future__ import annotations

import pytest

from dsgen.catalog.presets import get_model
from dsgen.estimate.memory import (
    ALLOCATOR_SLACK,
    COMM_LIBRARY_BYTES,
    CUDA_CONTEXT_BYTES,
    GIB,
    HOST_BYTES_PER_RANK,
    buffer_bytes,
    estimate_memory,
    nvme_bytes,
    offloaded_host_bytes,
    startup_host_bytes,
)
from dsgen.estimate.model_states import model_states, pinned
from dsgen.intake.loader import load_spec_text
from dsgen.plan import Plan, ZeroKnobs
from dsgen.spec.types import Spec
from tests.conftest import EXAMPLES_DIR, require_module
from tests.test_model_states import ODD  # one llama layer: h = 3, one head of 3, f = 5, V = 7, untied; 132 parameters

# ---- shared inputs ---------------------------------------------------------------------------
# Llama-3.1-8B (its preset file): L = 32, h = 4096, 32 heads of 128 (q = 4096), 8 kv heads
# (kv = 1024), f = 14336, V = 128256, P = 8_030_261_248 (published).
L, H, Q, KV, NH, F, V = 32, 4096, 4096, 1024, 32, 14336, 128256
P = 8_030_261_248
G = 8  # GPUs per node (a100-80gb x 8, one node): N = g = 8
PART = -(-P // G)  # ⌈P/N⌉ = 1_003_782_656 (P divides by 8)
EMBED = V * H  # 525_336_576: the embedding (and the untied lm_head), the largest module
LAYER = 2 * H * Q + 2 * H * KV + 3 * H * F + 2 * H  # 218_112_000 parameters per layer
S = 1024  # sequence length of the spec below
W = 2  # bf16


def _spec(model: str = "llama-3.1-8b") -> Spec:
    text = (
        f"model: {{preset: {model}}}\n"
        "hardware: {gpu: a100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}\n"
        f"training: {{sequence_length: {S}, global_batch_size: 256}}\n"
    )
    return load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)


def _plan(
    stage: int,
    precision: str = "bf16",
    *,
    opt: str = "none",
    param: str = "none",
    checkpointing: str = "none",
    micro: int = 1,
    knobs: ZeroKnobs = ZeroKnobs(),  # noqa: B008 - frozen, so sharing the default is safe
) -> Plan:
    return Plan(
        precision=precision,
        zero_stage=stage,
        offload_optimizer=opt,
        offload_param=param,
        checkpointing=checkpointing,
        micro_batch_size=micro,
        gradient_accumulation_steps=1,
        data_parallel_size=G,
        knobs=knobs,
    )


def test_shared_inputs_and_documented_constants() -> None:
    shape = get_model("llama-3.1-8b")
    assert shape.parameter_count() == P == 2 * EMBED + L * LAYER + H
    assert PART == 1_003_782_656 and LAYER == 218_112_000
    assert shape.largest_module_parameters() == EMBED
    assert ODD.parameter_count() == 132
    # docs/memory-model.md, "overhead" and "Host RAM": context 0.75 GiB, communication library
    # 0.5 GiB, 5 % allocator slack, 3 GiB of host memory per rank
    assert GIB == 1_073_741_824
    assert CUDA_CONTEXT_BYTES == 805_306_368  # 0.75 * 2**30
    assert COMM_LIBRARY_BYTES == 536_870_912  # 0.5 * 2**30
    assert ALLOCATOR_SLACK == 0.05
    assert HOST_BYTES_PER_RANK == 3_221_225_472  # 3 * 2**30


# ---- 1. buffers --------------------------------------------------------------------------------
# Default knobs: reduce_bucket_size 5e8, prefetch_bucket_size 5e7, max_live_parameters 1e9.
@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        # ZeRO-0: no ZeRO buffers
        (_plan(0), 0),
        # ZeRO-1/2 without overlap_comm: one reduce bucket, w * 5e8 = 1_000_000_000
        (_plan(2), 2 * 500_000_000),
        (_plan(1), 2 * 500_000_000),
        # ... with overlap_comm the bucket is doubled: 2 * 2 * 5e8 = 2_000_000_000
        (_plan(2, knobs=ZeroKnobs(overlap_comm=True)), 2 * 2 * 500_000_000),
        (_plan(1, knobs=ZeroKnobs(overlap_comm=True)), 2 * 2 * 500_000_000),
        # fp32 ZeRO-2 with overlap: 2 copies * 4 bytes * 5e8 = 4_000_000_000
        (_plan(2, "fp32", knobs=ZeroKnobs(overlap_comm=True)), 2 * 4 * 500_000_000),
        # ZeRO-3: one reduce bucket (not doubled, even with overlap_comm) + gathered parameters
        # w * max(largest module 525_336_576, min(1e9, layer 218_112_000 + 5e7 = 268_112_000))
        # = 1e9 + 2 * 525_336_576 = 2_050_673_152
        (_plan(3), 2 * 500_000_000 + 2 * EMBED),
        (_plan(3, knobs=ZeroKnobs(overlap_comm=True)), 2 * 500_000_000 + 2 * EMBED),
        # a 5e8 prefetch bucket makes the live set the larger: layer + 5e8 = 718_112_000
        # -> 1e9 + 2 * 718_112_000 = 2_436_224_000
        (_plan(3, knobs=ZeroKnobs(prefetch_bucket_size=500_000_000)), 2 * 500_000_000 + 2 * 718_112_000),
        # ... capped by max_live_parameters 6e8: 1e9 + 2 * 6e8 = 2_200_000_000
        (
            _plan(3, knobs=ZeroKnobs(prefetch_bucket_size=500_000_000, max_live_parameters=600_000_000)),
            2 * 500_000_000 + 2 * 600_000_000,
        ),
        # ZeRO++ hpZ within the node (8): + w * ⌈P/8⌉ = 2 * 1_003_782_656
        (_plan(3, knobs=ZeroKnobs(hpz_partition_size=8)), 2 * 500_000_000 + 2 * EMBED + 2 * PART),
    ],
    ids=[
        "zero0",
        "zero2",
        "zero1",
        "zero2-overlap",
        "zero1-overlap",
        "zero2-fp32-overlap",
        "zero3",
        "zero3-overlap",
        "zero3-prefetch",
        "zero3-max-live",
        "zero3-hpz",
    ],
)
def test_llama_8b_buffers(plan: Plan, expected: int) -> None:
    spec = _spec()
    assert buffer_bytes(spec.model, plan) == expected
    assert estimate_memory(spec.model, plan, spec.hardware, spec.training).gpu.buffers == expected


def test_llama_8b_buffer_worked_values() -> None:
    shape = get_model("llama-3.1-8b")
    assert buffer_bytes(shape, _plan(2)) == 1_000_000_000
    assert buffer_bytes(shape, _plan(2, knobs=ZeroKnobs(overlap_comm=True))) == 2_000_000_000
    assert buffer_bytes(shape, _plan(3)) == 2_050_673_152
    assert buffer_bytes(shape, _plan(3, knobs=ZeroKnobs(prefetch_bucket_size=500_000_000))) == 2_436_224_000


def test_reduce_bucket_is_allocated_whole_for_a_small_model() -> None:
    """The odd model has 132 parameters, far fewer than the 5e8-element bucket, and DeepSpeed still
    allocates all of it (bench/model_state_accuracy.py measures 2 x 1e7 x 2 B of ZeRO-2 buckets for
    a 5M-parameter model): the installed DeepSpeed sizes the buffer by the knob alone."""
    import inspect

    assert buffer_bytes(ODD, _plan(2)) == 2 * 500_000_000
    assert buffer_bytes(ODD, _plan(2, knobs=ZeroKnobs(overlap_comm=True))) == 2 * 2 * 500_000_000
    stage_1_and_2 = require_module("deepspeed.runtime.zero.stage_1_and_2")
    setup = inspect.getsource(stage_1_and_2.DeepSpeedZeroOptimizer.setup_buckets)
    assert "torch.empty(int(self.reduce_bucket_size)" in setup


# ---- 2. transient --------------------------------------------------------------------------------
# Loss backward: b·s·V·(w + 8) - the 16-bit logits plus two fp32 tensors of the same shape.
@pytest.mark.parametrize(
    ("precision", "micro", "expected"),
    [
        # 1 * 1024 * 128256 * (2 + 8) = 1_313_341_440
        ("bf16", 1, 1 * S * V * (2 + 8)),
        # 2 * 1024 * 128256 * 10 = 2_626_682_880
        ("bf16", 2, 2 * S * V * (2 + 8)),
        # fp32 logits: 1 * 1024 * 128256 * (4 + 8) = 1_576_009_728
        ("fp32", 1, 1 * S * V * (4 + 8)),
    ],
)
def test_llama_8b_transient_is_the_logits_term(precision: str, micro: int, expected: int) -> None:
    spec = _spec()
    assert expected in (1_313_341_440, 2_626_682_880, 1_576_009_728)
    plan = _plan(2, precision, micro=micro)
    assert estimate_memory(spec.model, plan, spec.hardware, spec.training).gpu.transient == expected


def test_llama_8b_full_checkpointing_keeps_the_larger_logits_term() -> None:
    # One rebuilt llama layer (flash, bf16) per token:
    #   2 RMSNorms 2 * (4h + 4 + 2h + 2h) = 2 * 32_772 = 65_544
    #   attention 2q + 2*2kv + 2q + 4nh = 8_192 + 4_096 + 8_192 + 128 = 20_608
    #   MLP 4 * 2f = 114_688                               -> 200_840 bytes per token
    # s = 1024: 205_660_160 < the logits' 1_313_341_440, so the transient stays the logits.
    rebuilt = S * (2 * (4 * H + 4 + 2 * W * H) + (W * Q + 2 * W * KV + W * Q + 4 * NH) + 4 * W * F)
    assert rebuilt == 205_660_160
    spec = _spec()
    gpu = estimate_memory(spec.model, _plan(2, checkpointing="full"), spec.hardware, spec.training).gpu
    assert gpu.transient == S * V * (2 + 8) == 1_313_341_440


def test_odd_model_full_checkpointing_transient_is_the_rebuilt_layer_and_its_gradients() -> None:
    # odd model, bf16, flash, b = 1, s = 1024. Logits: 1024 * 7 * (2 + 8) = 71_680.
    # One rebuilt layer per token: 2 RMSNorms 2 * (4*3 + 4 + 2*3 + 2*3) = 56, attention
    # 2*3 + 2*2*3 + 2*3 + 4*1 = 28, MLP 4 * 2 * 5 = 40, and its recomputed output, which the
    # reentrant checkpoint holds, 2*3 -> 130.
    # Its backward's gradients per token, the largest phase: MLP first, the residual gradient
    # 2*3 + down_proj's input gradient and the SiLU*up product's 2 * 2*5 = 26; the norm's
    # backward (2*3 + 5*4*3 - 2*2*3 - 4 = 50, less the MLP's 40 freed) 10; attention (46 of
    # gradients, less the 40 + 28 of MLP and norm tensors freed by then) negative.
    # (130 + 26) * 1024 = 159_744 > 71_680.
    logits = S * 7 * (2 + 8)
    rebuilt = S * (2 * (4 * 3 + 4 + 2 * 3 + 2 * 3) + (2 * 3 + 2 * 2 * 3 + 2 * 3 + 4 * 1) + 4 * 2 * 5 + 2 * 3)
    backward = S * (2 * 3 + 2 * 2 * 5)
    assert (logits, rebuilt, backward) == (71_680, 133_120, 26_624)
    spec = _spec()
    full = estimate_memory(ODD, _plan(2, checkpointing="full"), spec.hardware, spec.training).gpu
    assert full.transient == rebuilt + backward
    # without checkpointing nothing is rebuilt, and the backward's gradients stay below the logits
    none = estimate_memory(ODD, _plan(2), spec.hardware, spec.training).gpu
    assert none.transient == logits


# ---- 3. overhead -----------------------------------------------------------------------------------
def test_llama_8b_overhead_is_fixed_plus_slack_of_dynamic() -> None:
    # ZeRO-2 bf16, b = 1, s = 1024, flash, no checkpointing.
    # activations: layers 32 * 1024 * 200_840 = 6_581_125_120; outside the layers, per token the
    # int64 ids and labels 16 + final RMSNorm (4h + 4 + 2h + 2h = 32_772) + fp32 log-softmax
    # 4V = 513_024 -> 545_812 * 1024 = 558_911_488, plus rotary cos/sin 2 * 2 * 128 * 1024 = 524_288
    # -> 7_140_560_896
    per_layer_token = 2 * (4 * H + 4 + 2 * W * H) + (W * Q + 2 * W * KV + W * Q + 4 * NH) + 4 * W * F
    acts = L * S * per_layer_token + S * (16 + 4 * H + 4 + 2 * W * H + 4 * V) + S * 2 * W * 128
    assert acts == 7_140_560_896
    buffers = 2 * 500_000_000  # one 5e8 reduce bucket, no overlap
    transient = S * V * (2 + 8)  # 1_313_341_440
    dynamic = acts + buffers + transient  # 9_453_902_336
    assert dynamic == 9_453_902_336
    # fixed 0.75 GiB + 0.5 GiB = 805_306_368 + 536_870_912 = 1_342_177_280;
    # slack int(0.05 * 9_453_902_336) = 472_695_116 -> 1_814_872_396
    fixed = CUDA_CONTEXT_BYTES + COMM_LIBRARY_BYTES
    assert fixed == 1_342_177_280
    spec = _spec()
    gpu = estimate_memory(spec.model, _plan(2), spec.hardware, spec.training).gpu
    assert (gpu.activations, gpu.buffers, gpu.transient) == (acts, buffers, transient)
    assert gpu.overhead == fixed + dynamic * 5 // 100 == 1_814_872_396
    # the optimizer step keeps the fixed allowances only
    assert gpu.step_overhead == fixed


# ---- 4. host RAM per node ------------------------------------------------------------------------
def _host(spec: Spec, plan: Plan) -> tuple[int, int]:
    """(start-up, offloaded states) host bytes per node."""
    states = model_states(spec.model, plan, "adamw")
    startup = startup_host_bytes(states, plan, spec.hardware, spec.training.deepspeed_version)
    return startup, offloaded_host_bytes(states, plan, spec.hardware, spec.training.deepspeed_version)


def test_llama_8b_host_without_offload() -> None:
    spec = _spec()
    # ZeRO-2 bf16: process 8 * 3 GiB = 25_769_803_776; loading every rank's 16-bit model
    # 8 * 2 * P = 128_484_179_968; nothing offloaded -> 154_253_983_744
    process = G * 3 * GIB
    loading = G * W * P
    assert (process, loading) == (25_769_803_776, 128_484_179_968)
    assert _host(spec, _plan(2)) == (process + loading, 0)
    cpu = estimate_memory(spec.model, _plan(2), spec.hardware, spec.training).cpu
    assert (cpu.total, cpu.process, cpu.offloaded_states) == (154_253_983_744, process, 0)
    # ZeRO-3 (zero.Init): no loading copy, only the processes
    assert _host(spec, _plan(3)) == (process, 0)


# Pinned host blocks are rounded up to powers of two (CachingHostAllocator), per rank:
# the bf16 flat parameter buffer 2 * 1_003_782_656 = 2_007_565_312 -> 2^31: + 139_918_336; and the
# per-parameter pinned partitions, cached after the copy into the flat buffer (bytes 2 * n / 8):
# embedding and lm_head 131_334_144 -> 2^27 each; per layer q, o 4_194_304 (= 2^22), k, v
# 1_048_576 (= 2^20), gate, up, down 14_680_064 -> 2^24, two norms 1_024: 60_819_456 per layer;
# 2 * 134_217_728 + 32 * 60_819_456 + 1_024 (final norm) = 2_214_659_072.
PINNED_PARAMS = 139_918_336 + 2_214_659_072
# optimizer offload: the bf16 gradient flat buffer (+ 139_918_336 as above) and one fp32 sub-group
# gradient of the whole partition (sub_group_size 1e9 is reached only at the last tensor):
# 4 * 1_003_782_656 = 4_015_130_624 -> 2^32: + 279_836_672.
PINNED_OPTIMIZER = 139_918_336 + 279_836_672


@pytest.mark.parametrize(
    ("opt", "offloaded"),
    [
        # parameter offload alone: 8 ranks * (2 bytes * ⌈P/8⌉ + PINNED_PARAMS) = 34_897_141_760
        ("none", G * (W * PART + PINNED_PARAMS)),
        # + CPU AdamW offload at ZeRO-3: (4 master + 8 moments + 4 fp32 grads + 2 bf16 grads) * ⌈P/8⌉
        # + PINNED_OPTIMIZER per rank: 8 * ((18 + 2) * 1_003_782_656 + 2_774_332_416) = 182_799_884_288
        ("cpu", G * ((18 + 2) * PART + PINNED_PARAMS + PINNED_OPTIMIZER)),
    ],
)
def test_llama_8b_host_with_cpu_parameter_offload_at_zero3(opt: str, offloaded: int) -> None:
    spec = _spec()
    plan = _plan(3, opt=opt, param="cpu")
    process = G * 3 * GIB  # 25_769_803_776
    # ZeRO-3 loads with zero.Init (no full copy): start-up is the processes alone
    assert _host(spec, plan) == (process, offloaded)
    cpu = estimate_memory(spec.model, plan, spec.hardware, spec.training).cpu
    assert cpu.offloaded_states == offloaded
    # a checkpoint save: with the optimizer on the GPU each rank's torch.save copies its fp32
    # sub-group (the whole partition, one storage) to the host, 8 * 4 * 1_003_782_656 =
    # 32_121_044_992; an offloaded optimizer's states are host tensors already, copied by nobody
    engine = G * 4 * PART if opt == "none" else 0
    assert cpu.checkpoint_save.engine == engine
    assert cpu.total == process + offloaded + engine
    assert offloaded in (34_897_141_760, 182_799_884_288)


# ---- 5. NVMe optimizer offload -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("param", "optimizer", "expected"),
    [
        # 8 ranks * (4 fp32 master + 8 AdamW moments) * ⌈P/8⌉ = 96_363_134_976
        ("none", "adamw", G * (4 + 8) * PART),
        # SGD's one fp32 momentum: 8 * (4 + 4) * ⌈P/8⌉ = 64_242_089_984
        ("none", "sgd", G * (4 + 4) * PART),
        # + NVMe parameter offload: 8 * 2 * ⌈P/8⌉ more -> 8 * 14 * ⌈P/8⌉ = 112_423_657_472
        ("nvme", "adamw", G * (4 + 8 + 2) * PART),
    ],
)
def test_llama_8b_nvme_bytes_at_zero3(param: str, optimizer: str, expected: int) -> None:
    spec = _spec()
    assert expected in (96_363_134_976, 64_242_089_984, 112_423_657_472)
    plan = _plan(3, opt="nvme", param=param)
    assert nvme_bytes(model_states(spec.model, plan, optimizer), spec.hardware) == expected


def test_llama_8b_nvme_optimizer_offload_host_swap_buffers() -> None:
    spec = _spec()
    plan = _plan(3, opt="nvme")
    # per rank (stage3.py, 0.19.8): the bf16 gradient partitions 2 * ⌈P/8⌉ on the host, one fp32
    # gradient buffer of the largest sub-group, and 4 pinned fp32 swap buffers of the largest
    # sub-group (SwapBufferManager); the fp32 gradients are swapped out to NVMe. With
    # sub_group_size 1e9 the partition, 1_003_782_656 elements, reaches 1e9 only at its last
    # tensor, so it is one sub-group: 22 * 1_003_782_656 = 22_083_218_432; * 8 = 176_665_747_456
    largest = PART
    offloaded = G * (2 * PART + 4 * largest + 4 * 4 * largest)
    assert offloaded == 176_665_747_456
    assert _host(spec, plan) == (G * 3 * GIB, offloaded)
    memory = estimate_memory(spec.model, plan, spec.hardware, spec.training)
    # the optimizer lives on NVMe and the module is partitioned: a save copies nothing more
    assert memory.cpu.total == G * 3 * GIB + offloaded
    assert memory.nvme.total == G * (4 + 8) * PART == 96_363_134_976
    assert memory.cpu.offloaded_states == offloaded


def test_llama_8b_host_loading_copy_and_offload_do_not_add_up() -> None:
    spec = _spec()
    plan = _plan(2, opt="cpu")
    # ZeRO-2 CPU AdamW offload, per rank: (4 master + 8 moments + 4 fp32 grads + 2 bf16 slice) * S
    # + the bf16 largest-tensor staging buffer 2 * EMBED = 18_068_087_808 + 1_050_673_152
    # = 19_118_760_960; * 8 = 152_950_087_680 > the loading copy 8 * 2 * P = 128_484_179_968.
    tensors = G * (18 * PART + 2 * EMBED)
    assert tensors == 152_950_087_680
    # pinned (pin_memory true, 0.19.8), each block rounded up to a power of two, per rank: the fp32
    # master and the fp32 gradient, 4 * S = 4_015_130_624 -> 2^32: + 279_836_672 each; the bf16
    # staging slice 2 * S = 2_007_565_312 -> 2^31: + 139_918_336; the largest-tensor gradient
    # buffer 2 * EMBED = 1_050_673_152 -> 2^30: + 23_068_672. 722_660_352 per rank, * 8:
    rounding = G * (2 * 279_836_672 + 139_918_336 + 23_068_672)
    assert rounding == 5_781_282_816
    offloaded = tensors + rounding
    # start-up = process + loading; training = process + offloaded = 25_769_803_776 +
    # 158_731_370_496 = 184_501_174_272: the loading copies are gone by then, they do not add up
    assert _host(spec, plan) == (G * 3 * GIB + G * W * P, offloaded)
    # a checkpoint save: rank 0 writes the module, whose bf16 parameters are views of one flat
    # buffer on the GPU, copied to the host whole, 2 * P = 16_060_522_496 (the offloaded fp32
    # partitions are host tensors already): 184_501_174_272 + 16_060_522_496 = 200_561_696_768
    cpu = estimate_memory(spec.model, plan, spec.hardware, spec.training).cpu
    assert (cpu.training, cpu.checkpoint_save.engine) == (184_501_174_272, W * P)
    assert cpu.total == G * 3 * GIB + offloaded + W * P == 200_561_696_768


def test_zero12_offload_host_by_release() -> None:
    """The same ZeRO-2 plan on the releases dsgen prices (stage_1_and_2.py at each tag)."""
    spec = _spec()
    states = model_states(spec.model, _plan(2, opt="cpu"), "adamw")
    tensors = 18 * PART + 2 * EMBED  # per rank, as 0.19.8 allocates them (above)
    per_rank = {}
    for release in ("0.14.5", "0.16.9", "0.19.8"):
        for pin in (False, True):
            plan = _plan(2, opt="cpu", knobs=ZeroKnobs(pin_optimizer_offload=pin))
            per_rank[release, pin] = offloaded_host_bytes(states, plan, spec.hardware, release) // G
    # 0.19.8 pins only what pin_memory asks for: unpinned, the tensors themselves
    assert per_rank["0.19.8", False] == tensors
    assert per_rank["0.19.8", True] == tensors + 722_660_352
    # before 0.17.0 there is no bf16 staging slice on the host (2 * S less), and before 0.18.3
    # the fp32 master is pinned whatever the config says (+ 279_836_672 rounding even unpinned);
    # pinned, the gradient and the largest-tensor buffer round too (+ 279_836_672 + 23_068_672)
    for release in ("0.14.5", "0.16.9"):
        assert per_rank[release, False] == tensors - 2 * PART + 279_836_672
        assert per_rank[release, True] == tensors - 2 * PART + 2 * 279_836_672 + 23_068_672


def test_pinned_blocks_round_up_to_powers_of_two() -> None:
    # CachingHostAllocator: c10::llvm::PowerOf2Ceil(size) below pinned_max_round_threshold (SIZE_MAX)

    assert [pinned(n) for n in (0, 1, 3, 4, 1_000, 2**31, 2**31 + 1)] == [0, 1, 4, 4, 1_024, 2**31, 2**32]
