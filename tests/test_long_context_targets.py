"""Long-context bundles, read by the programs that consume them: DeepSpeed's config parser,
Accelerate's config loader and launcher environment, its ParallelismConfig, and a real 2-rank
CPU run of the hf-trainer bundle with Ulysses SP = 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsgen.api import load_spec, render_bundle, solve_spec
from tests.conftest import EXAMPLES_DIR, require_module

SPEC = """\
model: {{preset: llama-3.1-8b}}
hardware: {{gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 2048}}
training: {{sequence_length: 131072, global_batch_size: 8, attention: {attention}}}
constraints: {{sequence_parallel_size: 8, tiled_mlp: true}}
"""


def _bundle(tmp_path: Path, target: str, attention: str = "flash", launcher: str | None = None):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(attention=attention))
    spec = load_spec(path)
    best = solve_spec(spec).best
    assert best is not None and best.plan.sequence_parallel_size == 8
    bundle = render_bundle(spec, best.plan, target, launcher)
    dest = tmp_path / target
    dest.mkdir()
    for name, text in bundle.files.items():
        (dest / name).write_text(text)
    return spec, best.plan, bundle, dest


def test_deepspeed_reads_the_sp_keys(tmp_path: Path) -> None:
    require_module("deepspeed")
    from tests import ds_oracle

    _, plan, bundle, _ = _bundle(tmp_path, "deepspeed")
    assert bundle.config["sequence_parallel_size"] == 8
    assert bundle.config["seq_parallel_communication_data_type"] == "fp32"
    # DeepSpeedConfig on 8 ranks: it divides the world by sequence_parallel_size for the batch
    parsed = ds_oracle.parse_with_deepspeed(bundle.config, dp_size=1, world_size=8)
    assert parsed.world_size == 1
    assert parsed.train_batch_size == plan.global_batch_size == 8
    assert str(parsed.seq_parallel_communication_data_type) == "torch.float32"


def test_accelerate_launch_turns_sp_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate launch's own argument handling and environment, then ParallelismConfig from it."""
    require_module("accelerate")
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    _, _, _, dest = _bundle(tmp_path, "accelerate", attention="sdpa")
    args = launch_command_parser().parse_args(["--config_file", str(dest / "accelerate_config.yaml"), "train.py"])
    args, defaults, from_config = _validate_launch_command(args)
    assert args.use_deepspeed
    # what launch_command does before deepspeed_launcher(args)
    fields = list(defaults.deepspeed_config) + (["mixed_precision"] if from_config else [])
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    with monkeypatch.context() as m:
        m.chdir(dest)
        _, env = prepare_deepspeed_cmd_env(args)
    sp_env = {k: v for k, v in env.items() if k.startswith(("PARALLELISM_CONFIG_", "ACCELERATE_USE_PARALLELISM"))}
    for key, value in sp_env.items():
        monkeypatch.setenv(key, value)
    config = ParallelismConfig()
    assert (config.sp_size, config.sp_backend) == (8, "deepspeed")
    assert config.sp_handler.sp_seq_length == 131072
    assert config.sp_handler.sp_seq_length_is_variable is False
    assert config.sp_handler.sp_attn_implementation == "sdpa"


@pytest.mark.parametrize(
    ("attention", "implementation"), [("flash", "flash_attention_2"), ("flash3", "flash_attention_3")]
)
def test_trainer_environment_builds_the_parallelism_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attention: str, implementation: str
) -> None:
    """launch.sh exports what Accelerator() (which the Trainer builds) reads when no
    TrainingArguments.parallelism_config is given; its attention is one Accelerate accepts."""
    require_module("accelerate")
    from accelerate.parallelism_config import ParallelismConfig

    _, _, bundle, dest = _bundle(tmp_path, "hf-trainer", attention=attention, launcher="torchrun")
    script = (dest / "launch.sh").read_text()
    exports = dict(
        re.findall(r"^export (PARALLELISM_CONFIG_\w+|ACCELERATE_USE_PARALLELISM_CONFIG)=(\S+)$", script, re.M)
    )
    assert exports["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    for key, value in exports.items():
        monkeypatch.setenv(key, value)
    config = ParallelismConfig()
    assert config.sp_size == 8 and config.sp_handler.sp_attn_implementation == implementation
    assert any(f'attn_implementation="{implementation}"' in note for note in bundle.notes)
    # and the calls no file carries are in launch.sh's header and the printed notes
    assert any("TiledMLP.apply" in note for note in bundle.notes)
    assert "TiledMLP.apply" in script


@pytest.mark.deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_hf_trainer_sp2_bundle_trains_two_steps(tmp_path: Path, ranks: int) -> None:
    """The acceptance run: the hf-trainer files with SP = 2, started by their launch.sh on CPU ranks
    (gloo), train a tiny Llama for 2 optimizer steps with a finite loss. On 4 ranks SP 2 leaves 2
    data-parallel ranks: Accelerate then rewrites train_batch_size from its ParallelismConfig's
    data-parallel size (``Accelerator._prepare_deepspeed``), which launch.sh must state."""
    require_module("transformers")
    require_module("accelerate")
    from tests import ds_oracle, rank_reports
    from tests.train_cases import TINY_SPEC

    config = EXAMPLES_DIR / "tiny-llama" / "config.json"
    pins = "  zero_stage: 2\n  offload_optimizer: none\n  activation_checkpointing: false\n  micro_batch_size: 1\n  sequence_parallel_size: 2"
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        TINY_SPEC.format(config=config, optimizer="adamw", constraints=pins)
        .replace("global_batch_size: 8", f"global_batch_size: {ranks}")
        .replace("gpus_per_node: 2", f"gpus_per_node: {ranks}")
    )
    spec = load_spec(spec_file)
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    assert plan.sequence_parallel_size == 2 and plan.batch_parallel_size == ranks // 2
    bundle = render_bundle(spec, plan, "hf-trainer", "torchrun")
    dest = tmp_path / "run"
    dest.mkdir()
    for name, text in bundle.files.items():
        (dest / name).write_text(text)
    (dest / "launch.sh").chmod(0o755)
    args = ["--model-config", str(config), "--max-steps", "2", "--seq-len", "32", "--output-dir", str(tmp_path / "out")]
    script = Path(__file__).resolve().parent / "hf_trainer_sp_script.py"
    log = ds_oracle.run_launch_script(dest, script, args, cwd=tmp_path)
    reports = rank_reports.read(tmp_path, "DSGEN_SP")  # rank 0's, from its own file
    assert len(reports) == 1, log[-6000:]
    info = reports[0]
    assert info["global_step"] == 2 and info["sp"] == 2 and info["finite"] is True, info
    assert len(info["losses"]) == 2


def test_lightning_refuses_a_ulysses_plan(tmp_path: Path) -> None:
    """Lightning's DeepSpeedStrategy calls deepspeed.initialize(..., mpu_=None) (strategies/deepspeed.py),
    so DeepSpeed would see sequence-parallel size 1: the bundle is refused, naming the target."""
    from dsgen.errors import DsgenError, ExitCode

    require_module("lightning")
    import inspect

    from lightning.pytorch.strategies import deepspeed as pl_deepspeed

    assert "mpu_=None" in inspect.getsource(pl_deepspeed)
    with pytest.raises(DsgenError) as caught:
        _bundle(tmp_path, "lightning")
    assert caught.value.exit_code == ExitCode.BAD_INPUT
    assert "output.target" in caught.value.render()
