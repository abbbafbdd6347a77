"""Liger-Kernel's memory, one rebuilt layer's backward gradients, and batches smaller than the GPU count.

Liger's kernels are Triton GPU kernels and do not run on this CPU machine, so the expected bytes
here are written out from what Liger-Kernel's autograd functions save (``ctx.save_for_backward``
in ``liger_kernel/ops/rms_norm.py``, ``swiglu.py`` and ``fused_linear_cross_entropy.py``), tensor
by tensor, not read back from dsgen's formulas.
"""

from __future__ import annotations

import json

import pytest
from transformers import TrainingArguments

from dsgen.api import solve_spec
from dsgen.catalog.presets import model_presets
from dsgen.errors import DsgenError, ExitCode
from dsgen.estimate.activations import estimate_activations
from dsgen.estimate.memory import estimate_memory
from dsgen.intake.loader import load_spec_text
from dsgen.plan import LongContext
from tests.cli_helpers import run_cli, sweep_rows
from tests.conftest import EXAMPLES_DIR

LLAMA_8B = dict(h=4096, f=14336, q=4096, kv=1024, heads=32, vocab=128256)


def spec_text(
    *, model: str = "llama-3.1-8b", seq: int = 131072, batch: int = 8, liger: bool = True, extra: str = ""
) -> str:
    return (
        f"model: {{preset: {model}}}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 2048}\n"
        f"training: {{sequence_length: {seq}, global_batch_size: {batch}, liger_kernel: {str(liger).lower()}}}\n"
        f"constraints: {{{extra}}}\n"
    )


def spec_of(**kwargs: object):
    return load_spec_text(spec_text(**kwargs), file="spec.yaml", base_dir=EXAMPLES_DIR)  # type: ignore[arg-type]


def acts(liger: bool, checkpointing: bool, tokens: int = 1000):
    shape = model_presets()["llama-3.1-8b"]
    return estimate_activations(
        shape,
        micro_batch_size=1,
        sequence_length=tokens,
        dtype_bytes=2,
        attention="flash",
        checkpointing=checkpointing,
        liger=liger,
    )


def test_liger_layer_saves_what_its_kernels_save() -> None:
    """Per token of one Llama layer, transformers' RMSNorm saves the fp32 upcast input, the fp32
    rstd, the bf16 normalised value and (for the next linear) its output; LigerRMSNorm saves its
    bf16 input and fp32 rstd, and the output for the next linear. transformers' gated MLP saves
    gate, SiLU output, up and product; LigerSiLUMulFunction saves gate and up, down_proj the product."""
    h, f = LLAMA_8B["h"], LLAMA_8B["f"]
    hf_norm = 4 * h + 4 + 2 * h + 2 * h
    liger_norm = 2 * h + 4 + 2 * h
    hf_mlp, liger_mlp = 4 * 2 * f, 3 * 2 * f
    expected = 2 * (hf_norm - liger_norm) + (hf_mlp - liger_mlp)
    tokens = 1000
    assert acts(False, False).per_layer - acts(True, False).per_layer == tokens * expected


def test_a_rebuilt_liger_layer_shares_its_input_with_the_checkpoint() -> None:
    """A rebuilt layer also holds its recomputed output (the reentrant checkpoint keeps ``outputs``
    while it runs backward): one hidden state more than its forward inventory. Under Liger the
    first norm's saved input is the checkpointed layer input itself, which the checkpoint term
    already holds: one hidden state less, so the two cancel."""
    tokens = 1000
    hidden_state = tokens * 2 * LLAMA_8B["h"]
    assert acts(False, True).recompute_working_set - acts(False, False).per_layer == hidden_state
    assert acts(True, True).recompute_working_set == acts(True, False).per_layer


def test_liger_loss_keeps_no_logits() -> None:
    """LigerFusedLinearCrossEntropyFunction saves grad_input (bf16, one hidden state per token) and
    the LM head's gradient (vocab x hidden, bf16) instead of the fp32 log-softmax and shifted labels;
    the final LigerRMSNorm keeps its input and rstd (its output only feeds the fused loss)."""
    h, vocab = LLAMA_8B["h"], LLAMA_8B["vocab"]
    tokens = 1000
    hf_outside = tokens * (2 * 8 + (4 * h + 4 + 2 * h + 2 * h) + 4 * vocab)
    liger_outside = tokens * (8 + (2 * h + 4) + 2 * h) + vocab * h * 2
    position = 1000 * 2 * 2 * 128  # rotary cos/sin, both ways
    assert acts(False, False).outside_layers - position == hf_outside
    assert acts(True, False).outside_layers - position == liger_outside


def test_liger_spec_pins() -> None:
    assert spec_of().training.liger_kernel is True
    assert spec_of(liger=False).training.liger_kernel is False
    with pytest.raises(DsgenError) as caught:
        spec_of(extra="tiled_loss: true")
    assert caught.value.exit_code == ExitCode.BAD_INPUT
    assert "constraints.tiled_loss" in caught.value.render()
    with pytest.raises(DsgenError) as caught:
        spec_of(model="gpt2")
    assert "training.liger_kernel" in caught.value.render()
    assert "spec.yaml:3" in caught.value.render()


def test_liger_plans_never_add_deepspeeds_tiled_loss() -> None:
    result = solve_spec(spec_of(seq=1 << 20, batch=1))
    assert result.best is not None
    assert result.best.plan.long_context.tiled_loss is False
    assert result.best.plan.sequence_parallel_size > 1


def test_hf_trainer_bundle_turns_liger_on_the_way_transformers_reads_it(tmp_path, capsys) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(seq=1 << 20, batch=1))
    out = tmp_path / "run"
    result = run_cli(["new", str(spec), "--target", "hf-trainer", "-o", str(out)], capsys)
    assert result.exit_code == 0, result.stdout + result.stderr
    kwargs = json.loads((out / "training_args.json").read_text())
    kwargs = {k: v for k, v in kwargs.items() if k != "deepspeed"}
    args = TrainingArguments(output_dir=str(tmp_path / "o"), use_cpu=True, **{**kwargs, "bf16": False})
    assert args.use_liger_kernel is True
    if "TiledMLP" in (result.stdout + result.stderr):  # TiledMLP patches transformers' MLP: Liger's SwiGLU stays off
        assert args.liger_kernel_config == {"swiglu": False}
    assert "liger-kernel" in (result.stdout + result.stderr)


def test_the_deepspeed_bundle_names_the_liger_patch(tmp_path, capsys) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(seq=1 << 20, batch=1))
    result = run_cli(["new", str(spec), "--target", "deepspeed", "-o", str(tmp_path / "run")], capsys)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "apply_liger_kernel_to_llama(" in (result.stdout + result.stderr)


def test_rebuilt_layer_backward_holds_attentions_gradients() -> None:
    """A rebuilt layer's backward adds gradients to its saved tensors. The MLP goes first: under
    TiledMLP the residual gradient, the input gradient (zeros_like x) and one shard rebuilt with
    transformers' MLP (ceil(tokens / hidden) shards) running backward. Then the post-attention
    RMSNorm's backward. Then attention, once the MLP's, the post-attention norm's and the output
    projection's sequence-sharded input are freed: the residual gradient, the attention output's
    gradient, dq/dk/dv and FlashAttention-2's fp32 dq accumulator and softmax_d. The largest
    phase is the peak."""
    spec = spec_of(
        seq=8 * 65536,
        batch=1,
        liger=False,
        extra="sequence_parallel_size: 8, tiled_mlp: true, zero_stage: 3, activation_checkpointing: true",
    )
    result = solve_spec(spec)
    assert result.best is not None
    plan = result.best.plan
    tiled = estimate_memory(spec.model, plan, spec.hardware, spec.training).gpu
    # the same plan, priced as if the rebuilt layer's backward needed nothing beyond its saved tensors,
    # is the lower bound the old model used; the difference is the attention backward's gradients
    h, q, kv, heads = LLAMA_8B["h"], LLAMA_8B["q"], LLAMA_8B["kv"], LLAMA_8B["heads"]
    tokens = 65536
    grads = 2 * h + 2 * q + 2 * (q + 2 * kv) + 4 * (q + heads)
    freed = (2 * 2 * h + 4 + 4 * h) + 2 * q  # post-attention norm, o_proj's sequence-sharded input
    attention_phase = tokens * (grads - freed)
    shard = tokens // (tokens // h)
    # one shard rebuilt (4·e·f saved) and its backward: its output e·h, down_proj's input gradient
    # and the SiLU·up product's, 2·e·f
    mlp_phase = tokens * 2 * 2 * h + shard * (4 * 2 * LLAMA_8B["f"] + 2 * h + 2 * 2 * LLAMA_8B["f"])
    # the post-attention norm's backward: residual gradient, five fp32 temporaries, less its output,
    # normalised value and rstd
    norm_phase = tokens * (2 * h + 5 * 4 * h - 2 * 2 * h - 4)
    saved_layer = _rebuilt_without_backward(spec, plan)
    assert norm_phase > max(mlp_phase, attention_phase)  # a TiledMLP layer peaks in its norm
    assert tiled.transient == saved_layer + max(mlp_phase, norm_phase, attention_phase)


def _rebuilt_without_backward(spec, plan) -> int:
    """One rebuilt layer at 65,536 tokens (flash, SP 8, TiledMLP): the transformers inventory of
    the layer without its MLP, plus Ulysses' sequence-sharded output copy, plus the checkpoint,
    plus the layer's recomputed output."""
    h, q, kv, heads = LLAMA_8B["h"], LLAMA_8B["q"], LLAMA_8B["kv"], LLAMA_8B["heads"]
    norms = 2 * (4 * h + 4 + 2 * h + 2 * h)
    attention = 2 * q + 2 * 2 * kv + 2 * q + 4 * heads
    assert plan.long_context == LongContext(
        8,
        tiled_mlp=True,
        tiled_loss=plan.long_context.tiled_loss,
        checkpoint_offload=plan.long_context.checkpoint_offload,
    )
    checkpoint = 2 * h if plan.long_context.checkpoint_offload else 0
    return 65536 * (norms + attention + 2 * q + checkpoint + 2 * h)


def test_one_long_sequence_on_eight_gpus_is_met_by_sequence_parallelism() -> None:
    """One sequence per step cannot occupy 8 GPUs by data parallelism; with the Ulysses degree
    unpinned the solver meets it at SP 8 and says why, instead of refusing the batch."""
    result = solve_spec(spec_of(seq=1 << 20, batch=1, liger=False))
    assert result.best is not None
    assert result.best.plan.sequence_parallel_size == 8
    assert result.best.plan.batch_parallel_size == 1
    assert result.batch_note is not None and "cannot occupy 8 GPUs" in result.batch_note


def test_a_pinned_degree_keeps_the_batch_error() -> None:
    with pytest.raises(DsgenError) as caught:
        solve_spec(spec_of(seq=1 << 20, batch=1, liger=False, extra="sequence_parallel_size: 2"))
    assert "training.global_batch_size" in caught.value.render()


def test_a_batch_of_at_least_one_sequence_per_gpu_keeps_the_batch_error() -> None:
    with pytest.raises(DsgenError) as caught:
        solve_spec(spec_of(seq=4096, batch=12, liger=False))
    assert "cannot be split evenly over 8 data-parallel GPUs" in caught.value.render()


def test_sweeps_vary_liger_kernel(tmp_path, capsys) -> None:
    """A sweep over training.liger_kernel prices each run with and without Liger's kernels."""
    key = "training.liger_kernel"
    found = sweep_rows(tmp_path, capsys, EXAMPLES_DIR / "llama-3.1-8b-128k-8xh100.yaml", key, "[false, true]")
    rows = {row["vars"][key]: row for row in found}
    assert rows[True]["status"] == rows[False]["status"] == "ok"
    assert rows[True]["tiled_loss"] is False  # Liger's fused loss, not TiledFusedLogitsLoss
    # without Liger the 131K-token sequence needs Ulysses; with Liger's loss (no logits) a plain
    # ZeRO plan fits, and the search for long-context tricks never starts
    assert rows[False]["sequence_parallel_size"] > 1
    assert rows[True]["sequence_parallel_size"] == 1


def test_a_pinned_micro_batch_the_sp_fallback_cannot_meet_keeps_the_batch_error() -> None:
    """One sequence on 2 GPUs with micro-batch 2 pinned: no Ulysses degree splits it either, so
    the answer is the plain batch error (found by the hostile-input property test)."""
    text = (
        "model: {preset: qwen2.5-0.5b}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 1, nodes: 2, cpu_memory_gib: 1024}\n"
        "training: {sequence_length: 512, global_batch_size: 1}\n"
        "constraints: {micro_batch_size: 2}\n"
    )
    with pytest.raises(DsgenError) as caught:
        solve_spec(load_spec_text(text))
    assert caught.value.exit_code == ExitCode.BAD_INPUT
    assert "cannot be split evenly over 2 data-parallel GPUs" in caught.value.render()


def test_frontier_keeps_a_one_sequence_batch_on_every_cluster() -> None:
    """Over --gpus the spec's batch of one sequence stays one sequence (met by Ulysses SP), not
    rounded up to one per GPU: the step time is for the batch the user asked for."""
    from dsgen.api import frontier_of

    spec = spec_of(seq=1 << 20, batch=1, liger=False)
    for point in frontier_of(spec, "sequence_length", [1, 8]):
        best = point.result.best
        assert best is not None
        assert best.plan.global_batch_size == 1
        assert best.plan.sequence_parallel_size == point.gpus
