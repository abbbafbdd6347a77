"""Model-parallel bundles (DeepSpeed AutoTP, AutoEP), read by the programs that consume them.

* the deepspeed target's JSON for a TP 2 plan and an EP 2 plan, parsed by DeepSpeed 0.19.8's own
  ``DeepSpeedConfig`` (its ``TPTrainingConfig`` and AutoEP's ``parse_autoep_config`` /
  ``validate_autoep_config``), on the world size the plan runs on;
* every refusal through the CLI (exit 2), each next to the consumer code that makes it one: the
  sampler Lightning builds, AutoEP's module search under a LightningModule, transformers' ZeRO-3
  loader under AutoTP;
* the acceptance run: the hf-trainer bundle of a TP 2 plan, started by its own ``launch.sh`` on CPU
  ranks (gloo), trains a tiny Llama for 2 optimizer steps; on 4 ranks (2 TP groups) too, which is
  the check that the HF Trainer runs AutoTP on more GPUs than the TP degree (Accelerate 1.15 builds
  its TP mesh over ``autotp_size`` ranks only: ``Accelerator._prepare_deepspeed``).

Expected numbers come from the spec (GPUs, the pinned degrees), never from dsgen's output.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import pytest

from dsgen.api import load_spec, render_bundle, solve_spec
from tests import rank_reports
from tests.conftest import EXAMPLES_DIR, REPO_ROOT, require_module

TINY_LLAMA = EXAMPLES_DIR / "tiny-llama" / "config.json"
TP_REPORT = "tp"  # what each rank of the AutoTP launch reports (tests/rank_reports.py)

DENSE_SPEC = """\
model: {{hf_config: {config}}}
hardware: {{gpu: a100-80gb, gpus_per_node: {gpus}, cpu_memory_gib: 64}}
training:
  sequence_length: 32
  global_batch_size: {batch}
  precision: bf16
  attention: sdpa
  optimizer: {{type: {optimizer}, lr: 1.0e-3}}
constraints:
  zero_stage: {zero}
  offload_optimizer: none
  offload_param: none
  activation_checkpointing: false
  micro_batch_size: 1
  tensor_parallel_size: {tp}
"""

#: the tiny MoE models of the measured runs (tests/tiny_models.py), by transformers model_type
MOE_FAMILIES = ("mixtral", "qwen3_moe")

MOE_SPEC = """\
model: {{hf_config: {config}}}
hardware: {{gpu: a100-80gb, gpus_per_node: 2, cpu_memory_gib: 64}}
training:
  sequence_length: 32
  global_batch_size: 4
  precision: bf16
  attention: sdpa
  optimizer: {{type: {optimizer}, lr: 1.0e-3}}
constraints:
  zero_stage: {zero}
  offload_optimizer: none
  offload_param: none
  activation_checkpointing: false
  micro_batch_size: 1
  expert_parallel_size: 2
"""


def _dense_spec(
    tmp_path: Path, *, gpus: int = 2, tp: int = 2, zero: int = 1, batch: int = 4, optimizer: str = "adamw"
) -> Path:
    path = tmp_path / "dense.yaml"
    path.write_text(DENSE_SPEC.format(config=TINY_LLAMA, gpus=gpus, tp=tp, zero=zero, batch=batch, optimizer=optimizer))
    return path


def _moe_spec(tmp_path: Path, family: str = "mixtral", *, zero: int = 2, optimizer: str = "adamw") -> Path:
    from tests.tiny_models import TINY_MODELS

    config = tmp_path / f"{family}.json"
    config.write_text(json.dumps({"model_type": family, **TINY_MODELS[family]}))
    path = tmp_path / f"{family}.yaml"
    path.write_text(MOE_SPEC.format(config=config, zero=zero, optimizer=optimizer))
    return path


def _new(spec: Path, target: str, dest: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> Any:
    from tests.cli_helpers import run_cli

    return run_cli(["new", str(spec), "--target", target, "-o", str(dest), *extra], capsys)


# ---- (i) AutoTP: the deepspeed target's JSON, parsed by DeepSpeed ------------------------------


@pytest.mark.deepspeed
def test_deepspeed_target_writes_an_autotp_block_deepspeed_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_module("deepspeed")
    from tests import ds_oracle

    result = _new(_dense_spec(tmp_path), "deepspeed", tmp_path / "ds_config.json", capsys)
    assert result.exit_code == 0, result.stderr
    config = json.loads((tmp_path / "ds_config.json").read_text())
    assert config["tensor_parallel"] == {"autotp_size": 2}
    # DeepSpeedConfig on the 2 ranks the spec has: without an mpu it counts every rank, TP peers too
    parsed = ds_oracle.parse_with_deepspeed(config, dp_size=1, world_size=2)
    assert parsed.tensor_parallel_config.autotp_size == 2
    assert parsed.train_batch_size == parsed.train_micro_batch_size_per_gpu * parsed.gradient_accumulation_steps * 2
    assert parsed.train_batch_size == 2 * 4  # the spec's 4 samples per step, counted by both TP peers
    # Trainer.save_model / accelerator.get_state_dict gather the TP shards only with this set
    assert parsed.zero_config.gather_16bit_weights_on_model_save is True
    assert parsed.zero_optimization_stage == 1
    # and the script is told what the JSON cannot carry
    assert "get_data_parallel_rank()" in result.stdout and "every TP peer counts" in result.stdout


def test_a_plan_without_model_parallelism_writes_no_model_parallel_keys(tmp_path: Path) -> None:
    spec = load_spec(_dense_spec(tmp_path, tp=1))
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    for target in ("deepspeed", "hf-trainer", "accelerate", "lightning"):
        config = render_bundle(spec, plan, target, "none").config
        assert "tensor_parallel" not in config and "expert_parallel" not in config
        assert "stage3_gather_16bit_weights_on_model_save" not in config["zero_optimization"]


# ---- (ii) AutoEP: the expert_parallel block, parsed by DeepSpeed's AutoEP config code -----------


@pytest.mark.deepspeed
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_deepspeed_target_writes_an_autoep_block_deepspeed_accepts(
    family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_module("deepspeed")
    from deepspeed.module_inject.auto_ep_config import parse_autoep_config, validate_autoep_config
    from deepspeed.module_inject.auto_ep_presets.registry import preset_name_for_hf_model_type

    from tests import ds_oracle

    result = _new(_moe_spec(tmp_path, family), "deepspeed", tmp_path / "ds_config.json", capsys)
    assert result.exit_code == 0, result.stderr
    config = json.loads((tmp_path / "ds_config.json").read_text())
    block = config["expert_parallel"]
    assert (block["enabled"], block["autoep_size"]) == (True, 2)
    assert block["preset_model"] == preset_name_for_hf_model_type(family)  # DeepSpeed's own registry
    parsed = ds_oracle.parse_with_deepspeed(config, dp_size=2)
    ep = parsed.expert_parallel_config
    assert (ep.enabled, ep.autoep_size, ep.preset_model) == (True, 2, block["preset_model"])
    # what the engine checks before it replaces the MoE blocks, on the spec's 2 ranks
    validate_autoep_config(
        parse_autoep_config(block),
        world_size=2,
        pp_size=1,
        tp_size=0,
        sp_size=1,
        zero_stage=config["zero_optimization"]["stage"],
    )
    assert "optimizer" in config  # DeepSpeed builds it
    assert "transformers>=5.18,<5.23" in result.stdout


@pytest.mark.deepspeed
def test_framework_targets_keep_deepspeeds_optimizer_under_autoep(tmp_path: Path) -> None:
    """AutoEP needs DeepSpeed to build the optimizer; the HF Trainer and Accelerate build their own
    unless the config has an optimizer block (transformers ``deepspeed_optim_sched``)."""
    require_module("transformers")
    from transformers.integrations.deepspeed import deepspeed_optim_sched

    assert '"optimizer" in config' in inspect.getsource(deepspeed_optim_sched)
    spec = load_spec(_moe_spec(tmp_path))
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    assert plan.expert_parallel_size == 2
    for target in ("hf-trainer", "accelerate"):
        bundle = render_bundle(spec, plan, target, "none")
        assert bundle.config["optimizer"]["type"] == "AdamW", target
        assert bundle.config["expert_parallel"]["autoep_size"] == 2
        assert any("optimizer block" in note for note in bundle.notes)
        assert any("transformers>=5.18,<5.23" in note for note in bundle.notes)


def test_autoep_pin_is_a_valid_requirement() -> None:
    from packaging.requirements import Requirement

    from dsgen.targets.model_parallel import AUTOEP_TRANSFORMERS_PIN

    pin = Requirement(AUTOEP_TRANSFORMERS_PIN)
    assert pin.name == "transformers"
    # the bracket measured in docs/model-parallel-measurements.md: 5.18.0 .. 5.22.2 run, 5.23.0 on fail
    assert all(pin.specifier.contains(v) for v in ("5.18.0", "5.19.0", "5.20.2", "5.21.1", "5.22.2"))
    assert not pin.specifier.contains("5.23.0")
    assert not pin.specifier.contains("5.24.0") and not pin.specifier.contains("4.57.0")


# ---- (iii) refusals, through the CLI, next to the code that makes each one --------------------


@pytest.mark.parametrize(
    ("target", "zero", "phrase"),
    [
        ("hf-trainer", 3, "TrainingArguments registers the ZeRO-3 config"),
        ("accelerate", 3, "zero3_init_flag registers the ZeRO-3 config"),
        ("lightning", 1, "Data inconsistency within the TP group"),
    ],
)
def test_autotp_refusals_exit_2(
    target: str, zero: int, phrase: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _new(_dense_spec(tmp_path, zero=zero), target, tmp_path / "out", capsys)
    assert result.exit_code == 2, result.stderr
    assert "output.target" in result.stderr and phrase in result.stderr and "hint:" in result.stderr
    assert not (tmp_path / "out").exists()


def test_autoep_refusals_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lightning = _new(_moe_spec(tmp_path), "lightning", tmp_path / "a", capsys)
    assert lightning.exit_code == 2 and "output.target" in lightning.stderr
    assert "no MoE layers detected" in lightning.stderr
    client = _new(_moe_spec(tmp_path, optimizer="adafactor"), "hf-trainer", tmp_path / "b", capsys)
    assert client.exit_code == 2 and "training.optimizer" in client.stderr, client.stderr


def test_what_autotp_runs_on_every_target_but_lightning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ZeRO-1/2 AutoTP renders for hf-trainer and accelerate, on more GPUs than the TP degree too
    (the 4-rank acceptance run below trains it)."""
    spec = _dense_spec(tmp_path, gpus=4, zero=2)
    for target in ("hf-trainer", "accelerate", "deepspeed"):
        dest = tmp_path / target
        result = _new(spec, target, dest if target != "deepspeed" else dest.with_suffix(".json"), capsys)
        assert result.exit_code == 0, (target, result.stderr)
    for target in ("accelerate", "hf-trainer"):
        config = json.loads((tmp_path / target / "ds_config.json").read_text())
        # train_batch_size is left out under AutoTP: DeepSpeed derives it over every rank (TP peers
        # counted each), which is not the spec's samples per step
        assert "train_batch_size" not in config and config["tensor_parallel"] == {"autotp_size": 2}


def test_lightning_gives_every_rank_its_own_batches() -> None:
    """Why Lightning is refused AutoTP: it passes the config through (AutoTP turns on), and its
    sampler shards by the global rank, so TP peers get different batches."""
    require_module("lightning")
    from lightning.pytorch.strategies import deepspeed as pl_deepspeed

    source = inspect.getsource(pl_deepspeed.DeepSpeedStrategy)
    assert '{"num_replicas": self.world_size, "rank": self.global_rank}' in source
    assert "config=self.config" in inspect.getsource(pl_deepspeed.DeepSpeedStrategy._setup_model_and_optimizer)


@pytest.mark.deepspeed
def test_autoep_finds_no_moe_block_under_a_wrapping_module() -> None:
    """Why Lightning is refused AutoEP: DeepSpeed is handed the LightningModule, and AutoEP's preset
    pattern, matched against its module names, finds no MoE block under the wrapper's prefix."""
    require_module("deepspeed")
    require_module("transformers")
    import torch
    import transformers
    from deepspeed.module_inject.auto_ep import AutoEP
    from deepspeed.module_inject.auto_ep_config import parse_autoep_config

    from tests.tiny_models import TINY_MODELS

    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**TINY_MODELS["mixtral"]))

    class Wrapper(torch.nn.Module):  # a LightningModule holding the HF model, as DeepSpeed sees it
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.model = inner

    block = {"enabled": True, "autoep_size": 2, "preset_model": "mixtral"}
    assert len(AutoEP(model, parse_autoep_config(block)).ep_parser()) == 2
    with pytest.raises(ValueError, match="no MoE layers detected"):
        AutoEP(Wrapper(model), parse_autoep_config(block)).ep_parser()


@pytest.mark.deepspeed
def test_transformers_zero3_loader_refuses_autotp() -> None:
    """Why hf-trainer and accelerate are refused ZeRO-3 + AutoTP: with a ZeRO-3 config registered
    (TrainingArguments, or Accelerate's zero3_init_flag), from_pretrained loads through
    ``_load_state_dict_into_zero3_model``, which refuses any weight conversion under AutoTP."""
    require_module("deepspeed")
    require_module("transformers")
    from transformers.integrations.deepspeed import (
        HfDeepSpeedConfig,
        _apply_weight_conversions_to_state_dict,
        unset_hf_deepspeed_config,
    )

    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    config["tensor_parallel"] = {"autotp_size": 2}
    registered = HfDeepSpeedConfig(config)  # what TrainingArguments / zero3_init_flag register
    try:
        assert registered.is_zero3()
        with pytest.raises(NotImplementedError, match="Weight conversions"):
            next(iter(_apply_weight_conversions_to_state_dict(None, {}, [])))
    finally:
        unset_hf_deepspeed_config()


# ---- (iv) the acceptance run: launch.sh -> torchrun -> HF Trainer -> DeepSpeed AutoTP ---------


def trainer_main(argv: list[str]) -> int:
    """A user's HF Trainer script for an AutoTP bundle, as its launch.sh runs it (the training
    script; see :func:`_script`). It builds ``TrainingArguments(**training_args.json)`` and, on this
    CPU test machine, Accelerate's state first: without a GPU, ``PartialState`` would leave DeepSpeed
    off and one process, and the TP-aware DataLoader would divide that by the TP degree (the
    reference's cpu_only_hosts). Each rank writes a ``tp`` record to its own file
    (:mod:`tests.rank_reports`; lines on the shared stdout interleave under load): the process
    groups DeepSpeed built, the local q_proj rows, what the engine counts as train_batch_size, the
    losses and one number per micro-batch it was given."""
    import argparse

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-config", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--save", action="store_true", help="trainer.save_model at the end")
    cli = parser.parse_args(argv)

    import torch
    from accelerate.state import PartialState
    from deepspeed.utils import groups
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # CPU only: on GPUs PartialState starts DeepSpeed itself
    PartialState(backend="gloo")
    kwargs = json.loads(Path("training_args.json").read_text())  # the bundle's file, by name
    kwargs.update(
        output_dir=str(cli.output_dir),
        max_steps=cli.max_steps,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=1234,
        accelerator_config={"use_configured_state": True},
    )
    args = TrainingArguments(**kwargs)
    config = LlamaConfig(**json.loads(cli.model_config.read_text()), use_cache=False)
    model = LlamaForCausalLM(config)
    samples = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size * cli.max_steps
    gen = torch.Generator().manual_seed(0)
    data = [
        {"input_ids": ids, "labels": ids}
        for ids in torch.randint(0, config.vocab_size, (samples, cli.seq_len), generator=gen)
    ]
    seen: list[int] = []

    def collate(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch = {key: torch.stack([f[key] for f in features]) for key in features[0]}
        seen.append(int(batch["input_ids"].sum()))  # which samples this rank was given
        return batch

    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collate)
    trainer.train()
    engine: Any = trainer.model_wrapped  # the DeepSpeedEngine
    q_rows = dict(model.named_parameters())["model.layers.0.self_attn.q_proj.weight"].shape[0]  # AutoTP's shard
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    if cli.save:
        trainer.save_model(str(cli.output_dir / "model"))
    record = {
        "rank": args.process_index,
        "global_step": trainer.state.global_step,
        "world": args.world_size,
        "tp": groups.get_tensor_model_parallel_world_size(),
        "dp": groups.get_data_parallel_world_size(),
        "zero_stage": engine.zero_optimization_stage(),
        "train_batch_size": engine.train_batch_size(),
        "trainer_tp": trainer.get_tp_size(),
        "q_rows": q_rows,
        "losses": losses,
        "seen": seen,
    }
    rank_reports.write(TP_REPORT, args.process_index, record)
    trainer.accelerator.wait_for_everyone()  # end the way every distributed script must (docs/targets.md)
    trainer.accelerator.end_training()
    return 0


def _script(tmp_path: Path) -> Path:
    """The training script launch.sh starts: :func:`trainer_main` of this module."""
    script = tmp_path / "train.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from tests.test_model_parallel_targets import trainer_main\n"
        "raise SystemExit(trainer_main(sys.argv[1:]))\n"
    )
    return script


@pytest.mark.deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_hf_trainer_tp2_bundle_trains_two_steps(tmp_path: Path, ranks: int) -> None:
    """The hf-trainer files of a TP 2 plan, started by their own launch.sh on CPU ranks: AutoTP
    shards the model, every rank of a TP group is given the same batches, and 2 optimizer steps run
    with finite losses. On 4 ranks (TP 2 x DP 2) the two TP groups get different batches, so the
    Trainer runs AutoTP on more GPUs than the TP degree. On 2 ranks ``trainer.save_model`` writes the
    whole (gathered) weights."""
    require_module("transformers")
    require_module("accelerate")
    from tests import ds_oracle

    spec = load_spec(_dense_spec(tmp_path, gpus=ranks, batch=ranks))
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    assert (plan.tensor_parallel_size, plan.zero_stage) == (2, 1)
    bundle = render_bundle(spec, plan, "hf-trainer", "torchrun")
    dest = tmp_path / "run"
    dest.mkdir()
    for name, text in bundle.files.items():
        (dest / name).write_text(text)
    (dest / "launch.sh").chmod(0o755)
    assert "the same batches" in (dest / "launch.sh").read_text()
    out = tmp_path / "out"
    args = ["--model-config", str(TINY_LLAMA), "--max-steps", "2", "--output-dir", str(out)]
    args += ["--save"] if ranks == 2 else []
    log = ds_oracle.run_launch_script(dest, _script(tmp_path), args, cwd=tmp_path)
    records = rank_reports.read(tmp_path, TP_REPORT)  # one file per rank: nothing to interleave with
    assert [r["rank"] for r in records] == list(range(ranks)), (records, log[-6000:])
    by_rank = {r["rank"]: r for r in records}
    model = json.loads(TINY_LLAMA.read_text())
    for rank, info in by_rank.items():
        assert info["global_step"] == 2 and info["world"] == ranks, info
        assert (info["tp"], info["dp"], info["trainer_tp"], info["zero_stage"]) == (2, ranks // 2, 2, 1)
        assert info["q_rows"] == model["hidden_size"] // 2  # q_proj sharded by columns over the TP group
        # DeepSpeed counts every rank: TP 2 x the spec's global batch (ranks samples per step)
        assert info["train_batch_size"] == 2 * ranks
        losses = info["losses"]
        assert len(losses) == 2 and all(0 < x < 20 for x in losses), info
        assert info["seen"] == by_rank[rank - rank % 2]["seen"], "TP peers were given different batches"
    if ranks == 4:
        assert by_rank[0]["seen"] != by_rank[2]["seen"], "the two TP groups were given the same batches"
    if ranks == 2:
        from safetensors import safe_open

        with safe_open(str(out / "model" / "model.safetensors"), "pt") as saved:
            shape = saved.get_slice("model.layers.0.self_attn.q_proj.weight").get_shape()
        assert shape == [model["hidden_size"], model["hidden_size"]]  # gathered, not one rank's shard
