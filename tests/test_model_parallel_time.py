"""AutoTP and AutoEP in the step-time model, pinned by hand (docs/throughput-model.md, "Model parallelism").

Every expected value is counted here from first principles: collectives per micro-step (DeepSpeed
0.19.8 ``module_inject/layers.py``: two ``RowParallel`` all-reduces per layer in forward, one
``ColumnParallel`` all-reduce per q/k/v/gate/up in backward; ``auto_ep_layer.py``: a dispatch and a
combine ``_AllToAllV`` per MoE layer, each reversed in backward) times the bytes one GPU sends in a
ring (``2·(n−1)/n`` of an all-reduce, ``(n−1)/n`` of an all-gather or all-to-all) over the link,
70 % of it (``COLLECTIVE_EFFICIENCY``), plus 30 µs per collective within a node and 100 µs across
(``COLLECTIVE_LATENCY_S``). Toy shapes keep the arithmetic checkable: their parameter counts are
counted by hand below and pinned against ``ModelShape``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsgen.api import load_spec
from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.model_parallel_time import expert_parallel_s, tensor_parallel_s
from dsgen.estimate.throughput import (
    COLLECTIVE_EFFICIENCY,
    COLLECTIVE_LATENCY_S,
    CPU_OFFLOAD_MEASURED_FACTOR,
    PCIE_EFFICIENCY,
    communication_s,
    estimate_step_time,
    offload_s,
)
from dsgen.plan import ModelParallel, Plan, ZeroKnobs
from dsgen.spec.types import Hardware, Training
from dsgen.vocabulary import Checkpointing, OffloadDevice
from tests.conftest import EXAMPLES_DIR

EXAMPLE = EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml"  # H100 80GB: NVLink 450 GB/s, 25 GB/s between nodes
SEQ = 256
INTRA_S, INTER_S = 30e-6, 100e-6  # documented launch latency per collective
BF16 = 2

# A llama layer small enough to count by hand: q 4 x 16 = 64 wide, k and v 2 x 16 = 32, MLP 128.
TOY = ModelShape(
    name="toy-llama",
    family="llama",
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=1000,
)
# attention 64·64 + 2·64·32 + 64·64 = 12,288; MLP 3·64·128 = 24,576; two RMSNorms 128: 36,992 a layer
TOY_PARAMETERS = 2 * 36_992 + 1000 * 64 + 1000 * 64 + 64  # layers, embedding, untied head, final norm
# AutoTP 2: a layer's projections halve (18,432 + 128 norms); embedding whole; head 500 vocabulary rows
TOY_TP2_RANK = 2 * (12_288 // 2 + 24_576 // 2 + 128) + 1000 * 64 + 500 * 64 + 64

# An MoE layer: the same attention, a router over 8 experts of width 32 (gated), 2 experts per token.
TOY_MOE = replace(TOY, name="toy-moe", family="qwen3_moe", num_experts=8, experts_per_token=2, moe_intermediate_size=32)
TOY_MOE_EXPERTS = 2 * 8 * 3 * 64 * 32  # layers x experts x (gate, up, down) x hidden x width
TOY_MOE_PARAMETERS = 2 * (12_288 + 64 * 8 + 128) + TOY_MOE_EXPERTS + 1000 * 64 + 1000 * 64 + 64
TOY_MOE_DENSE = TOY_MOE_PARAMETERS - TOY_MOE_EXPERTS


def _setting(gpus_per_node: int = 8, nodes: int = 1) -> tuple[Hardware, Training]:
    spec = load_spec(EXAMPLE)
    hardware = replace(spec.hardware, gpus_per_node=gpus_per_node, nodes=nodes)
    return hardware, replace(spec.training, sequence_length=SEQ)


def _plan(
    world: int,
    *,
    tp: int = 1,
    ep: int = 1,
    stage: int = 1,
    micro: int = 2,
    accum: int = 1,
    checkpointing: Checkpointing = "none",
    offload: OffloadDevice = "none",
    model_parallel: bool = True,
) -> Plan:
    plan = Plan(
        precision="bf16",
        zero_stage=stage,
        offload_optimizer=offload,
        offload_param="none",
        checkpointing=checkpointing,
        micro_batch_size=micro,
        gradient_accumulation_steps=accum,
        data_parallel_size=world,
        knobs=ZeroKnobs(),
    )
    return replace(plan, model_parallel=ModelParallel(tp, ep)) if model_parallel else plan


def _link(hardware: Hardware, gbps: float | None = None) -> float:
    return (gbps or hardware.gpu.interconnect_bandwidth_gbps) * 1e9 * 0.70


def _tp(shape: ModelShape, plan: Plan, hardware: Hardware, training: Training) -> float:
    return tensor_parallel_s(shape, plan, hardware, training, COLLECTIVE_EFFICIENCY, COLLECTIVE_LATENCY_S)


def _ep(shape: ModelShape, plan: Plan, hardware: Hardware, training: Training) -> float:
    return expert_parallel_s(shape, plan, hardware, training, COLLECTIVE_EFFICIENCY, COLLECTIVE_LATENCY_S)


def test_the_toy_shapes_are_counted_right() -> None:
    assert TOY.parameter_count() == TOY_PARAMETERS == 202_048
    assert TOY_MOE.parameter_count() == TOY_MOE_PARAMETERS == 252_224
    assert TOY_TP2_RANK == 133_184


# ---- AutoTP ---------------------------------------------------------------------------------------
ACTIVATION = 2 * SEQ * 64 * BF16  # one [micro 2, seq, hidden] tensor in bf16: 65,536 bytes


def test_tp2_untied_head_communication_by_hand() -> None:
    """Per micro-step: 2 layers x (2 forward + 5 backward) all-reduces, the head's backward
    all-reduce, and the logit all-gather (receive the other rank's [2, 256, 500] shard)."""
    hardware, training = _setting()
    all_reduce = 2 * (2 - 1) / 2 * ACTIVATION  # ring: 2(n-1)/n of the tensor
    gather = (2 - 1) * 2 * SEQ * 500 * BF16
    per_micro = (2 * 7 + 1) * all_reduce + gather
    expected = 3 * (per_micro / _link(hardware) + 16 * INTRA_S)  # 3 micro-steps, 16 collectives each
    assert per_micro == 1_495_040
    assert _tp(TOY, _plan(8, tp=2, accum=3), hardware, training) == pytest.approx(expected, rel=1e-12)


def test_tp2_tied_head_all_reduces_the_embedding_and_the_loss() -> None:
    """A tied head is vocabulary-parallel: no logit gather; the embedding's forward all-reduce,
    the head's backward all-reduce and three fp32 [micro, seq] all-reduces in the loss."""
    hardware, training = _setting()
    tied = replace(TOY, tie_word_embeddings=True)
    loss = 3 * (2 * (2 - 1) / 2) * (2 * SEQ * 4)
    per_micro = (2 * 7 + 2) * ACTIVATION + loss
    expected = per_micro / _link(hardware) + (14 + 2 + 3) * INTRA_S
    assert _tp(tied, _plan(8, tp=2), hardware, training) == pytest.approx(expected, rel=1e-12)


def test_tp_whole_layer_checkpointing_repeats_the_forward_all_reduces() -> None:
    hardware, training = _setting()
    plain = _tp(TOY, _plan(8, tp=2), hardware, training)
    recomputed = _tp(TOY, _plan(8, tp=2, checkpointing="full"), hardware, training)
    again = 2 * 2 * (ACTIVATION / _link(hardware) + INTRA_S)  # 2 layers x (o_proj, down_proj)
    assert recomputed - plain == pytest.approx(again, rel=1e-9)
    selective = _tp(TOY, _plan(8, tp=2, checkpointing="selective"), hardware, training)
    assert selective == plain  # the attention core launches no collective


def test_tp4_ring_share_and_vocabulary_shards() -> None:
    hardware, training = _setting()
    wide = replace(TOY, num_attention_heads=8, num_key_value_heads=4, head_dim=8)
    all_reduce = 2 * 3 / 4 * ACTIVATION
    gather = 3 * 2 * SEQ * 250 * BF16  # the three other ranks' 250 vocabulary rows
    expected = (15 * all_reduce + gather) / _link(hardware) + 16 * INTRA_S
    assert _tp(wide, _plan(8, tp=4), hardware, training) == pytest.approx(expected, rel=1e-12)


def test_more_tp_more_tp_communication() -> None:
    hardware, training = _setting()
    wide = replace(TOY, num_attention_heads=8, num_key_value_heads=8, head_dim=8)
    times = [_tp(wide, _plan(8, tp=tp), hardware, training) for tp in (1, 2, 4, 8)]
    assert times[0] == 0.0
    assert times == sorted(times) and len(set(times)) == 4


def test_tp_plan_exposes_zero_on_the_rank_shard_and_tp_all_reduces() -> None:
    """World 4, AutoTP 2, ZeRO-1: ZeRO all-reduces the rank's 133,184 TP-local elements over the
    data-parallel group of 4 / 2 = 2 ranks (one bucket: 2 launches), and the TP collectives add."""
    hardware, training = _setting(gpus_per_node=4)
    link = _link(hardware)
    zero = 2 * BF16 * TOY_TP2_RANK * (2 - 1) / 2 / link + 2 * INTRA_S
    tp = 2 * ((15 * ACTIVATION + 2 * SEQ * 500 * BF16) / link + 16 * INTRA_S)
    step = estimate_step_time(TOY, _plan(4, tp=2, accum=2), hardware, training)
    assert step.exposed_comm_s == pytest.approx(zero + tp, rel=1e-12)


def test_tp_zero3_gathers_and_reduces_the_rank_shard() -> None:
    hardware, _ = _setting(gpus_per_node=4)
    plan = replace(_plan(4, tp=2, stage=3, accum=2), knobs=ZeroKnobs(overlap_comm=True))
    per_micro = 3 * BF16 * TOY_TP2_RANK * (2 - 1) / 2 / _link(hardware)  # forward and backward gathers, reduce
    assert communication_s(TOY, plan, hardware) == pytest.approx((2 * per_micro, 0.0), rel=1e-12)


def test_tp_world_equal_to_degree_has_no_zero_traffic() -> None:
    """World 2 = AutoTP 2: the data-parallel group is one rank, so only the TP collectives remain."""
    hardware, training = _setting(gpus_per_node=2)
    expected = (15 * ACTIVATION + 2 * SEQ * 500 * BF16) / _link(hardware) + 16 * INTRA_S
    step = estimate_step_time(TOY, _plan(2, tp=2), hardware, training)
    assert step.exposed_comm_s == pytest.approx(expected, rel=1e-12)


def test_tp_offload_moves_the_rank_partition() -> None:
    """CPU optimizer offload under AutoTP: the partition is the TP-local shard / the DP group."""
    hardware, training = _setting(gpus_per_node=4)
    plan = _plan(4, tp=2, stage=2, accum=2, offload="cpu")
    partition = TOY_TP2_RANK / 2
    transfers = 2 * BF16 * partition + BF16 * partition  # gradients down per micro-step, params up
    pcie = hardware.gpu.pcie_bandwidth_gbps * 1e9 * PCIE_EFFICIENCY
    update = partition * 4 / (hardware.cpu_optimizer_gparams_per_s * 1e9)
    expected = (transfers / pcie + update) * CPU_OFFLOAD_MEASURED_FACTOR
    assert offload_s(TOY, plan, hardware, training) == pytest.approx(expected, rel=1e-12)


# ---- compute under AutoTP -------------------------------------------------------------------------
LLAMA_8B_FLOPS_PER_TOKEN = 51_471_998_976  # tests/test_throughput_terms.py: 6N + 12·L·q·s at 4,096


def test_tp_divides_a_rank_compute_and_keeps_the_step_compute() -> None:
    """Llama-3.1-8B, 8 x H100, 256 sequences of 4,096: under AutoTP 2 the 4 TP groups each run
    64 micro-batches of 1, every rank with half the FLOPs of each: the same seconds as 8 ranks
    running 32 each, and a rank's seconds are its own micro-batches' FLOPs / 2."""
    spec = load_spec(EXAMPLE)
    plain = _plan(8, micro=1, accum=32, model_parallel=False)
    tp2 = _plan(8, tp=2, micro=1, accum=64)
    assert plain.global_batch_size == tp2.global_batch_size == 256
    rate = spec.hardware.gpu.peak_tflops("bf16") * 1e12 * 0.40 * 4_096 / (4_096 + 256)
    per_rank = 1 * 64 * 4_096 * LLAMA_8B_FLOPS_PER_TOKEN / 2 / rate
    whole = LLAMA_8B_FLOPS_PER_TOKEN * 256 * 4_096 / (8 * rate)
    one = estimate_step_time(spec.model, plain, spec.hardware, spec.training).compute_s
    two = estimate_step_time(spec.model, tp2, spec.hardware, spec.training).compute_s
    assert two == pytest.approx(per_rank, rel=1e-12)
    assert two == pytest.approx(whole, rel=1e-12)
    assert two == pytest.approx(one, rel=1e-12)


# ---- AutoEP ---------------------------------------------------------------------------------------
ROUTED = 2 * SEQ * 2 * 64 * BF16  # micro 2 x seq x top-2 copies x hidden, bf16: 131,072 bytes


def test_ep4_all_to_alls_by_hand() -> None:
    """Per MoE layer and micro-step: dispatch + combine in forward, both again in backward, each
    sending 3/4 of the routed copies off-rank; one count exchange per forward (launch only)."""
    hardware, training = _setting()
    sent = 2 * 4 * ROUTED * 3 / 4  # 2 MoE layers x 4 all-to-alls
    expected = 2 * (sent / _link(hardware) + 2 * 5 * INTRA_S)
    assert _ep(TOY_MOE, _plan(8, ep=4, accum=2), hardware, training) == pytest.approx(expected, rel=1e-12)


def test_ep_whole_layer_checkpointing_repeats_the_forward_all_to_alls() -> None:
    hardware, training = _setting()
    sent = 2 * 6 * ROUTED * 3 / 4
    expected = sent / _link(hardware) + 2 * (6 + 2) * INTRA_S
    plan = _plan(8, ep=4, checkpointing="full")
    assert _ep(TOY_MOE, plan, hardware, training) == pytest.approx(expected, rel=1e-12)


def test_ep_across_nodes_uses_the_fabric_and_is_slower() -> None:
    within, training = _setting(gpus_per_node=8)
    across, _ = _setting(gpus_per_node=2, nodes=4)
    plan = _plan(8, ep=4)
    sent = 2 * 4 * ROUTED * 3 / 4
    expected = sent / _link(across, across.inter_node_bandwidth_gbps) + 2 * 5 * INTER_S
    assert _ep(TOY_MOE, plan, across, training) == pytest.approx(expected, rel=1e-12)
    assert _ep(TOY_MOE, plan, across, training) > _ep(TOY_MOE, plan, within, training)


def test_more_ep_sends_more_off_rank() -> None:
    hardware, training = _setting()
    times = [_ep(TOY_MOE, _plan(8, ep=ep), hardware, training) for ep in (1, 2, 4, 8)]
    assert times[0] == 0.0
    assert times == sorted(times) and len(set(times)) == 4


def test_ep_plan_exposes_zero_over_dense_and_expert_groups() -> None:
    """World 8, AutoEP 4, ZeRO-1: the dense elements over all 8 ranks, the rank's 2 of 8 experts
    (a quarter of them) over the expert-data-parallel group of 8 / 4 = 2; one bucket per group."""
    hardware, training = _setting()
    link = _link(hardware)
    volume = TOY_MOE_DENSE * 7 / 8 + TOY_MOE_EXPERTS / 4 * 1 / 2
    zero = 2 * BF16 * volume / link + 2 * 2 * INTRA_S
    ep = 2 * 4 * ROUTED * 3 / 4 / link + 2 * 5 * INTRA_S
    step = estimate_step_time(TOY_MOE, _plan(8, ep=4), hardware, training)
    assert step.exposed_comm_s == pytest.approx(zero + ep, rel=1e-12)


def test_ep_equal_to_world_reduces_experts_nowhere() -> None:
    """World 4 = AutoEP 4: every rank holds its experts alone, so ZeRO moves only the dense part."""
    hardware, training = _setting(gpus_per_node=4)
    link = _link(hardware)
    zero = 2 * BF16 * TOY_MOE_DENSE * 3 / 4 / link + 2 * INTRA_S
    ep = 2 * 4 * ROUTED * 3 / 4 / link + 2 * 5 * INTRA_S
    step = estimate_step_time(TOY_MOE, _plan(4, ep=4), hardware, training)
    assert step.exposed_comm_s == pytest.approx(zero + ep, rel=1e-12)


def test_ep_keeps_the_compute() -> None:
    """Tokens go to where their experts live: a rank's expert FLOPs are the same on average."""
    hardware, training = _setting()
    plain = estimate_step_time(TOY_MOE, _plan(8, model_parallel=False), hardware, training)
    ep = estimate_step_time(TOY_MOE, _plan(8, ep=8), hardware, training)
    assert ep.compute_s == plain.compute_s and ep.model_flops == plain.model_flops


# ---- no model parallelism ---------------------------------------------------------------------------
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("shape", [TOY, TOY_MOE], ids=["dense", "moe"])
def test_degree_one_is_a_plan_without_model_parallelism(stage: int, shape: ModelShape) -> None:
    for hardware, training in (_setting(), _setting(gpus_per_node=2, nodes=4)):
        for checkpointing in ("none", "full"):
            explicit = _plan(8, stage=stage, checkpointing=checkpointing, accum=4)
            bare = _plan(8, stage=stage, checkpointing=checkpointing, accum=4, model_parallel=False)
            assert estimate_step_time(shape, explicit, hardware, training) == estimate_step_time(
                shape, bare, hardware, training
            )


def test_plain_zero1_exposed_communication_by_hand() -> None:
    """Without model parallelism ZeRO-1 still all-reduces every parameter over every GPU."""
    hardware, training = _setting()
    expected = 2 * BF16 * TOY_PARAMETERS * 7 / 8 / _link(hardware) + 2 * INTRA_S
    step = estimate_step_time(TOY, _plan(8, model_parallel=False), hardware, training)
    assert step.exposed_comm_s == pytest.approx(expected, rel=1e-12)
