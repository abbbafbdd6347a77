"""The Ulysses gradient-reduction dtype and the ALST tricks a training script applies, as inputs.

ALST's recipes (ArcticTraining, projects/sequence-parallelism/*.yml) run ZeRO-3 with
``seq_parallel_communication_data_type: bf16`` and patch in TiledMLP, Liger's fused loss and
checkpoint offload in code. ``dsgen doctor`` reads the first from the config and the others from
the spec's pins; ``dsgen solve`` takes the dtype as a pinned constraint and writes it into the
config, which DeepSpeed's own parser then reads back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsgen.api import load_spec, render_bundle, solve_spec
from dsgen.doctor.diagnose import diagnose
from dsgen.intake.loader import load_spec_text
from dsgen.spec.types import Spec
from tests.cli_helpers import sweep_rows
from tests.conftest import EXAMPLES_DIR, require_module

# ArcticTraining's run-h100-sp8-llama-8b.yml as its build_deepspeed_config hands it to DeepSpeed:
# the recipe's zero_optimization block verbatim, its top-level SP dtype, and the batch keys it adds
# (micro 1, accumulation 1, train_batch_size = 1 * 1 * 8 / 8).
RECIPE = {
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    "seq_parallel_communication_data_type": "bf16",
    "train_micro_batch_size_per_gpu": 1,
    "train_batch_size": 1,
    "gradient_accumulation_steps": 1,
    "sequence_parallel_size": 8,
    "bf16": {"enabled": True},
    "gradient_clipping": 1.0,
}

# what the recipe's training code applies: TiledMLP, checkpoint offload, Liger ("type: liger")
CODE = "tiled_mlp: true, checkpoint_offload: true, tiled_loss: false, "


def _spec(code: str = CODE, sequence: int = 3_800_000) -> Spec:
    return load_spec_text(
        "model: {preset: llama-3.1-8b}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 1769}\n"
        f"training: {{sequence_length: {sequence}, global_batch_size: 1, liger_kernel: true, packed_samples: true}}\n"
        f"constraints: {{{code}activation_checkpointing: true}}\n",
        file="spec.yaml",
        base_dir=EXAMPLES_DIR,
    )


def test_the_doctor_prices_the_tricks_the_spec_pins_for_the_code() -> None:
    """Without the pins the doctor takes the code to apply none of the tricks; with them, the plan
    carries them, and the ArcticTraining recipe that trained 3.8M tokens on 8 H100s is not called
    out of memory (it is 'fits' or a 'tight' that leans to fits)."""
    pinned = diagnose(RECIPE, _spec())
    bare = diagnose(RECIPE, _spec(code=""))
    assert pinned.evaluation is not None and bare.evaluation is not None
    lc = pinned.evaluation.plan.long_context
    assert (lc.sequence_parallel_size, lc.tiled_mlp, lc.checkpoint_offload) == (8, True, True)
    assert not bare.evaluation.plan.long_context.tiled_mlp
    assert bare.evaluation.memory.gpu.total > 2 * pinned.evaluation.memory.gpu.total
    assert pinned.fit.likely == "fits", pinned.fit
    assert bare.fit.likely == "oom"


def test_the_doctor_reads_the_reduction_dtype_from_the_config() -> None:
    """bf16 training that reduces in bf16 casts nothing; in fp32 (DeepSpeed's default) ZeRO-3 casts
    each reduce bucket, DeepSpeed's default 5e8 elements, to an fp32 copy: 4 bytes each."""
    bf16 = diagnose(RECIPE, _spec())
    fp32 = diagnose({k: v for k, v in RECIPE.items() if k != "seq_parallel_communication_data_type"}, _spec())
    assert bf16.evaluation is not None and fp32.evaluation is not None
    assert bf16.evaluation.plan.long_context.communication_dtype == "bf16"
    assert fp32.evaluation.plan.long_context.communication_dtype == "fp32"
    assert fp32.evaluation.memory.gpu.buffers - bf16.evaluation.memory.gpu.buffers == 4 * 500_000_000
    assert fp32.evaluation.step.exposed_comm_s > bf16.evaluation.step.exposed_comm_s
    assert bf16.config_plan is not None and fp32.config_plan is not None
    sources = {s.key: s.source for s in bf16.config_plan.settings}
    assert sources["seq_parallel_communication_data_type"] == "config"
    assert {s.key: s.source for s in fp32.config_plan.settings}["seq_parallel_communication_data_type"] == "default"


def test_without_ulysses_the_dtype_is_not_read() -> None:
    """DeepSpeed reads the key only when the SP world is larger than 1 (engine.py)."""
    config = {**RECIPE, "sequence_parallel_size": 1, "train_batch_size": 8}
    d = diagnose(config, _spec(sequence=32_768))
    assert d.evaluation is not None
    assert d.evaluation.plan.long_context.communication_dtype == "fp32"


def test_checkpoint_offload_without_whole_layer_checkpointing_is_ignored_with_a_note() -> None:
    spec = load_spec_text(
        "model: {preset: llama-3.1-8b}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 1769}\n"
        "training: {sequence_length: 65536, global_batch_size: 1}\n"
        "constraints: {checkpoint_offload: true}\n",
        file="spec.yaml",
        base_dir=EXAMPLES_DIR,
    )
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "gradient_checkpointing": False}
    d = diagnose(RECIPE, spec, trainer_args=args)
    assert d.evaluation is not None and d.config_plan is not None
    assert not d.evaluation.plan.long_context.checkpoint_offload
    assert any("checkpoint_offload is ignored" in note for note in d.config_plan.notes)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_pinned_reduction_dtype_reaches_deepspeed(tmp_path: Path, dtype: str) -> None:
    """The constraint is priced and written; DeepSpeed's DeepSpeedConfig reads the written value."""
    require_module("deepspeed")
    from tests import ds_oracle

    path = tmp_path / "spec.yaml"
    path.write_text(
        "model: {preset: llama-3.1-8b}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 2048}\n"
        "training: {sequence_length: 131072, global_batch_size: 8}\n"
        f"constraints: {{sequence_parallel_size: 8, seq_parallel_communication_data_type: {dtype}}}\n"
    )
    spec = load_spec(path)
    best = solve_spec(spec).best
    assert best is not None and best.plan.long_context.communication_dtype == dtype
    bundle = render_bundle(spec, best.plan, "deepspeed", None)
    assert bundle.config["seq_parallel_communication_data_type"] == dtype
    parsed: Any = ds_oracle.parse_with_deepspeed(bundle.config, dp_size=1, world_size=8)
    assert (
        str(parsed.seq_parallel_communication_data_type) == {"bf16": "torch.bfloat16", "fp32": "torch.float32"}[dtype]
    )


def test_a_sweep_varies_the_reduction_dtype(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each run's config and manifest row carry the value its grid gave it."""
    key = "constraints.seq_parallel_communication_data_type"
    rows = sweep_rows(tmp_path, capsys, EXAMPLES_DIR / "llama-3.1-8b-128k-8xh100.yaml", key, "[fp32, bf16]")
    assert sorted(row["vars"][key] for row in rows) == ["bf16", "fp32"]
    for row in rows:
        assert row["sequence_parallel_size"] > 1
        assert row["seq_parallel_communication_data_type"] == row["vars"][key]
        config = json.loads((tmp_path / "out" / row["name"] / "ds_config.json").read_text())
        assert config["seq_parallel_communication_data_type"] == row["vars"][key]


def test_a_ulysses_config_says_which_tricks_it_assumed_off() -> None:
    """No config file says whether the code tiles the MLP or offloads checkpoints: unpinned, the
    doctor assumes not and says so (tiled_loss is not asked of a Liger run, whose loss is fused)."""
    assumed = [f for f in diagnose(RECIPE, _spec(code="")).findings if f.code == "long-context-assumed"]
    assert len(assumed) == 1
    assert "constraints.tiled_mlp" in assumed[0].message and "constraints.checkpoint_offload" in assumed[0].message
    assert "tiled_loss" not in assumed[0].message
    assert not [f for f in diagnose(RECIPE, _spec()).findings if f.code == "long-context-assumed"]
