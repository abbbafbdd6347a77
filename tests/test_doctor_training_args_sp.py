"""``dsgen doctor --training-args``: the Trainer's ``parallelism_config`` (accelerate's ParallelismConfig)
enters the batch arithmetic and the memory model like the config's ``sequence_parallel_size``.

Every JSON shape accepted here is also built with the consumers' own classes (accelerate's
``ParallelismConfig`` / ``DeepSpeedSequenceParallelConfig``, transformers' ``TrainingArguments`` and
``HfArgumentParser``), and every shape refused is one those constructors refuse too.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from dsgen.api import load_spec
from dsgen.doctor.diagnose import diagnose
from dsgen.doctor.method_files import read_training_args
from dsgen.errors import DsgenError
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR, require_module

SPEC = EXAMPLES_DIR / "llama-3.1-8b-128k-8xh100.yaml"  # 8 GPUs, 128K tokens
SP_HANDLER = {
    "sp_seq_length": 131072,
    "sp_seq_length_is_variable": False,
    "sp_attn_implementation": "flash_attention_2",
}
# 8 GPUs / SP 4 = 2 data-parallel ranks, which Accelerate multiplies into train_batch_size
PC = {"dp_shard_size": 2, "sp_size": 4, "sp_backend": "deepspeed", "sp_handler": SP_HANDLER}
ARGS = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "bf16": True, "parallelism_config": PC}
# a concrete batch DeepSpeed accepts on 8 ranks with SP 4: 1 x 4 x (8 / 4)
CONFIG = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 4,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3},
}


def _accelerate_parallelism(block: dict[str, Any]) -> Any:
    """What a script builds from the JSON object: ParallelismConfig(**obj) with its SP handler."""
    require_module("accelerate")
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    fields = dict(block)
    if isinstance(fields.get("sp_handler"), dict):
        fields["sp_handler"] = DeepSpeedSequenceParallelConfig(**fields["sp_handler"])
    return ParallelismConfig(**fields)


def _write(tmp_path: Path, args: dict[str, Any]) -> Path:
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"output_dir": str(tmp_path / "out"), **args}))
    return path


def test_valid_parallelism_config_is_what_the_consumers_accept(tmp_path: Path) -> None:
    require_module("transformers")
    from transformers import HfArgumentParser, TrainingArguments

    path = _write(tmp_path, {k: v for k, v in ARGS.items() if k != "bf16"})  # CPU CI: no bf16 check
    assert read_training_args(path)["parallelism_config"] == PC
    (parsed,) = HfArgumentParser(TrainingArguments).parse_json_file(str(path))
    assert parsed.parallelism_config == PC  # the parser hands the object over as a dict
    pc = _accelerate_parallelism(PC)
    assert (pc.sp_size, pc.sp_backend, pc.sp_handler.sp_seq_length) == (4, "deepspeed", 131072)
    assert TrainingArguments(output_dir=str(tmp_path / "out"), parallelism_config=pc).parallelism_config is pc


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"sp_size": "4"}, "parallelism_config.sp_size"),
        ({"sp_size": 0}, "parallelism_config.sp_size"),
        ({"sp_size": 2, "sp_backend": "megatron"}, "parallelism_config.sp_backend"),
        ({"sp_size": 2, "sp_degree": 2}, "parallelism_config.sp_degree"),
        ({"sp_size": 2, "cp_size": 2}, "mutually exclusive"),
        ({"sp_size": 2, "sp_handler": {"sp_attn_implementation": "eager"}}, "sp_handler.sp_attn_implementation"),
    ],
)
def test_malformed_parallelism_config_names_field_and_file(tmp_path: Path, block: dict[str, Any], field: str) -> None:
    with pytest.raises((TypeError, ValueError)):  # accelerate refuses the same object
        _accelerate_parallelism(block)
    path = _write(tmp_path, {"parallelism_config": block})
    with pytest.raises(DsgenError) as info:
        read_training_args(path)
    assert field in str(info.value) and str(path) in str(info.value)


def test_sp_seq_length_must_be_an_integer(tmp_path: Path) -> None:
    """The constructor keeps a string; its field is Optional[int] and register_with_transformers
    divides it (seq_length // sp_world_size), so a string fails there."""
    require_module("accelerate")
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    assert "int" in str(DeepSpeedSequenceParallelConfig.__dataclass_fields__["sp_seq_length"].type)
    block = {"sp_size": 2, "sp_handler": {"sp_seq_length": "4096"}}
    field = "sp_handler.sp_seq_length"
    path = _write(tmp_path, {"parallelism_config": block})
    with pytest.raises(DsgenError) as info:
        read_training_args(path)
    assert field in str(info.value) and str(path) in str(info.value)


def test_parallelism_config_must_be_an_object(tmp_path: Path) -> None:
    with pytest.raises(DsgenError, match="parallelism_config must be a JSON object"):
        read_training_args(_write(tmp_path, {"parallelism_config": [4]}))
    assert read_training_args(_write(tmp_path, {"parallelism_config": None}))["parallelism_config"] is None


def test_malformed_parallelism_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ds.json").write_text(json.dumps(CONFIG))
    path = _write(tmp_path, {"parallelism_config": {"sp_size": "four"}})
    result = run_cli(["doctor", str(tmp_path / "ds.json"), "--spec", str(SPEC), "--training-args", str(path)], capsys)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "parallelism_config.sp_size" in result.stderr and "Traceback" not in result.stderr


def test_trainer_sp_enters_batch_and_memory_model() -> None:
    spec = load_spec(SPEC)
    with_args = diagnose(CONFIG, spec, trainer_args=ARGS)
    in_config = diagnose(
        {**CONFIG, "sequence_parallel_size": 4}, spec, trainer_args={**ARGS, "parallelism_config": None}
    )
    without = diagnose(CONFIG, spec, trainer_args={**ARGS, "parallelism_config": None})
    assert with_args.parallel.sequence_parallel == 4 and without.parallel.sequence_parallel == 1
    # batch: 8 = 1 x 4 x 8 / 4 holds with SP, fails without it (DeepSpeed would see 8 ranks)
    assert with_args.batch.ok and with_args.batch.world == 2
    assert not without.batch.ok
    # memory: priced exactly as the same degree given in the DeepSpeed config
    assert with_args.config_plan is not None and in_config.config_plan is not None
    assert with_args.config_plan.plan.long_context.sequence_parallel_size == 4
    assert with_args.config_plan.plan == in_config.config_plan.plan
    assert "sequence-parallel-mismatch" not in {f.code for f in with_args.findings}


def test_a_parallelism_config_without_the_data_parallel_size_fails_deepspeeds_batch_check() -> None:
    """Accelerator._prepare_deepspeed sets train_batch_size = micro x accumulation x
    (dp_replicate_size x dp_shard_size) under the DeepSpeed SP backend; DeepSpeed asserts it
    against 8 / 4 = 2 ranks. Left at 1, a real 4-rank SP 2 run stops with DeepSpeed's
    "train_batch_size is not equal to ... 2 != 1 * 2 * 2.0" (tests/test_long_context_targets.py)."""
    spec = load_spec(SPEC)
    pc = {k: v for k, v in PC.items() if k != "dp_shard_size"}
    d = diagnose(CONFIG, spec, trainer_args={**ARGS, "parallelism_config": pc})
    (finding,) = [f for f in d.findings if f.code == "sequence-parallel-data-parallel"]
    assert "dp_shard_size to 2" in (finding.hint or "")
    assert not d.batch.ok
    assert d.batch.train_batch_size == 1 * 4 * 1
    assert _accelerate_parallelism(pc).data_parallel_size == 1  # accelerate's own default
    assert _accelerate_parallelism(PC).data_parallel_size == 2


def test_disagreeing_sp_degrees_are_an_error() -> None:
    spec = load_spec(SPEC)
    d = diagnose({**CONFIG, "sequence_parallel_size": 2}, spec, trainer_args=ARGS)
    (finding,) = [f for f in d.findings if f.code == "sequence-parallel-mismatch"]
    assert finding.severity == "error" and "_prepare_deepspeed" in finding.message
    assert d.parallel.sequence_parallel == 4  # the mpu accelerate builds from sp_size wins
    off = diagnose(
        {**CONFIG, "sequence_parallel_size": 2}, spec, trainer_args={**ARGS, "parallelism_config": PC | {"sp_size": 1}}
    )
    assert "sequence-parallel-mismatch" in {f.code for f in off.findings}
    assert off.parallel.sequence_parallel == 2  # no mpu: DeepSpeedConfig divides by the config's key


def test_sp_rules_apply_to_the_trainer_degree() -> None:
    """Llama 3.1 8B has 8 KV heads: SP 16 neither divides them nor is divided by them, and 8 GPUs."""
    d = diagnose(CONFIG, load_spec(SPEC), trainer_args={**ARGS, "parallelism_config": PC | {"sp_size": 16}})
    assert "sequence-parallel" in {f.code for f in d.findings if f.severity == "error"}


def _launch_env(launch: Path) -> dict[str, str]:
    env = {}
    for line in launch.read_text().splitlines():
        if line.startswith("export PARALLELISM_CONFIG_") or line.startswith("export ACCELERATE_USE_PARALLELISM"):
            name, value = line.removeprefix("export ").split("=", 1)
            env[name] = shlex.split(value)[0]
    return env


def test_round_trip_dsgen_hf_trainer_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """dsgen's own hf-trainer files for an SP plan: the doctor reads the degree back, and a
    parallelism_config that accelerate builds from launch.sh's variables agrees with the config."""
    out = tmp_path / "run"
    assert run_cli(["new", str(SPEC), "--target", "hf-trainer", "-o", f"{out}/"], capsys).exit_code == 0
    config = json.loads((out / "ds_config.json").read_text())
    degree = config["sequence_parallel_size"]
    assert degree > 1
    spec = load_spec(SPEC)
    args = read_training_args(out / "training_args.json")
    assert diagnose(config, spec, trainer_args=args).parallel.sequence_parallel == degree

    # what the Trainer's Accelerator reads from launch.sh (ParallelismConfig() with the env set)
    require_module("accelerate")
    from accelerate.parallelism_config import ParallelismConfig

    env = _launch_env(out / "launch.sh")
    assert env.pop("ACCELERATE_USE_PARALLELISM_CONFIG") == "true"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pc = ParallelismConfig()
    block = {
        "dp_shard_size": pc.dp_shard_size,
        "sp_size": pc.sp_size,
        "sp_backend": pc.sp_backend,
        "sp_handler": {
            "sp_seq_length": pc.sp_handler.sp_seq_length,
            "sp_seq_length_is_variable": pc.sp_handler.sp_seq_length_is_variable,
            "sp_attn_implementation": pc.sp_handler.sp_attn_implementation,
        },
    }
    path = _write(tmp_path, {**json.loads((out / "training_args.json").read_text()), "parallelism_config": block})
    d = diagnose(config, spec, trainer_args=read_training_args(path))
    assert d.parallel.sequence_parallel == degree == pc.sp_size
    assert pc.data_parallel_size == 8 // degree  # launch.sh states the data-parallel ranks
    assert "sequence-parallel-mismatch" not in {f.code for f in d.findings}
    assert d.batch.ok, d.batch.error
