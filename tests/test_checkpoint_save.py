"""A checkpoint save's host copies, predicted (dsgen.estimate.checkpoint_save) against the real
HF Trainer and DeepSpeed: a rendered hf-trainer bundle trains two steps on 2 CPU ranks through its
own launch.sh and saves a checkpoint at the last one; tests/hf_trainer_script.py's ``SaveProbe``
measures, on each rank, the state dict ``Trainer.save_model`` builds and the largest storage any
``torch.save`` of that checkpoint writes."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from dsgen.api import load_spec, render_bundle, solve_spec
from dsgen.search.evaluation import evaluate
from dsgen.targets.bundle import write_bundle
from tests.conftest import EXAMPLES_DIR, require_module
from tests.train_cases import TINY_SPEC

SCRIPT = Path(__file__).resolve().parent / "hf_trainer_script.py"

# (ZeRO stage, tied input/output embeddings, precision): ZeRO-2 clones the module's state dict on
# every rank, a tied weight once per key; ZeRO-3 gathers the model on rank 0 only, a tied weight
# once. On 2 ranks a bf16 ZeRO-2 rank's flat 16-bit module buffer and its fp32 partition are the
# same size; in fp32 the module (rank 0 writes it) is twice the partition, so rank 0 copies more.
CASES = [(2, True, "bf16"), (2, False, "fp32"), (3, False, "bf16")]


def _measure(bundle: Path, config_file: Path, tmp_path: Path) -> list[dict[str, int]]:
    """Each rank's probe record from one run of the bundle.

    A rank writes its record once ``trainer.train()`` has returned, the save done. A rank that
    then aborts in gloo's teardown (:data:`tests.ds_oracle.GLOO_ABORT`) does not spoil what was
    measured; any other failure does. Once in about ten CI runs (2026-12-03) a rank aborted that
    way before its record was written, at the ZeRO-3 save; the cause is not found, and such a run
    is repeated once."""
    from tests import ds_oracle

    probe = tmp_path / "probe"
    args = ["--model-config", str(config_file), "--max-steps", "2", "--output-dir", str(tmp_path / "out")]
    for attempt in (1, 2):
        shutil.rmtree(probe, ignore_errors=True)
        returncode, log = ds_oracle.launch_script(bundle, SCRIPT, [*args, "--probe-save", str(probe)], cwd=tmp_path)
        records = [probe / f"rank{r}.json" for r in range(2)]
        if all(record.is_file() for record in records):
            assert returncode == 0 or ds_oracle.GLOO_ABORT in log, log[-6000:]
            return [json.loads(record.read_text()) for record in records]
        assert attempt == 1 and ds_oracle.GLOO_ABORT in log, log[-6000:]
    raise AssertionError("unreachable")


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.parametrize(
    ("stage", "tied", "precision"), CASES, ids=[f"zero{s}-{'tied' if t else 'untied'}-{p}" for s, t, p in CASES]
)
def test_checkpoint_save_host_copies_match_the_trainer(stage: int, tied: bool, precision: str, tmp_path: Path) -> None:
    require_module("transformers")
    require_module("accelerate")

    config = json.loads((EXAMPLES_DIR / "tiny-llama" / "config.json").read_text())
    config["tie_word_embeddings"] = tied
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    pins = f"  zero_stage: {stage}\n  offload_optimizer: none\n  activation_checkpointing: false\n  micro_batch_size: 2"
    if stage == 3:
        pins += "\n  offload_param: none"
    spec_file = tmp_path / "spec.yaml"
    text = TINY_SPEC.format(config=config_file, optimizer="adamw", constraints=pins)
    spec_file.write_text(text.replace("precision: bf16", f"precision: {precision}"))
    spec = load_spec(spec_file)
    spec = replace(spec, output=replace(spec.output, target="hf-trainer"))
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    predicted = evaluate(spec, plan).memory.cpu.checkpoint_save
    bundle = render_bundle(spec, plan, "hf-trainer")
    dest = tmp_path / "bundle"
    write_bundle(bundle, dest, force=False)

    ranks = _measure(dest, config_file, tmp_path)
    assert any((tmp_path / "out").glob("checkpoint-2/global_step2/*optim_states.pt")), "no ZeRO checkpoint written"

    # The Trainer's state dict: on both ranks at ZeRO-2, on rank 0 alone at ZeRO-3 (the training
    # dtype's bytes a parameter, counted from the real model's tensors).
    measured_state_dict = sum(r["state_dict_bytes"] for r in ranks)
    if stage == 3:
        assert ranks[1]["state_dict_bytes"] == 0
    assert predicted.state_dict == measured_state_dict

    # save_checkpoint: each rank's largest storage, the ranks together (DeepSpeed pads its flat
    # partitions, and the Trainer's weight-decay split makes two groups, hence the 1 % band).
    measured_engine = sum(r["largest_saved_storage"] for r in ranks)
    assert measured_engine > 0
    if precision == "fp32":
        assert ranks[0]["largest_saved_storage"] > ranks[1]["largest_saved_storage"]
    assert predicted.engine == pytest.approx(measured_engine, rel=0.01)


# ---- the doctor reads what decides the Trainer's copy ------------------------------------------
# Qwen2.5-7B (examples/doctor/cluster.yaml) has 7,615,616,512 parameters (its model card's
# 7.61 B; the safetensors index's total_size 15,231,233,024 bytes in bf16 = 2 x that).
QWEN_7B_BF16_BYTES = 15_231_233_024


def _doctor_save(stage: int, trainer: bool, gather: bool | None) -> int:
    from dsgen.doctor.diagnose import diagnose

    spec = load_spec(EXAMPLES_DIR / "doctor" / "cluster.yaml")
    zero: dict[str, object] = {"stage": stage}
    if gather is not None:
        zero["stage3_gather_16bit_weights_on_model_save"] = gather
    config = {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 8,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
    }
    args = json.loads((EXAMPLES_DIR / "doctor" / "training_args.json").read_text()) if trainer else None
    d = diagnose(config, spec, trainer_args=args)
    assert d.evaluation is not None
    return d.evaluation.memory.cpu.checkpoint_save.state_dict


def test_the_doctor_prices_the_trainers_state_dict_only_where_the_trainer_builds_one() -> None:
    # ZeRO-3: rank 0's gathered 16-bit model, only with the gather key (DeepSpeed's default is
    # false, and the Trainer then saves through save_checkpoint alone)
    assert _doctor_save(3, trainer=True, gather=True) == QWEN_7B_BF16_BYTES
    assert _doctor_save(3, trainer=True, gather=None) == 0
    assert _doctor_save(3, trainer=True, gather=False) == 0
    # ZeRO-2: every one of the node's 8 ranks clones the (untied) model
    assert _doctor_save(2, trainer=True, gather=None) == 8 * QWEN_7B_BF16_BYTES
    # no Trainer arguments: the config is run by a script of its own, priced as save_checkpoint
    assert _doctor_save(3, trainer=False, gather=True) == 0
    assert _doctor_save(2, trainer=False, gather=None) == 0


def test_a_save_that_runs_out_on_the_gathered_model_names_the_key_that_drops_it() -> None:
    # Llama-3.1-70B, ZeRO-3 with the optimizer offloaded, HF Trainer, 8 x A100 80GB and 1,250 GiB
    # of host RAM: the save peaks above training by rank 0's gathered bf16 model, 2 x
    # 70,553,706,496 parameters (its safetensors index's total_size, 141,107,412,992 bytes)
    from dsgen.doctor.diagnose import diagnose
    from dsgen.intake.loader import load_spec_text

    spec = load_spec_text(
        "model: {preset: llama-3.1-70b}\n"
        "hardware: {gpu: a100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1250}\n"
        "training: {sequence_length: 4096, global_batch_size: 64, attention: flash}\n"
        "constraints: {activation_checkpointing: true}\n"
    )
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    config = {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 8,
        "bf16": {"enabled": True},
        "zero_optimization": {**zero, "stage3_gather_16bit_weights_on_model_save": True},
    }
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True}
    d = diagnose(config, spec, trainer_args=args)
    assert d.evaluation is not None and d.verdict == "host-oom"
    cpu = d.evaluation.memory.cpu
    assert (cpu.checkpoint_save.state_dict, cpu.checkpoint_save.engine) == (141_107_412_992, 0)
    assert cpu.total == cpu.saving == cpu.training + 141_107_412_992
    (finding,) = [f for f in d.findings if f.code == "host-memory"]
    assert "at a checkpoint save" in finding.message
    assert finding.hint is not None and '"stage3_gather_16bit_weights_on_model_save": false' in finding.hint
    # without the gather the Trainer builds no state dict: the save adds nothing, and no hint
    plain = diagnose({**config, "zero_optimization": zero}, spec, trainer_args=args)
    assert plain.evaluation is not None and plain.evaluation.memory.cpu.checkpoint_save.state_dict == 0
    assert all(f.hint is None or "gather" not in f.hint for f in plain.findings)
