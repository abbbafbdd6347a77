"""Optimizer-state bytes (dsgen/estimate/optimizers.py) for every optimizer dsgen models.

Two kinds of expected value:

* **Measured**: bytes real DeepSpeed 0.19.8 runs held in ``engine.basic_optimizer.state`` (each
  storage once, 0-d step counters excluded) when training examples/tiny-llama on 2 CPU ranks,
  with ``torch.optim.Adafactor`` (torch 2.13) and ``bitsandbytes.optim.AdamW8bit`` (0.50.2) passed
  as client optimizers. The adafactor and adamw-8bit cases of ``bench/model_state_accuracy.py``
  re-measure them.
* **Hand-computed** from the documented formulas (docs/memory-model.md) for Llama-3.1-8B,
  written out from its architecture numbers.

And the rules around client optimizers: never offloaded, no optimizer block in the config.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dsgen.api import load_spec, render_plan, solve_spec
from dsgen.catalog.hf_config import shape_from_hf_config
from dsgen.catalog.presets import get_model
from dsgen.estimate.model_states import model_state_bytes, parameter_shapes, parameter_tensors
from dsgen.estimate.optimizers import flat_state_bytes, state_bytes
from dsgen.plan import Plan, ZeroKnobs
from tests.cli_helpers import run_cli
from tests.conftest import REPO_ROOT

TINY = REPO_ROOT / "examples" / "tiny-llama" / "config.json"


def _plan(stage: int, precision: str, ranks: int) -> Plan:
    return Plan(
        precision=precision,
        zero_stage=stage,
        offload_optimizer="none",
        offload_param="none",
        checkpointing="none",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=ranks,
        knobs=ZeroKnobs(),
    )


def _tiny():
    return shape_from_hf_config(TINY)


# ---- measured: tiny-llama (4,999,424 parameters in 39 tensors, 9 of them 1-D norms of 256) -------
def test_tiny_llama_layout_is_the_one_that_was_measured() -> None:
    shapes = parameter_shapes(_tiny())
    assert len(shapes) == 39
    assert sum(parameter_tensors(_tiny())) == 4_999_424
    assert sorted(s for s in shapes if len(s) == 1) == [(256,)] * 9


@pytest.mark.parametrize(
    ("optimizer", "stage", "precision", "measured"),
    [
        # ZeRO-0: the optimizer sees the model's shapes (fp32: the weights themselves; bf16:
        # FP16_UnfusedOptimizer's fp32 copies), so Adafactor factors its second moment.
        ("adafactor", 0, "fp32", 118_172 - 39 * 4),  # 39 0-d step tensors excluded
        ("adafactor", 0, "bf16", 118_172 - 39 * 4),
        # ZeRO-1/2/3: one flat 1-D partition [2499712] per rank: no factoring.
        ("adafactor", 1, "bf16", 9_998_852 - 4),
        ("adafactor", 2, "bf16", 9_998_852 - 4),
        ("adafactor", 2, "fp32", 9_998_852 - 4),
        ("adafactor", 3, "bf16", 9_998_852 - 4),
        ("adamw-8bit", 0, "fp32", 10_170_880),
        ("adamw-8bit", 0, "bf16", 10_170_880),
        ("adamw-8bit", 1, "bf16", 5_079_592),
        ("adamw-8bit", 2, "bf16", 5_079_592),
        ("adamw-8bit", 2, "fp32", 5_079_592),
        ("adamw-8bit", 3, "bf16", 5_079_592),
    ],
)
def test_client_optimizer_states_match_the_bytes_deepspeed_held(
    optimizer: str, stage: int, precision: str, measured: int
) -> None:
    plan = _plan(stage, precision, ranks=2)
    _, _, states = model_state_bytes(_tiny(), plan, optimizer)
    master = 0 if (stage == 0 and precision == "fp32") else 4 * (4_999_424 // (1 if stage == 0 else 2))
    assert states - master == measured


def test_zero3_sub_groups_each_get_their_own_block_statistics() -> None:
    # measured: sub_group_size 1e6 split the rank's 2,499,712 elements into [1073408, 1426304];
    # 8-bit Adam's absmax blocks are counted per sub-group (4,193 + 5,572) - same total here.
    plan = replace(_plan(3, "bf16", ranks=2), knobs=replace(ZeroKnobs(), sub_group_size=1_000_000))
    _, _, states = model_state_bytes(_tiny(), plan, "adamw-8bit")
    assert states - 4 * 2_499_712 == 2 * 2_499_712 + 8 * (4_193 + 5_572) + 2_048
    _, _, states = model_state_bytes(_tiny(), plan, "adafactor")
    assert states - 4 * 2_499_712 == 4 * 2_499_712


# ---- hand-computed: Llama-3.1-8B ---------------------------------------------------------------
H, KV, F, V, L = 4096, 1024, 14336, 128256, 32
P_8B = 8_030_261_248


def test_adafactor_factors_every_matrix_of_llama_8b_without_zero() -> None:
    per_layer = (H + H) + 2 * (KV + H) + (H + H) + 2 * (F + H) + (H + F)  # q, k, v, o, gate, up, down
    matrices = L * per_layer + 2 * (V + H)  # + embed_tokens and lm_head
    vectors = L * 2 * H + H  # two RMSNorm weights per layer + the final norm
    expected = 4 * (matrices + vectors)
    assert expected == 12_609_536
    assert state_bytes("adafactor", parameter_shapes(get_model("llama-3.1-8b"))) == expected


def test_eight_bit_adam_on_llama_8b() -> None:
    shape = get_model("llama-3.1-8b")
    # without ZeRO: every tensor has >= 4096 elements and a multiple of 256 -> 2 B/elem + 8 B/256
    assert state_bytes("adamw-8bit", parameter_shapes(shape)) == 2 * P_8B + 8 * P_8B // 256 + 2048
    # ZeRO-2 on 8 ranks: one flat partition of P/8 (already a multiple of the 2 x 8 alignment)
    partition = P_8B // 8
    plan = _plan(2, "bf16", ranks=8)
    _, _, states = model_state_bytes(shape, plan, "adamw-8bit")
    assert states == 4 * partition + 2 * partition + 8 * -(-partition // 256) + 2048


def test_small_tensors_keep_32_bit_states_in_8_bit_adam() -> None:
    assert flat_state_bytes("adamw-8bit", [4095]) == 8 * 4095
    assert flat_state_bytes("adamw-8bit", [4096]) == 2 * 4096 + 8 * 16 + 2048
    assert flat_state_bytes("adamw-8bit", [4096, 100]) == 2 * 4096 + 8 * 16 + 2048 + 8 * 100


def test_adafactor_factors_stacked_expert_tensors_over_their_last_two_dimensions() -> None:
    assert state_bytes("adafactor", [(8, 28672, 4096)]) == 4 * 8 * (28672 + 4096)
    assert state_bytes("adafactor", [(4096,)]) == 4 * 4096


def test_deepspeed_optimizers_keep_their_per_element_state() -> None:
    for optimizer, per_element in (("adamw", 8), ("adam", 8), ("lion", 4), ("sgd", 4), ("adagrad", 4)):
        assert state_bytes(optimizer, [(10, 20), (7,)]) == per_element * 207
    with pytest.raises(ValueError, match="unknown optimizer"):
        state_bytes("rmsprop", [(1,)])


# ---- the plan and the config ---------------------------------------------------------------------
SPEC = """\
model: {preset: llama-3.1-8b}
hardware: {gpu: a100-40gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}
training:
  sequence_length: 4096
  global_batch_size: 64
  optimizer: {type: OPT, lr: 1.0e-4}
"""


@pytest.mark.parametrize("optimizer", ["adafactor", "adamw-8bit"])
def test_client_optimizers_render_without_an_optimizer_block_and_are_never_offloaded(
    optimizer: str, tmp_path: Path
) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(SPEC.replace("OPT", optimizer))
    spec = load_spec(spec_file)
    result = solve_spec(spec)
    assert result.best is not None
    assert all(e.plan.offload_optimizer == "none" for e in result.ranked)
    config: dict[str, Any] = render_plan(spec, result.best.plan).config
    assert "optimizer" not in config
    assert config["zero_allow_untested_optimizer"] is True
    # AdamW with DeepSpeed's CPU Adam may offload on the same hardware: the exclusion is the optimizer's
    adamw_file = tmp_path / "adamw.yaml"
    adamw_file.write_text(SPEC.replace("OPT", "adamw"))
    adamw = solve_spec(load_spec(adamw_file))
    assert any(e.plan.offload_optimizer != "none" for e in adamw.ranked)


def test_pinning_offload_with_a_client_optimizer_is_a_spec_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(SPEC.replace("OPT", "adamw-8bit") + "constraints:\n  offload_optimizer: cpu\n")
    out = tmp_path / "ds.json"
    result = run_cli(["new", str(spec_file), "-o", str(out)], capsys)
    assert result.exit_code == 2
    assert f"{spec_file}:8: constraints.offload_optimizer:" in result.stderr
    assert "bitsandbytes.optim.AdamW8bit" in result.stderr
    assert not out.exists()


def test_new_tells_the_user_to_pass_the_optimizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(SPEC.replace("OPT", "adafactor"))
    out = tmp_path / "ds.json"
    result = run_cli(["new", str(spec_file), "-o", str(out)], capsys)
    assert result.exit_code == 0, result.stderr
    assert "deepspeed.initialize(optimizer=torch.optim.Adafactor(" in result.stdout
    assert "optimizer" not in json.loads(out.read_text())
