"""Long context (issue 21): the four constraints, DeepSpeed's Ulysses rules, and the solver's answers
at lengths ALST has trained (Bekman et al., arXiv 2506.13996: Llama-3.1-8B at 500K tokens on one
H100, 3.7M on eight, 15M on 32)."""

from __future__ import annotations

import json

import pytest

from dsgen.api import load_spec, solve_spec
from dsgen.errors import DsgenError, ExitCode
from dsgen.estimate.memory import estimate_memory
from dsgen.intake.loader import load_spec_text
from dsgen.plan import LongContext
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR


def spec_text(seq: int = 131072, gpus: int = 8, extra: str = "", model: str = "llama-3.1-8b", batch: int = 8) -> str:
    return (
        f"model: {{preset: {model}}}\n"
        f"hardware: {{gpu: h100-80gb, gpus_per_node: {gpus}, cpu_memory_gib: 2048}}\n"
        f"training: {{sequence_length: {seq}, global_batch_size: {batch}}}\n"
        f"constraints: {{{extra}}}\n"
    )


def spec_of(**kwargs: object):
    return load_spec_text(spec_text(**kwargs), file="spec.yaml", base_dir=EXAMPLES_DIR)  # type: ignore[arg-type]


def test_constraints_default_to_auto_and_pin() -> None:
    spec = spec_of()
    c = spec.constraints
    assert (c.sequence_parallel_size, c.tiled_mlp, c.tiled_loss, c.checkpoint_offload) == (None, None, None, None)
    pinned = spec_of(extra="sequence_parallel_size: 4, tiled_mlp: true, tiled_loss: false, checkpoint_offload: false")
    c = pinned.constraints
    assert (c.sequence_parallel_size, c.tiled_mlp, c.tiled_loss, c.checkpoint_offload) == (4, True, False, False)


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ("sequence_parallel_size: 3", "constraints.sequence_parallel_size", "does not divide the 8 GPUs"),
        ("sequence_parallel_size: 0", "constraints.sequence_parallel_size", ""),
        ("checkpoint_offload: true, activation_checkpointing: false", "constraints.checkpoint_offload", "checkpoint"),
        ("tiled_mlp: maybe", "constraints.tiled_mlp", ""),
    ],
)
def test_bad_long_context_pins_name_the_field(extra: str, field: str, words: str) -> None:
    with pytest.raises(DsgenError) as caught:
        spec_of(extra=extra)
    assert caught.value.exit_code == ExitCode.BAD_INPUT
    assert field in caught.value.render()
    assert words in caught.value.render()


def test_deepspeed_ulysses_rules() -> None:
    """UlyssesSPAttentionHF.__init__ raises for query heads not divisible by SP and for kv heads
    that neither divide nor are divisible by it; register_with_transformers refuses eager;
    UlyssesSPDataLoaderAdapter refuses a sequence that does not split. Qwen2.5-7B has 28 query
    heads and 4 kv heads: SP 8 breaks the first rule (28 % 8), SP 2 and 4 are fine."""
    qwen = spec_of(model="qwen2.5-7b", gpus=8)
    from dsgen.search.long_context import sequence_parallel_degrees

    assert sequence_parallel_degrees(qwen, search=True) == (1, 2, 4)
    with pytest.raises(DsgenError, match="28 query heads"):
        spec_of(model="qwen2.5-7b", extra="sequence_parallel_size: 8")
    eager = load_spec_text(spec_text().replace("global_batch_size: 8", "global_batch_size: 8, attention: eager"))
    assert sequence_parallel_degrees(eager, search=True) == (1,)
    with pytest.raises(DsgenError, match="does not split"):
        spec_of(seq=131073, extra="sequence_parallel_size: 8")


def test_existing_plans_are_unchanged_when_they_fit() -> None:
    """The bundled 4K example fits without ALST, so no training-script change is asked for."""
    spec = load_spec(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")
    best = solve_spec(spec).best
    assert best is not None
    assert best.plan.long_context == LongContext()


def test_128k_on_eight_h100_fits_with_ulysses(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    """Issue 21's report: 131,072 tokens on 8 x H100 was "DOES NOT FIT"; ALST trains far longer there."""
    path = tmp_path / "spec.yaml"
    path.write_text(spec_text(seq=131072))
    result = run_cli(["solve", str(path), "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    plan = body["plan"]
    assert body["feasible"]
    sp = plan["sequence_parallel_size"]
    assert sp > 1 or plan["tiled_loss"]  # only ALST makes it fit
    assert plan["data_parallel_size"] == 8 // sp  # world / SP
    assert plan["global_batch_size"] == 8
    assert {"tiled_mlp", "tiled_loss", "checkpoint_offload"} <= plan.keys()


def test_global_batch_is_met_over_world_over_sp() -> None:
    spec = spec_of(seq=262144, batch=6, extra="sequence_parallel_size: 4")  # 8 GPUs / SP 4 = 2 data-parallel ranks
    best = solve_spec(spec).best
    assert best is not None
    p = best.plan
    assert p.batch_parallel_size == 2
    assert p.micro_batch_size * p.gradient_accumulation_steps * 2 == 6


def test_infeasible_long_sequence_names_the_resource() -> None:
    """16M tokens on one node: the plan that misses by least says what runs out."""
    result = solve_spec(spec_of(seq=1 << 24))
    assert not result.feasible
    assert result.closest is not None
    reason = result.closest.reason()
    assert "per GPU" in reason or "host RAM" in reason


def test_host_ram_is_what_runs_out_with_checkpoint_offload() -> None:
    """Checkpoint offload moves every layer input to the host: with little host RAM that is what fails."""
    text = spec_text(seq=1 << 21, extra="sequence_parallel_size: 8, checkpoint_offload: true").replace(
        "cpu_memory_gib: 2048", "cpu_memory_gib: 256"
    )
    result = solve_spec(load_spec_text(text))
    assert not result.feasible
    assert result.closest is not None
    assert "host RAM" in result.closest.reason()


def test_the_host_line_splits_offloaded_checkpoints_from_the_rest(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    """ALST's checkpoint offload keeps each layer's bf16 input, the rank's s/SP tokens x hidden, in
    host RAM: 1M tokens on SP 8 is 131,072 x 4,096 x 2 B = 1 GiB per layer, 32 GiB for Llama-3.1-8B's
    32 layers, 256 GiB per node of 8 ranks. solve names that share of the host apart from the rest."""
    path = tmp_path / "spec.yaml"
    path.write_text(spec_text(seq=1 << 20, extra="sequence_parallel_size: 8, checkpoint_offload: true"))
    result = run_cli(["solve", str(path), "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    cpu = json.loads(result.stdout)["memory"]["cpu"]
    assert cpu["checkpoints"] == 8 * 32 * (1 << 20) // 8 * 4096 * 2
    assert cpu["checkpoints"] <= cpu["total"]
    text = run_cli(["solve", str(path)], capsys).stdout
    assert "offloaded checkpoints 256.0 GiB" in text


def test_byte_counts_stay_exact_at_two_to_the_24() -> None:
    """Every term is a Python int: doubling the sequence (flash attention, SP 8, all tricks on)
    exactly doubles the per-rank activations of the layers, with no float rounding."""
    spec = spec_of(seq=1 << 23, extra="sequence_parallel_size: 8")
    result = solve_spec(spec)
    e = result.best or result.closest
    assert e is not None
    plan = e.plan
    small = estimate_memory(spec.model, plan, spec.hardware, spec.training)
    from dataclasses import replace

    big_training = replace(spec.training, sequence_length=1 << 24)
    big = estimate_memory(spec.model, plan, spec.hardware, big_training)
    for value in (small.gpu.activations, big.gpu.activations, big.gpu.total, big.cpu.total):
        assert type(value) is int
    assert big.gpu.activations == 2 * small.gpu.activations


def _ds_config(sp: int, micro: int = 1, accum: int = 1, world: int = 8) -> dict[str, object]:
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * world // sp,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
        "sequence_parallel_size": sp,
    }


def test_doctor_prices_a_ulysses_config_and_checks_deepspeeds_rules() -> None:
    """sequence_parallel_size in an existing config enters the memory model (s / sp tokens per
    rank) and the batch arithmetic; a degree DeepSpeed refuses is an error naming where it raises."""
    from dsgen.api import doctor

    spec = spec_of(seq=262144, extra="activation_checkpointing: true")
    sp8 = doctor(_ds_config(8), spec)
    sp1 = doctor(_ds_config(1), spec)
    assert not [f for f in sp8.findings if f.code in ("batch-assertion", "sequence-parallel")]
    assert sp8.evaluation.memory.gpu.activations < sp1.evaluation.memory.gpu.activations / 4
    bad = doctor(_ds_config(3, world=6), spec, world_size=6)  # Llama 3.1 8B: 32 query heads, 8 kv heads
    messages = [f.message for f in bad.findings if f.code == "sequence-parallel"]
    assert messages and "UlyssesSPAttentionHF" in messages[0]


def test_sweeps_vary_the_long_context_keys(tmp_path) -> None:
    """A sweep varies the new constraints like any key; the manifest carries the plan's four values."""
    from dsgen.api import run_sweep_to

    base = tmp_path / "base.yaml"
    base.write_text(spec_text(seq=131072))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "base: base.yaml\n"
        'name: "sp{{ constraints.sequence_parallel_size }}"\n'
        "grid:\n  constraints.sequence_parallel_size: [4, 8]\n"
    )
    result = run_sweep_to(sweep, None)
    rows = {row["name"]: row for row in result.rows}
    assert [rows[n]["sequence_parallel_size"] for n in ("sp4", "sp8")] == [4, 8]
    assert [rows[n]["data_parallel_size"] for n in ("sp4", "sp8")] == [2, 1]
    assert all(isinstance(rows[n]["tiled_loss"], bool) for n in rows)


def _ulysses_plan(checkpointing: str, sp: int = 8):
    """Llama-on-8-GPUs plan with Ulysses ``sp``: ZeRO-2, bf16, micro-batch 1, one micro-step."""
    from dsgen.plan import Plan

    return Plan(
        precision="bf16", zero_stage=2, offload_optimizer="none", offload_param="none", checkpointing=checkpointing,
        micro_batch_size=1, gradient_accumulation_steps=1, data_parallel_size=8, long_context=LongContext(sp),
    )  # fmt: skip


def test_all_to_all_and_offload_traffic_from_deepspeeds_shapes() -> None:
    """Hand-counted from UlyssesSPAttentionHF's tensors: Llama 3.1 8B, SP 8, 131,072 tokens, bf16,
    one micro-step, no checkpointing. Each rank holds 16,384 tokens; per layer and pass it sends
    7/8 of q (32 heads x 128) and of the output (4,096 wide) and of k and v (8 heads x 128, one
    per rank: no replication), 2 bytes each: 16,384 x (4,096 + 4,096 + 1,024 + 1,024) x 2 x 7/8
    bytes, in forward and backward, over 32 layers, at 450 GB/s x 0.7. Checkpoint offload moves
    each of the 32 layer inputs (16,384 x 4,096 x 2 bytes) down and back up over PCIe (64 GB/s x 0.8)."""
    from dataclasses import replace as dc_replace

    from dsgen.estimate.sequence_parallel_time import all_to_all_s, checkpoint_offload_s

    spec = spec_of(seq=131072)
    plan = _ulysses_plan("none")
    per_layer_pass = 16384 * (4096 + 4096 + 1024 + 1024) * 2 * 7 / 8
    expected = per_layer_pass * 2 * 32 / (450e9 * 0.7)
    assert all_to_all_s(spec.model, plan, spec.hardware, spec.training, 0.7) == pytest.approx(expected)
    offload = dc_replace(plan, checkpointing="full", long_context=LongContext(8, checkpoint_offload=True))
    moved = 2 * 32 * 16384 * 4096 * 2
    assert checkpoint_offload_s(spec.model, offload, spec.hardware, spec.training, 0.8) == pytest.approx(
        moved / (64e9 * 0.8)
    )


def _million_token_spec(gpu: str):
    text = spec_text(seq=1_048_576, batch=1).replace("gpu: h100-80gb", f"gpu: {gpu}")
    return load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)


def test_attention_core_runs_at_flashattention_2s_published_hopper_speed() -> None:
    """FlashAttention-3 paper (arXiv 2407.08608), head dim 128 on H100 SXM5 at 16K: FlashAttention-2's
    causal forward 335 and backward 322 TFLOPs/s, counted as flash-attention's benchmark counts them
    (a causal forward is half of 4·s²·d per head, a backward 2.5 forwards). Llama 3.1 8B, 1,048,576
    tokens, SP 8 over 8 H100s: each GPU runs 4 of the 32 heads over the whole sequence, 1/8 of the
    causal forward 32 layers x 4 x 4,096 x s^2 / 2; with checkpointing it runs the forward twice."""
    from dsgen.estimate.sequence_parallel_time import attention_s

    spec = _million_token_spec("h100-80gb")
    s = 1_048_576
    forward = 32 * 4 * 4096 * s * s / 2 / 8
    share = spec.hardware.gpu.peak_tflops("bf16") / 989.4  # the figures are the H100 SXM5's, of a 989.4 peak
    expected = forward * (2 / (335e12 * share) + 2.5 / (322e12 * share))
    plan = _ulysses_plan("full")
    assert attention_s(spec.model, plan, spec.hardware, spec.training, mfu_flops=1.0) == pytest.approx(expected)
    # without checkpointing one forward fewer, not a third less of everything
    no_recompute = forward * (1 / (335e12 * share) + 2.5 / (322e12 * share))
    assert attention_s(spec.model, _ulysses_plan("none"), spec.hardware, spec.training, 1.0) == pytest.approx(
        no_recompute
    )


def test_attention_core_without_a_published_speed_runs_at_the_mfu() -> None:
    """A100: no FlashAttention measurement in dsgen, so the causal half of the PaLM attention term
    (forward 4·L·q·s per token, backward twice that, the recompute once more) runs at the MFU rate."""
    from dsgen.estimate.sequence_parallel_time import attention_s

    spec = _million_token_spec("a100-80gb")
    s = 1_048_576
    forward = 32 * 4 * 4096 * s * s / 2 / 8
    rate = 123e12
    assert attention_s(spec.model, _ulysses_plan("full"), spec.hardware, spec.training, rate) == pytest.approx(
        forward * (2 + 2) / rate
    )


def test_long_context_compute_is_the_matmuls_at_the_mfu_plus_the_attention_core() -> None:
    """ZeRO-2 (no ZeRO-3 overhead), whole-layer checkpointing: the PaLM FLOPs without their attention
    term, x 4/3, at 40 % of the peak x t/(t + 256) for t = s/8 tokens per GPU, plus the core alone."""
    from dsgen.estimate.sequence_parallel_time import attention_s
    from dsgen.estimate.throughput import estimate_step_time, model_flops_per_token

    spec = _million_token_spec("h100-80gb")
    s = 1_048_576
    plan = _ulysses_plan("full")
    peak = spec.hardware.gpu.peak_tflops("bf16") * 1e12
    t = s // 8
    rate = peak * 0.40 * t / (t + 256)
    matmuls = (model_flops_per_token(spec.model, s) - 12 * 32 * 4096 * s) * s
    core = attention_s(spec.model, plan, spec.hardware, spec.training, rate)
    step = estimate_step_time(spec.model, plan, spec.hardware, spec.training)
    assert step.compute_s == pytest.approx(matmuls * 4 / 3 / (8 * rate) + core)


def _llama70b_on_two_nodes(seq: int, host_gib: int) -> str:
    """ArcticTraining's run-sp16-llama-70b.yml settings: ZeRO-3 with the optimizer on the CPU, SP 16,
    TiledMLP, checkpoint offload, Liger, on two nodes of 8 H100 80 GB with 1.9 TB of host RAM each."""
    return (
        "model: {preset: llama-3.1-70b}\n"
        f"hardware: {{gpu: h100-80gb, gpus_per_node: 8, nodes: 2, cpu_memory_gib: {host_gib}}}\n"
        f"training: {{sequence_length: {seq}, global_batch_size: 1, liger_kernel: true, packed_samples: true}}\n"
        "constraints: {micro_batch_size: 1, memory_headroom: 0.0, zero_stage: 3, offload_optimizer: cpu,"
        " offload_param: none, sequence_parallel_size: 16, tiled_mlp: true, checkpoint_offload: true,"
        " activation_checkpointing: true, seq_parallel_communication_data_type: bf16}\n"
    )


@pytest.mark.parametrize(
    ("seq", "host_gib", "verdict"),
    [
        # the recipe's tries: "max_length: 1_6000_000 # gpu oom" and "max_length: 2_000_000 # cpu oom NV 50.65 GB"
        (16_000_000, 1769, "oom"),
        (2_000_000, 1769, "host-oom"),
        # a host too small for the offloaded optimizer states runs out when the engine is built,
        # before the first layer's forward: host-oom, whatever the GPU would have needed
        (16_000_000, 200, "host-oom"),
    ],
)
def test_the_resource_that_runs_out_first_is_named(seq: int, host_gib: int, verdict: str) -> None:
    """Short of both GPU and host RAM under checkpoint offload, the verdict names the one that runs
    out first: the host fills a checkpoint per layer during forward, so a GPU that cannot hold the
    first checkpointed layer's forward runs out before the host does."""
    result = solve_spec(load_spec_text(_llama70b_on_two_nodes(seq, host_gib)))
    assert not result.feasible and result.closest is not None
    evaluation = result.closest
    assert not evaluation.fits_cpu  # short of host RAM in all three
    assert evaluation.fit.verdict == verdict
