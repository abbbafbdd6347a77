"""``training.deepspeed_version``: the DeepSpeed release a run uses decides what ZeRO-1/2 holds in
host RAM at start-up, whether ALST exists, and which parser the config is checked against.

The host case is a published outcome (LLaMA-Factory #103, bench/data/fit_outcomes.yaml): a 13B
model, ZeRO-2, 8 x A800 80 GB, 256 GB of host RAM, killed at "Creating torch.float16 ZeRO stage 2
optimizer" in mid-2023. Releases before 0.18.7 flatten ZeRO-1/2's parameters on the host
unconditionally (two 16-bit copies of the model per rank); 0.19.8 flattens on the GPU when the
flat buffer fits there, so only the older release explains the kill.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsgen.api import doctor
from dsgen.doctor.config_to_plan import PINNED_OFFLOAD_DEFAULT_SINCE
from dsgen.errors import DsgenError
from dsgen.intake.loader import load_spec_text
from dsgen.search.solver import solve
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR, require_module

LLAMA_2_13B_PARAMETERS = 13_015_864_320  # the Hugging Face checkpoint's count (meta-llama/Llama-2-13b-hf)

LF103 = """
model: {{preset: llama-2-13b}}
hardware: {{gpu: a100-80gb, gpus_per_node: 8, cpu_memory_gib: 256}}
training: {{sequence_length: 1024, global_batch_size: 8, precision: fp16, deepspeed_version: {version}}}
constraints: {{activation_checkpointing: true}}
"""
LF103_CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "fp16": {"enabled": True},
    "zero_optimization": {"stage": 2},
}

LONG = """
model: {{preset: llama-3.1-8b}}
hardware: {{gpu: h100-80gb, gpus_per_node: 8}}
training: {{sequence_length: 131072, global_batch_size: 8, deepspeed_version: {version}}}
"""


def _spec(text: str):
    return load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)


@pytest.mark.parametrize("version", ["0.14", "0.16", "0.18.6"])
def test_before_0_18_7_zero2_flattens_on_the_host_and_the_published_run_is_host_oom(version: str) -> None:
    d = doctor(LF103_CONFIG, _spec(LF103.format(version=version)))
    assert d.verdict == "host-oom"
    host = d.evaluation.memory.cpu.total
    # every rank holds the fp16 model twice (its parameters and the flat copy) beside its process
    assert host >= 8 * 2 * 2 * LLAMA_2_13B_PARAMETERS
    assert host > d.evaluation.usable_cpu_bytes


@pytest.mark.parametrize("version", ["0.18.7", "0.19"])
def test_from_0_18_7_zero2_flattens_on_the_gpu_where_it_fits(version: str) -> None:
    d = doctor(LF103_CONFIG, _spec(LF103.format(version=version)))
    assert d.verdict == "fits"
    # what is left is loading the fp16 model in every process (and the processes themselves)
    assert d.evaluation.memory.cpu.total < 8 * 2 * 2 * LLAMA_2_13B_PARAMETERS * 0.6


def test_doctor_flag_replaces_the_spec_release_and_json_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(LF103.format(version="0.19"))
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(LF103_CONFIG))
    command = ["doctor", str(config), "--spec", str(spec)]
    old = run_cli([*command, "--json", "--deepspeed-version", "0.16.9"], capsys)
    body = json.loads(old.stdout)
    assert (old.exit_code, body["verdict"], body["deepspeed_version"]) == (3, "host-oom", "0.16.9")
    new = run_cli([*command, "--json"], capsys)
    assert (new.exit_code, json.loads(new.stdout)["deepspeed_version"]) == (0, "0.19.8")
    bad = run_cli([*command, "--deepspeed-version", "0.18"], capsys)
    assert bad.exit_code == 2 and "--deepspeed-version" in bad.stderr and "0.14, 0.16 or 0.19" in bad.stderr


def test_the_key_reads_yaml_numbers_and_full_releases_and_refuses_others() -> None:
    read = {
        given: _spec(LF103.format(version=given)).training.deepspeed_version
        for given in ("0.16", '"v0.14.5"', "0.19.8", "0.18.5")  # an unquoted 0.16 is a YAML float
    }
    assert read == {"0.16": "0.16.9", '"v0.14.5"': "0.14.5", "0.19.8": "0.19.8", "0.18.5": "0.18.5"}
    for bad in ("0.18", "0.20.1", "1.0.0", "latest"):  # 0.18 spans 0.18.7: it needs its patch number
        with pytest.raises(DsgenError) as caught:
            _spec(LF103.format(version=bad))
        assert caught.value.path == "training.deepspeed_version" and caught.value.location.line == 4


def test_no_alst_before_0_17_4() -> None:
    old = solve(_spec(LONG.format(version="0.17.3")))
    new = solve(_spec(LONG.format(version="0.17.4")))
    assert new.best is not None and new.best.plan.long_context.sequence_parallel_size > 1
    assert old.ranked or old.closest is not None
    for evaluation in (*old.ranked, *([old.closest] if old.closest else [])):
        lc = evaluation.plan.long_context
        assert lc.sequence_parallel_size == 1 and not (lc.tiled_mlp or lc.tiled_loss or lc.checkpoint_offload)
    for pin in ("sequence_parallel_size: 4", "tiled_mlp: true", "checkpoint_offload: true"):
        with pytest.raises(DsgenError) as caught:
            _spec(LONG.format(version="0.16") + f"constraints: {{{pin}}}\n")
        assert caught.value.path == f"constraints.{pin.split(':')[0]}" and "0.17.4" in caught.value.message


def test_doctor_checks_the_config_with_the_release_parser() -> None:
    """0.19.8 rejects the legacy ``amp`` block that 0.14 and 0.16 read (dsgen.validate.versions)."""
    config = {**LF103_CONFIG, "fp16": {"enabled": False}, "amp": {"enabled": False}}
    spec = "model: {preset: gpt2}\nhardware: {gpu: a100-80gb}\ntraining: {sequence_length: 512, global_batch_size: 1, deepspeed_version: %s}\n"
    errors = {
        version: [f.code for f in doctor(config, _spec(spec % version)).findings if f.severity == "error"]
        for version in ("0.16", "0.17.0", "0.19")  # 0.17.0 is checked with the nearest profile, 0.16's
    }
    assert errors["0.16"] == errors["0.17.0"] == [] and errors["0.19"] != [], errors


ZERO3_OFFLOAD = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
}
LLAMA_OFFLOAD = """
model: {{preset: llama-3.1-8b}}
hardware: {{gpu: a100-80gb, gpus_per_node: 8, cpu_memory_gib: 1024}}
training: {{sequence_length: 2048, global_batch_size: 8, deepspeed_version: {version}}}
"""


def test_offload_buffers_are_pinned_by_default_from_0_19_5() -> None:
    """Only pinned blocks take the host allocator's power-of-two rounding (model_states.pinned), so
    the same config needs more host RAM where DeepSpeed pins by default, or where it says so."""

    def host(version: str, config: dict[str, object]) -> int:
        return doctor(config, _spec(LLAMA_OFFLOAD.format(version=version))).evaluation.memory.cpu.total

    pinned = {"device": "cpu", "pin_memory": True}
    stated = {**ZERO3_OFFLOAD, "zero_optimization": {"stage": 3, "offload_optimizer": pinned, "offload_param": pinned}}
    assert host("0.19.4", ZERO3_OFFLOAD) < host("0.19.5", ZERO3_OFFLOAD) == host("0.19.4", stated)


def test_the_pinned_default_is_the_installed_deepspeeds() -> None:
    """DeepSpeed 0.19.8's own offload config classes default to pin_memory true (0.19.8 >= 0.19.5)."""
    offload_config = require_module("deepspeed.runtime.zero.offload_config")
    assert PINNED_OFFLOAD_DEFAULT_SINCE <= (0, 19, 8)
    assert offload_config.DeepSpeedZeroOffloadOptimizerConfig().pin_memory is True
    assert offload_config.DeepSpeedZeroOffloadParamConfig().pin_memory is True


def test_solve_json_names_the_release_it_priced(capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")
    default = run_cli(["solve", spec, "--json"], capsys)
    pinned = run_cli(["solve", spec, "--json", "--set", "training.deepspeed_version=0.18.5"], capsys)
    assert (default.exit_code, pinned.exit_code) == (0, 0)
    assert json.loads(default.stdout)["deepspeed_version"] == "0.19.8"
    assert json.loads(pinned.stdout)["deepspeed_version"] == "0.18.5"


def test_the_solver_leaves_zero12_where_the_release_flattens_on_a_small_host() -> None:
    """LLaMA-Factory #103's cluster: before 0.18.7 no ZeRO-1/2 plan fits its 256 GiB host, so the
    solver goes to ZeRO-3; on 0.19.8 ZeRO-1/2 flattens on the GPU and is the plan."""
    spec = LF103.replace("precision: fp16", "precision: bf16").replace("global_batch_size: 8", "global_batch_size: 64")
    # the whole model flattened on the host: the run's layout, without AutoTP (which would flatten a shard)
    spec = spec.replace("activation_checkpointing: true", "activation_checkpointing: true, tensor_parallel_size: 1")
    old = solve(_spec(spec.format(version="0.16")))
    new = solve(_spec(spec.format(version="0.19")))
    assert old.best is not None and new.best is not None
    assert old.best.plan.zero_stage == 3 and new.best.plan.zero_stage in (1, 2)
    refused = [alt for alt in old.alternatives if alt.zero_stage in (1, 2)]
    assert refused and all(alt.evaluation is not None for alt in refused)
    for alt in refused:
        assert alt.evaluation.memory.cpu.total >= 8 * 2 * 2 * LLAMA_2_13B_PARAMETERS


def test_solve_says_the_release_beside_the_hardware_when_it_is_not_the_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = str(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")
    old = run_cli(["solve", spec, "--set", "training.deepspeed_version=0.18.5"], capsys).stdout.splitlines()
    default = run_cli(["solve", spec], capsys).stdout.splitlines()
    assert [line for line in old if line.startswith("hardware")] == ["hardware  1 x 8 x h100-80gb, DeepSpeed 0.18.5"]
    assert [line for line in default if line.startswith("hardware")] == ["hardware  1 x 8 x h100-80gb"]


LIT_LLAMA_397 = (  # https://github.com/Lightning-AI/lit-llama/issues/397 (ZeRO-2 + CPU optimizer offload, 4 x A100 40GB)
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.28 GiB (GPU 0; 39.39 GiB total capacity; "
    "31.38 GiB already allocated; 5.79 GiB free; 31.40 GiB reserved in total by PyTorch)"
)
LLAMA_2_7B_PARAMETERS = 6_738_415_616  # meta-llama/Llama-2-7b-hf
ZERO2_OFFLOAD = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
}
LIT_LLAMA_SPEC = """
model: {{preset: llama-2-7b}}
hardware: {{gpu: a100-40gb, gpus_per_node: 4}}
training: {{sequence_length: 512, global_batch_size: 4, deepspeed_version: {version}}}
"""


@pytest.mark.parametrize(
    ("version", "reading"),
    [("0.16.9", "write the updated weights back"), ("0.17.5", "check that the config's offload_optimizer block")],
)
def test_an_fp32_partition_request_under_zero2_offload_is_named_by_release(version: str, reading: str) -> None:
    """The published 6.28 GiB request is one rank's fp32 partition of a 7B model over 4 ranks
    (4 B x P / 4). DeepSpeed 0.14.1-0.16.x makes that copy on the GPU in step(); on other releases
    CPU offload keeps it on the host, so the request says the optimizer was not offloaded."""
    assert pytest.approx(6.28, abs=0.005) == 4 * LLAMA_2_7B_PARAMETERS / 4 / 2**30
    d = doctor(ZERO2_OFFLOAD, _spec(LIT_LLAMA_SPEC.format(version=version)), error=LIT_LLAMA_397)
    notes = " ".join(d.oom.notes) if d.oom is not None else ""
    assert reading in notes, notes


ONE_GPU_OFFLOAD = """
model: {{preset: llama-2-7b}}
hardware: {{gpu: a100-80gb, gpus_per_node: {gpus}, cpu_memory_gib: 1024}}
training: {{sequence_length: 512, global_batch_size: {gpus}, deepspeed_version: {version}}}
"""


def _optimizer_step(config: dict[str, object], version: str, gpus: int = 1) -> int:
    spec = _spec(ONE_GPU_OFFLOAD.format(version=version, gpus=gpus))
    return doctor(config, spec).evaluation.memory.gpu.optimizer_step


@pytest.mark.parametrize("gpus", [1, 4])
@pytest.mark.parametrize(("inside", "outside"), [("0.14.1", "0.14.0"), ("0.16.9", "0.17.0")])
def test_zero2_offload_writes_back_through_an_fp32_gpu_copy_from_0_14_1_to_0_16(
    gpus: int, inside: str, outside: str
) -> None:
    """DeepSpeed 0.14.1 (#5301) to 0.16.x copy the updated fp32 partition to the GPU before casting
    it into the 16-bit weights (``fp32_partition.to(device)`` in ``step``); 0.14.0 cast on the host,
    0.17.0 (#7309) stages through a 16-bit host buffer. The step needs 4 B x P / ranks more there."""
    extra = _optimizer_step(ZERO2_OFFLOAD, inside, gpus) - _optimizer_step(ZERO2_OFFLOAD, outside, gpus)
    assert extra == pytest.approx(4 * LLAMA_2_7B_PARAMETERS / gpus, rel=0.002)


def test_the_write_back_copy_is_zero12_cpu_offload_only() -> None:
    """Without offload the step already holds the fp32 partition on the GPU, and ZeRO-3 offload
    writes back through its own path (stage3.py): neither changes between those releases."""
    zero3_offload = {**ZERO2_OFFLOAD, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    no_offload = {**ZERO2_OFFLOAD, "zero_optimization": {"stage": 2}}
    for config in (zero3_offload, no_offload):
        assert _optimizer_step(config, "0.16.9", 4) == _optimizer_step(config, "0.17.0", 4)


def test_the_installed_deepspeed_stages_the_write_back_on_the_host() -> None:
    """Installed DeepSpeed 0.19.8 (after #7309) copies the fp32 partition into a 16-bit host buffer
    and only that buffer goes to the GPU, which is why the default release prices no GPU copy."""
    import inspect

    stage_1_and_2 = require_module("deepspeed.runtime.zero.stage_1_and_2")
    step = inspect.getsource(stage_1_and_2.DeepSpeedZeroOptimizer.step)
    assert "bit16_partition_buffer.data.copy_(fp32_partition.data)" in step
    assert "fp32_partition.to(" not in step
