"""``dsgen doctor`` always leads somewhere (issue 48), through the CLI as a user runs it.

The run: a full fine-tune of Mistral-7B on two RTX 4090s with 128 GiB of host RAM, ZeRO-2 at
micro-batch 8 and 4,096 tokens (examples/doctor/ds_z2_micro8.json on
examples/doctor/cluster-mistral-2x4090.yaml, a spec without a global batch). Expectations come
from the JSON's own numbers (a shortfall is the predicted peak minus the limit), from DeepSpeed's
batch arithmetic (micro x accumulation x ranks), and from the doctor itself run on the cluster or
the method a lead points to (that run must then find what the lead promised).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from dsgen.api import doctor, load_spec
from dsgen.doctor.diagnose import Diagnosis, diagnose
from dsgen.doctor.keys import with_changes
from dsgen.doctor.spec_batch import doctor_spec
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND
from dsgen.search.ranking import rank_within_error
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR

CONFIG = EXAMPLES_DIR / "doctor" / "ds_z2_micro8.json"
SPEC = EXAMPLES_DIR / "doctor" / "cluster-mistral-2x4090.yaml"
GIB = 2**30


def _spec(tmp_path: Path, name: str = "spec.yaml", **replacements: str) -> Path:
    """The Mistral spec with some of its text replaced (e.g. the host RAM)."""
    text = SPEC.read_text(encoding="utf-8")
    for old, new in replacements.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _doctor_json(capsys: pytest.CaptureFixture[str], config: Path, spec: Path, *more: str) -> tuple[int, Any]:
    result = run_cli(["doctor", str(config), "--spec", str(spec), "--json", *more], capsys)
    assert "Traceback" not in result.stderr
    return result.exit_code, json.loads(result.stdout)


def _diagnose(config: Path, spec: Path) -> Diagnosis:
    """The doctor's Diagnosis as the CLI builds it (the spec loaded with the config's batch)."""
    return doctor(config, doctor_spec(spec, json.loads(config.read_text(encoding="utf-8"))))


def test_nothing_fits_shows_the_nearest_plans_and_what_each_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    code, body = _doctor_json(capsys, CONFIG, SPEC)
    assert code == 3 and body["verdict"] == "oom" and body["fixes"] == []
    nearest = body["nearest_plans"]
    assert 1 <= len(nearest) <= 3
    assert len({json.dumps(n["plan"], sort_keys=True) for n in nearest}) == len(nearest)  # different plans
    capacity = body["memory"]["gpu"]["capacity"]
    for near in nearest:
        # the limit is the spec's (default 10 %) headroom below capacity, as for the run itself
        assert near["gpu_limit"] == body["memory"]["gpu"]["usable"] == int(capacity * 0.9)
        assert near["host_limit"] == body["memory"]["cpu"]["usable"]
        assert near["short"]["gpu_bytes"] == max(0, near["memory_gpu_total"] - near["gpu_limit"])
        assert near["short"]["host_bytes"] == max(0, near["memory_cpu_total"] - near["host_limit"])
        lacks = near["short"]["gpu_bytes"] or near["short"]["host_bytes"] or near["short"]["nvme_bytes"]
        assert lacks or near["kernel_limit"]  # a near miss misses something
        assert near["plan"]["global_batch_size"] == 16  # the run's batch: micro 8 x accumulation 1 x 2 GPUs
    # nearest first: by the tightest resource's ratio to its limit
    ratios = [max(n["memory_gpu_total"] / n["gpu_limit"], n["memory_cpu_total"] / n["host_limit"]) for n in nearest]
    assert ratios == sorted(ratios)
    # the nearest misses by little: under 2 GiB of GPU memory, with host RAM to spare
    first = nearest[0]
    assert 0 < first["short"]["gpu_bytes"] < 3 * GIB and first["short"]["host_bytes"] == 0


def test_the_gpus_that_would_make_it_fit_are_the_fewest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The doctor names the fewest nodes like this one on which a plan fits: on that many the doctor
    finds fixes, on one node fewer it finds none."""
    _, body = _doctor_json(capsys, CONFIG, SPEC)
    more = body["more_gpus"]
    assert more is not None and more["nodes"] > 1
    assert more["world_size"] == more["nodes"] * 2 and more["gpus_per_node"] == 2
    assert more["memory_gpu_total"] <= body["safe_line"] * body["memory"]["gpu"]["capacity"]
    hardware = "hardware: {gpu: rtx-4090, gpus_per_node: 2, cpu_memory_gib: 128}"
    for nodes, fits in ((more["nodes"], True), (more["nodes"] - 1, False)):
        spec = _spec(tmp_path, f"nodes{nodes}.yaml", **{hardware: hardware[:-1] + f", nodes: {nodes}}}"})
        _, at = _doctor_json(capsys, CONFIG, spec)
        assert bool(at["fixes"]) is fits, nodes


def test_with_more_host_ram_the_run_gets_fixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With 256 GiB of host RAM (the issue's numbers) a fix fits, and no near misses are listed."""
    code, body = _doctor_json(capsys, CONFIG, _spec(tmp_path, **{"cpu_memory_gib: 128": "cpu_memory_gib: 256"}))
    assert code == 3 and body["verdict"] == "oom"  # the config as it is still runs out
    assert body["fixes"] and body["nearest_plans"] == [] and body["more_gpus"] is None
    for fix in body["fixes"]:
        assert fix["memory_gpu_total"] <= body["safe_line"] * body["memory"]["gpu"]["capacity"]


def test_the_text_leads_on_in_gib_and_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(["doctor", str(CONFIG), "--spec", str(SPEC)], capsys)
    assert result.exit_code == 3 and "Traceback" not in result.stderr
    out = result.stdout
    assert "the nearest, and what each lacks:" in out and "GiB short" in out
    assert "nodes like this one" in out and "x rtx-4090" in out
    assert "add GPUs or nodes, or shorten the sequence" not in out  # the old dead end


def test_lighter_methods_are_priced_at_their_own_best_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """LoRA and QLoRA do not fit at the crashed run's micro 8 without checkpointing, but do at their
    own best plans; each is offered with the config and script changes that plan needs, and the
    doctor run on that method with those changes finds the run fits."""
    _, body = _doctor_json(capsys, CONFIG, SPEC)
    methods = {fix["changes"]["training.finetuning"]: fix for fix in body["method_fixes"]}
    assert set(methods) == {"lora", "qlora"}
    config = json.loads(CONFIG.read_text(encoding="utf-8"))
    for method, fix in methods.items():
        as_is = _spec(
            tmp_path,
            f"{method}-as-is.yaml",
            **{"{sequence_length: 4096}": f"{{sequence_length: 4096, finetuning: {method}}}"},
        )
        at_crash = _diagnose(CONFIG, as_is)
        assert at_crash.evaluation is not None and not at_crash.evaluation.feasible, method  # the old pricing
        assert fix["memory_gpu_total"] <= body["safe_line"] * body["memory"]["gpu"]["capacity"]
        plan = fix["plan"]
        assert plan["micro_batch_size"] * plan["gradient_accumulation_steps"] * 2 == 16  # the run's batch, 2 GPUs
        checkpointing = any("activation checkpointing" in s for s in fix["script_changes"])
        spec = _spec(
            tmp_path,
            f"{method}.yaml",
            **{
                "{sequence_length: 4096}": f"{{sequence_length: 4096, finetuning: {method}}}\n"
                f"constraints: {{activation_checkpointing: {'true' if checkpointing else 'false'}}}"
            },
        )
        fixed = tmp_path / f"{method}.json"
        fixed.write_text(json.dumps(with_changes(config, fix["config_changes"])), encoding="utf-8")
        code, after = _doctor_json(capsys, fixed, spec)
        assert code == 0 and after["verdict"] == "fits", (method, after["verdict"])
        assert after["memory"]["gpu"]["total"] == fix["memory_gpu_total"]


def test_a_spec_without_a_global_batch_takes_the_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The spec's batch is optional when the config states one: micro 8 x accumulation 1 x 2 GPUs
    (DeepSpeed's train_batch_size) is the batch priced, as if the spec had said 16."""
    code, without = _doctor_json(capsys, CONFIG, SPEC)
    stated = _spec(tmp_path, **{"{sequence_length: 4096}": "{sequence_length: 4096, global_batch_size: 16}"})
    code_stated, with_batch = _doctor_json(capsys, CONFIG, stated)
    assert without["batch"]["train_batch_size"] == 8 * 1 * 2
    assert (code, without["memory"], without["plan"]) == (code_stated, with_batch["memory"], with_batch["plan"])
    assert not any(f["code"] == "spec-batch" for f in without["findings"])


def test_the_configs_auto_batch_comes_from_the_trainer_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "auto.json"
    config.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 2},
            }
        ),
        encoding="utf-8",
    )
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3, "bf16": True}))
    _, body = _doctor_json(capsys, config, SPEC, "--training-args", str(args))
    assert body["batch"]["train_batch_size"] == 2 * 3 * 2 == body["plan"]["global_batch_size"]
    # without the Trainer's arguments nothing states the batch: one clear error naming the key
    result = run_cli(["doctor", str(config), "--spec", str(SPEC)], capsys)
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "training.global_batch_size" in result.stderr and "--training-args" in result.stderr
    assert f"{SPEC}:" in result.stderr  # the file (and line) of the spec's training section


def test_fixes_follow_the_solvers_ranking_rule(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's example (Qwen2.5-7B on 8 x A100 40 GB): the fixes come in the order the solver's
    own rule puts their plans in, whatever order they are found in; and ZeRO-3 with checkpointing,
    a tie with the fastest fix, goes before the AutoTP fixes (model parallelism is a moving part)."""
    config = json.loads((EXAMPLES_DIR / "doctor" / "ds_config.json").read_text(encoding="utf-8"))
    diagnosis = diagnose(config, load_spec(EXAMPLES_DIR / "doctor" / "cluster.yaml"), max_fixes=1000)  # all found
    evaluations = [fix.evaluation for fix in diagnosis.fixes]
    assert len(evaluations) > 6
    shuffled = evaluations[:]
    random.Random(48).shuffle(shuffled)
    assert rank_within_error(shuffled, diagnosis.spec.model) == evaluations
    code, body = _doctor_json(
        capsys, EXAMPLES_DIR / "doctor" / "ds_config.json", EXAMPLES_DIR / "doctor" / "cluster.yaml"
    )
    assert code == 3 and body["verdict"] == "oom"  # the example run ran out of memory
    first, fastest = body["fixes"][0], min(body["fixes"], key=lambda f: f["step_time_s"])
    assert "tensor_parallel.autotp_size" not in first["changes"] and first["plan"]["zero_stage"] == 3
    assert first["step_time_s"] <= fastest["step_time_s"] * (1 + STEP_TIME_TIE_BAND)
    assert "tensor_parallel.autotp_size" in fastest["changes"]  # the faster fix it wins the tie against


def test_one_memory_percentage(capsys: pytest.CaptureFixture[str]) -> None:
    """The doctor's text shows one GPU-memory percentage, the fill of GPU memory."""
    for config, spec in (
        (CONFIG, SPEC),
        (EXAMPLES_DIR / "doctor" / "ds_config.json", EXAMPLES_DIR / "doctor" / "cluster.yaml"),
    ):
        out = run_cli(["doctor", str(config), "--spec", str(spec)], capsys).stdout
        assert "% of GPU memory" in out
        # every percentage "of" something is of GPU memory (or a share of one phase's memory)
        assert set(re.findall(r"% of ([A-Za-z]+(?: [A-Za-z]+)?)", out)) <= {"GPU memory", "that phase"}, out


def test_a_spec_without_a_batch_still_refuses_a_config_that_is_not_an_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "list.json"
    config.write_text("[1]", encoding="utf-8")
    result = run_cli(["doctor", str(config), "--spec", str(SPEC)], capsys)
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "must be a JSON object" in result.stderr
