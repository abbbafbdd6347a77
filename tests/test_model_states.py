"""Model-state accounting (dsgen/estimate/model_states.py) pinned to hand-computed values.

The formulas are the tensors DeepSpeed 0.19.8 allocates (docs/memory-model.md, "GPU, per rank");
the arithmetic is written out here for a real preset, Llama-3.1-8B on 8 GPUs with bf16 AdamW, and
for a small model whose odd sizes exercise DeepSpeed's alignment padding. The parameter layout
itself is checked against transformers, and one real 2-rank DeepSpeed run (via
bench/model_state_accuracy.py) checks the measured bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dsgen.catalog.model_shape import ModelShape
from dsgen.catalog.presets import get_model, model_presets
from dsgen.estimate.model_states import (
    largest_parameter_tensor,
    model_state_bytes,
    model_states,
    parameter_tensors,
    persistent_parameters,
    zero3_layout,
    zero12_gradient_buffer,
    zero12_partition,
)
from dsgen.plan import Plan, ZeroKnobs
from tests.conftest import REPO_ROOT, require_module


def _plan(stage: int, precision: str = "bf16", opt: str = "none", param: str = "none", **kw: Any) -> Plan:
    knobs = kw.pop("knobs", ZeroKnobs())  # param_persistence_threshold 100_000, sub_group_size 1e9
    return Plan(
        precision=precision,
        zero_stage=stage,
        offload_optimizer=opt,
        offload_param=param,
        checkpointing="none",
        micro_batch_size=1,
        gradient_accumulation_steps=kw.pop("accumulation", 1),
        data_parallel_size=kw.pop("dp", 8),
        knobs=knobs,
    )


# ---- Llama-3.1-8B on 8 GPUs, bf16, AdamW -----------------------------------------------------
# Tensors in model.parameters() order: embed_tokens 128256*4096, then per layer q 4096*4096,
# k 4096*1024, v 4096*1024, o 4096*4096, gate/up/down 4096*14336, two RMSNorms 4096; final norm
# 4096; untied lm_head 128256*4096.
EMBED = 128256 * 4096  # 525_336_576 (also the largest tensor)
LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096  # 218_112_000
P = 2 * EMBED + 32 * LAYER + 4096  # 8_030_261_248
N = 8
# ZeRO-1/2: the flat group is padded to a multiple of 2*N = 16; P is one already.
S = P // N  # 1_003_782_656 elements per rank
# The worst rank's 16-bit gradient buffer (rank 5): its slice [5S, 6S) = [5_018_913_280,
# 6_022_695_936) starts inside layer 20's up_proj, which begins at EMBED + 20*LAYER + 2*4096*4096
# + 2*4096*1024 + 4096*14336 = 4_988_239_872, and ends inside layer 25's gate_proj, which ends at
# EMBED + 25*LAYER + 2*4096*4096 + 2*4096*1024 + 4096*14336 = 6_078_799_872; both are held whole.
GRAD_BUFFER = 6_078_799_872 - 4_988_239_872  # 1_090_560_000
# ZeRO-3 with param_persistence_threshold 100_000: only the 65 RMSNorm weights (4096 each) persist.
PERSISTENT = 65 * 4096  # 266_240, partitions 65 * 512 = 33_280
KB = 8  # AdamW: exp_avg + exp_avg_sq, fp32


def test_llama_8b_layout_numbers() -> None:
    shape = get_model("llama-3.1-8b")
    assert P == 8_030_261_248 == shape.parameter_count() == sum(parameter_tensors(shape))
    assert len(parameter_tensors(shape)) == 1 + 32 * 9 + 2
    assert zero12_partition(shape, N) == S == 1_003_782_656
    assert zero12_gradient_buffer(shape, N) == GRAD_BUFFER == 1_090_560_000
    assert largest_parameter_tensor(shape) == EMBED
    assert persistent_parameters(shape, 100_000) == PERSISTENT
    layout = zero3_layout(shape, N, 100_000, 1_000_000_000)
    # every tensor divides by 8, so ZeRO-3's per-tensor partitions add up to P / N as well; the
    # 1e9 sub-group size is only reached by the last tensor, so there is one sub-group
    assert (layout.partition, layout.persistent, layout.persistent_partition, layout.largest_sub_group) == (
        S,
        PERSISTENT,
        65 * 512,
        S,
    )


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        # ZeRO-0: flat bf16 weights 2P; gradients at the hand-off: bf16 param.grad 2P + flat fp32 4P;
        # states: fp32 master 4P + AdamW 8P.
        (_plan(0), (2 * P, 2 * P + 4 * P, (4 + KB) * P)),
        # ZeRO-2: flat bf16 group 2*S*N = 2P; gradients at the hand-off: the worst rank's bf16 buffer
        # 2*1_090_560_000 + the fp32 slice 4*S = 6_196_250_624; states: (4 + 8) * S.
        (_plan(2), (2 * S * N, 2 * GRAD_BUFFER + 4 * S, (4 + KB) * S)),
        # ZeRO-1 holds every bf16 param.grad whole until the boundary reduction: 2P = 16_060_522_496
        # is more than the hand-off's 6_196_250_624 on 8 GPUs.
        (_plan(1), (2 * S * N, 2 * P, (4 + KB) * S)),
        # ZeRO-2 + CPU optimizer offload: on the GPU only the largest-tensor bf16 staging buffer;
        # ZeRO-1 + offload: the whole bf16 gradients before the boundary reduction plus that buffer.
        (_plan(2, opt="cpu"), (2 * P, 2 * EMBED, 0)),
        (_plan(1, opt="cpu"), (2 * P, 2 * P + 2 * EMBED, 0)),
        # ZeRO-3: partitions 2*S plus the whole persistent norms 2*266_240; gradients: bf16 partition
        # buffer 2*S + the fp32 gradient of the (single) sub-group 4*S; states (4 + 8) * S.
        (_plan(3), (2 * (S + PERSISTENT), 2 * S + 4 * S, (4 + KB) * S)),
        # ZeRO-3 + CPU optimizer offload: gradient buffer, fp32 gradients, master and states on the host.
        (_plan(3, opt="cpu"), (2 * (S + PERSISTENT), 0, 0)),
        # ... and with parameter offload only the persistent norms (whole + partition) stay.
        (_plan(3, opt="cpu", param="cpu"), (2 * (PERSISTENT + 65 * 512), 0, 0)),
    ],
    ids=["zero0", "zero2", "zero1", "zero2-offload", "zero1-offload", "zero3", "zero3-offload", "zero3-offload-all"],
)
def test_llama_8b_bf16_adamw_on_8_gpus(plan: Plan, expected: tuple[int, int, int]) -> None:
    assert model_state_bytes(get_model("llama-3.1-8b"), plan, "adamw") == expected


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        # (end of backward, optimizer step)
        (_plan(0), (2 * P, 2 * P + 4 * P)),  # whole bf16 param.grad; + the flat fp32 copy in the step
        (_plan(1), (2 * P, 2 * GRAD_BUFFER + 4 * S)),  # ZeRO-1 reduces after backward
        (_plan(2), (2 * GRAD_BUFFER, 2 * GRAD_BUFFER + 4 * S)),
        (_plan(2, accumulation=4), (2 * 2 * GRAD_BUFFER, 2 * GRAD_BUFFER + 4 * S)),  # accumulated + new buffer
        (_plan(3), (2 * S, 2 * S + 4 * S)),
        (_plan(1, opt="cpu"), (2 * P + 2 * EMBED, 2 * EMBED)),
        (_plan(2, opt="cpu"), (2 * EMBED, 2 * EMBED)),
        (_plan(3, opt="cpu"), (0, 0)),
    ],
    ids=["zero0", "zero1", "zero2", "zero2-accumulation", "zero3", "zero1-offload", "zero2-offload", "zero3-offload"],
)
def test_llama_8b_gradients_by_phase(plan: Plan, expected: tuple[int, int]) -> None:
    shape = get_model("llama-3.1-8b")
    states = model_states(shape, plan, "adamw")
    assert (states.backward_gradients, states.step_gradients) == expected
    assert model_state_bytes(shape, plan, "adamw")[1] == max(expected)


def test_llama_8b_worked_values() -> None:
    """The same numbers as plain integers, so a reader can check them against the doc."""
    shape = get_model("llama-3.1-8b")
    assert model_state_bytes(shape, _plan(0), "adamw") == (16_060_522_496, 48_181_567_488, 96_363_134_976)
    assert model_state_bytes(shape, _plan(2), "adamw") == (16_060_522_496, 6_196_250_624, 12_045_391_872)
    assert model_state_bytes(shape, _plan(3), "adamw") == (2_008_097_792, 6_022_695_936, 12_045_391_872)


def test_llama_8b_fp32_and_other_optimizers() -> None:
    shape = get_model("llama-3.1-8b")
    # fp32 stage 0: no wrapper, the optimizer updates the weights from param.grad (no master copy)
    assert model_state_bytes(shape, _plan(0, "fp32"), "adamw") == (4 * P, 4 * P, KB * P)
    # fp32 ZeRO-2: DeepSpeed still clones an fp32 master slice and forms a separate fp32 gradient slice
    assert model_state_bytes(shape, _plan(2, "fp32"), "adamw") == (4 * P, 4 * GRAD_BUFFER + 4 * S, (4 + KB) * S)
    assert model_state_bytes(shape, _plan(3, "fp32"), "adamw") == (4 * (S + PERSISTENT), 4 * S + 4 * S, (4 + KB) * S)
    # fp32 ZeRO-2 with gradient accumulation: the accumulated and the new 4-byte buffer at the
    # boundary, 8 * 1_090_560_000 = 8_724_480_000 > the hand-off 4 * 1_090_560_000 + 4 * S = 8_377_370_624
    assert model_state_bytes(shape, _plan(2, "fp32", accumulation=4), "adamw")[1] == 8 * GRAD_BUFFER == 8_724_480_000
    # (in bf16 the hand-off stays larger: 2 * 2 * G = 4_362_240_000 < 6_196_250_624)
    assert model_state_bytes(shape, _plan(2, accumulation=4), "adamw")[1] == 2 * GRAD_BUFFER + 4 * S
    # Lion keeps one fp32 moment
    assert model_state_bytes(shape, _plan(2), "lion")[2] == (4 + 4) * S


def test_llama_8b_host_bytes_of_cpu_offload() -> None:
    shape = get_model("llama-3.1-8b")
    # ZeRO-2: fp32 master + AdamW + fp32 gradient slice (4 + 8 + 4) * S, a bf16 copy of the slice
    # 2 * S, and the bf16 largest-tensor staging buffer 2 * EMBED ...
    assert model_states(shape, _plan(2, opt="cpu"), "adamw").offloaded_optimizer == (16 + 2) * S + 2 * EMBED
    # ... plus, with gradient accumulation, bf16 accumulators of the tensors overlapping the slice
    accumulating = _plan(2, opt="cpu", accumulation=4)
    assert model_states(shape, accumulating, "adamw").offloaded_optimizer == (16 + 2) * S + 2 * EMBED + 2 * GRAD_BUFFER
    # (ZeRO-1 accumulates in param.grad on the GPU instead)
    assert (
        model_states(shape, replace(accumulating, zero_stage=1), "adamw").offloaded_optimizer
        == (16 + 2) * S + 2 * EMBED
    )
    # ZeRO-3: the bf16 gradient partitions join the fp32 gradient, master and states on the host
    assert model_states(shape, _plan(3, opt="cpu"), "adamw").offloaded_optimizer == (16 + 2) * S == 18_068_087_808
    assert model_states(shape, _plan(3), "adamw").offloaded_optimizer == 0


# ---- padding, straddling tensors and sub-groups on a small odd model ------------------------------
# One llama layer, h = 3, one head of 3, f = 5, vocabulary 7, untied. Tensors in order (offsets):
# embed 21 [0,21), q 9 [21,30), k 9 [30,39), v 9 [39,48), o 9 [48,57), gate 15 [57,72),
# up 15 [72,87), down 15 [87,102), two norms 3 [102,108), final norm 3 [108,111), head 21 [111,132).
ODD = ModelShape(
    name="odd",
    family="llama",
    num_layers=1,
    hidden_size=3,
    num_attention_heads=1,
    num_key_value_heads=1,
    head_dim=3,
    intermediate_size=5,
    vocab_size=7,
)


def test_odd_model_zero12_padding_and_straddling_tensors() -> None:
    assert parameter_tensors(ODD) == (21, 9, 9, 9, 9, 15, 15, 15, 3, 3, 3, 21)
    # 5 ranks: 132 elements padded to a multiple of 2*5 = 10 -> 140, slices of 28
    assert zero12_partition(ODD, 5) == 28
    # slices [0,28) [28,56) [56,84) [84,112) [112,140) hold embed..q (0-30), q..o (21-57),
    # o..up (48-87), up..head (72-132) and head (111-132): the worst rank holds 60 elements
    assert zero12_gradient_buffer(ODD, 5) == 132 - 72
    params, grads, states = model_state_bytes(ODD, _plan(2, dp=5), "adamw")
    assert params == 2 * 140
    assert grads == 2 * 60 + 4 * 28
    assert states == 12 * 28
    # ZeRO-1: the hand-off (232 bytes) is less than the whole bf16 gradients 2 * 132 = 264
    assert model_state_bytes(ODD, _plan(1, dp=5), "adamw")[1] == 2 * 132
    # ZeRO-2 with gradient accumulation: two 60-element buffers at the boundary, 2 * 2 * 60 = 240 > 232
    assert model_state_bytes(ODD, _plan(2, dp=5, accumulation=2), "adamw")[1] == 2 * 2 * 60


def test_odd_model_zero3_per_tensor_padding_persistence_and_sub_groups() -> None:
    # ceil(n/5): 21->5, 9->2 (x4), 15->3 (x3), 3->1 (x3), 21->5: 5 + 8 + 9 + 3 + 5 = 30 (not ceil(132/5) = 27)
    # threshold 9 keeps q, k, v, o and the norms: 4*9 + 3*3 = 45 elements, partitions 4*2 + 3*1 = 11;
    # sub-groups of at least 10 elements: [5,2,2,2] = 11, [2,3,3,3] = 11, [1,1,1,5] = 8
    layout = zero3_layout(ODD, 5, 9, 10)
    assert (layout.partition, layout.persistent, layout.persistent_partition, layout.largest_sub_group) == (
        30,
        45,
        11,
        11,
    )
    plan = _plan(3, dp=5, knobs=ZeroKnobs(param_persistence_threshold=9, sub_group_size=10))
    assert model_state_bytes(ODD, plan, "adamw") == (2 * (30 + 45), 2 * 30 + 4 * 11, 12 * 30)


def test_odd_model_zero3_sub_group_closes_when_the_sum_reaches_sub_group_size() -> None:
    # DeepSpeed closes a sub-group as soon as its running sum is >= sub_group_size. Per-rank
    # partitions on 5 ranks, in order: 5, 2, 2, 2, 2, 3, 3, 3, 1, 1, 1, 5 (total 30).
    # sub_group_size 7: 5+2 = 7 closes at exactly 7; 2+2+2+3 = 9; 3+3+1 = 7 (exact again);
    # 1+1+5 = 7 (exact) -> (7, 9, 7, 7), largest 9.
    # (Closing only when the sum is > 7 would give 5+2+2 = 9, 2+2+3+3 = 10, 3+1+1+1+5 = 11.)
    layout = zero3_layout(ODD, 5, 9, 7)
    assert layout.sub_groups == (7, 9, 7, 7)
    assert layout.largest_sub_group == 9
    assert layout.partition == sum(layout.sub_groups) == 30
    # the fp32 gradient of the largest sub-group sits beside the bf16 partition buffer at the step:
    # 2 * 30 + 4 * 9 = 96
    plan = _plan(3, dp=5, knobs=ZeroKnobs(param_persistence_threshold=9, sub_group_size=7))
    assert model_state_bytes(ODD, plan, "adamw")[1] == 2 * 30 + 4 * 9 == 96


def test_every_preset_layout_adds_up() -> None:
    for name, shape in model_presets().items():
        tensors = parameter_tensors(shape)
        assert sum(tensors) == shape.parameter_count(), name
        assert max(tensors) <= shape.largest_module_parameters(), name
        for n in (1, 8, 64):
            size, buffer = zero12_partition(shape, n), zero12_gradient_buffer(shape, n)
            assert shape.parameter_count() <= size * n < shape.parameter_count() + 2 * n
            # some rank holds at least its slice (less padding), none more than its slice plus two tensors
            assert size - 2 * n <= buffer <= size + 2 * max(tensors), name


def test_solver_knob_variants_never_grow_zero3_states() -> None:
    """The solver assumes each knob variant needs no more memory than the one before it."""
    from dsgen.search.knob_variants import knob_variants

    for name in ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b"):
        shape = get_model(name)
        plan = _plan(3, dp=64)
        sizes = [sum(model_state_bytes(shape, replace(plan, knobs=k), "adamw")) for k in knob_variants(shape, 3)]
        assert sizes == sorted(sizes, reverse=True), name


# ---- the parameter layout against transformers ---------------------------------------------------
# Small configs per family (layout checks need every tensor kind, not size). Decoders share the
# grouped-query base; the MHA families (gpt_neox, bert) have no kv-head count.
_MHA = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 100}
_GQA = {**_MHA, "num_key_value_heads": 2}
_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 32}
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-biases": {"model_type": "llama", **_GQA, "attention_bias": True, "mlp_bias": True},
    "mistral": {"model_type": "mistral", **_GQA, "head_dim": 16},
    "qwen2": {"model_type": "qwen2", **_GQA},
    "gemma2": {"model_type": "gemma2", **_GQA, "head_dim": 16, "attention_bias": True},
    "phi3": {"model_type": "phi3", **_GQA, "pad_token_id": None},
    "mixtral": {"model_type": "mixtral", **_GQA, "num_local_experts": 3},
    "gpt2": _GPT2,
    "gpt2-untied": {**_GPT2, "tie_word_embeddings": False},
    "gpt_neox": {"model_type": "gpt_neox", **_MHA},
    "gpt_neox-no-bias": {"model_type": "gpt_neox", **_MHA, "attention_bias": False, "tie_word_embeddings": True},
    "bert": {"model_type": "bert", **_MHA},
}


@pytest.mark.parametrize("case", sorted(FAMILY_CONFIGS))
def test_parameter_tensors_follow_transformers_order(case: str, tmp_path: Path) -> None:
    torch = require_module("torch")
    transformers = require_module("transformers")
    from dsgen.catalog.hf_config import shape_from_hf_config

    path = tmp_path / case / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(FAMILY_CONFIGS[case]))
    config = transformers.AutoConfig.from_pretrained(str(path.parent))
    auto = transformers.AutoModel if config.model_type == "bert" else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    assert parameter_tensors(shape_from_hf_config(path)) == tuple(p.numel() for p in model.parameters())


# ---- one real DeepSpeed run -----------------------------------------------------------------------
@pytest.mark.deepspeed
@pytest.mark.slow
def test_zero2_and_zero3_bf16_match_real_deepspeed(tmp_path: Path) -> None:
    """Two CPU ranks train tiny-llama for one step with dsgen's rendered ZeRO-2 and ZeRO-3 bf16
    configs; the parameter, gradient and optimizer bytes DeepSpeed holds must be within 2 % of the
    prediction, and the buffers it holds at backward's and at the step's probes must be the
    predicted ones: ZeRO-2's reduce buckets gone by the step, ZeRO-3's reduce bucket still there."""
    require_module("deepspeed")
    require_module("transformers")
    out = tmp_path / "rows.json"
    bench = REPO_ROOT / "bench" / "model_state_accuracy.py"
    done = subprocess.run(
        [sys.executable, str(bench), "--models", "tiny-llama", "--cases", "zero2-bf16,zero3-bf16", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert out.exists(), done.stdout + done.stderr
    rows = {row["case"]: row for row in json.loads(out.read_text())}
    assert sorted(rows) == ["zero2-bf16", "zero3-bf16"]
    for row in rows.values():
        assert "error" not in row, row.get("error")
        for term in ("parameters", "gradients", "optimizer_states"):
            predicted, measured = row["predicted"][term], row["measured"][term]
            assert measured > 0, term
            assert abs(predicted - measured) <= 0.02 * measured, (term, predicted, measured, done.stdout)
        for phase in ("backward", "step"):
            key = f"buffers_{phase}"
            assert row["predicted"][key] == row["measured"][key], (row["case"], key, done.stdout)
    assert rows["zero2-bf16"]["measured"]["buffers_step"] == 0
    assert rows["zero3-bf16"]["measured"]["buffers_step"] > 0
    assert done.returncode == 0, done.stdout + done.stderr
