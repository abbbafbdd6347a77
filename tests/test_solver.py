"""Solver behaviour: exact batches, pins respected, plans fit by their own numbers, determinism,
and the choices an expert would make on well-known setups."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings

from dsgen.api import load_spec, solve_spec
from dsgen.errors import DsgenError, ExitCode, InfeasibleError
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND
from dsgen.intake.loader import load_spec_text, spec_from_data
from dsgen.reporting.report import result_dict
from dsgen.search.global_batch import resolve_global_batch
from dsgen.search.ranking import TIE_RANKED
from dsgen.search.solver import require_feasible
from dsgen.spec.yaml_source import SourceMap
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR
from tests.spec_strategies import specs

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def spec_from(text: str):
    return load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)


def base(
    model: str,
    gpu: str,
    gpus: int = 8,
    nodes: int = 1,
    seq: int = 4096,
    batch: int = 256,
    cpu: int = 1024,
    extra: str = "",
) -> str:
    return (
        f"model: {{preset: {model}}}\n"
        f"hardware: {{gpu: {gpu}, gpus_per_node: {gpus}, nodes: {nodes}, cpu_memory_gib: {cpu}}}\n"
        f"training: {{sequence_length: {seq}, global_batch_size: {batch}}}\n" + extra
    )


def _build(data: dict[str, Any]):
    return spec_from_data(data, SourceMap(None), base_dir=EXAMPLES_DIR)


@SETTINGS
@given(data=specs())
def test_global_batch_is_met_exactly_and_plans_fit_by_their_own_numbers(data: dict[str, Any]) -> None:
    spec = _build(data)
    result = solve_spec(spec)
    for e in result.ranked:
        p = e.plan
        assert (
            p.micro_batch_size * p.gradient_accumulation_steps * p.batch_parallel_size
            == data["training"]["global_batch_size"]
        )
        assert e.memory.gpu.total <= e.usable_gpu_bytes
        assert e.memory.cpu.total <= e.usable_cpu_bytes
        assert e.memory.nvme.total <= e.memory.nvme.capacity
    # the tie rule: every plan placed by it is within the band of the fastest plan it was preferred
    # to (none of the later plans is faster by more than the band); the rest follow by time
    times = [e.step.total_s for e in result.ranked]
    for i, t in enumerate(times[:TIE_RANKED]):
        assert t <= min(times[i:]) * (1 + STEP_TIME_TIE_BAND) + 1e-9
    tail = [round(t, 9) for t in times[TIE_RANKED:]]
    assert tail == sorted(tail)


@SETTINGS
@given(data=specs())
def test_pinned_dimensions_are_respected(data: dict[str, Any]) -> None:
    spec = _build(data)
    result = solve_spec(spec)
    pins = data.get("constraints", {})
    for e in result.ranked:
        if "zero_stage" in pins:
            assert e.plan.zero_stage == pins["zero_stage"]
        if "activation_checkpointing" in pins:
            expected = {False: "none", True: "full", "selective": "selective"}[pins["activation_checkpointing"]]
            assert e.plan.checkpointing == expected


@SETTINGS
@given(data=specs())
def test_more_gpu_memory_never_gives_a_slower_plan(data: dict[str, Any]) -> None:
    spec = _build(data)
    bigger = replace(
        spec,
        hardware=replace(spec.hardware, gpu=replace(spec.hardware.gpu, memory_gib=spec.hardware.gpu.memory_gib * 2)),
    )
    small, large = solve_spec(spec), solve_spec(bigger)
    if small.feasible:
        assert large.feasible
        assert large.best is not None and small.best is not None
        # within the tie band: a simpler plan may be preferred to one the model cannot tell apart
        assert large.best.step.total_s <= small.best.step.total_s * (1 + STEP_TIME_TIE_BAND) + 1e-12


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=specs())
def test_no_pinned_micro_batch_beats_the_free_choice(data: dict[str, Any]) -> None:
    """The search's pruning must never hide a faster split: pinning each micro-batch in turn (a
    search with nothing to prune across splits) finds nothing the free search missed. A pinned
    split that fits only with the long-context tricks is not a miss: those join the search only
    when no plain plan fits (they need training-script changes), and the free search had one."""
    spec = _build(data)
    assume(spec.constraints.micro_batch_size is None and spec.constraints.gradient_accumulation_steps is None)
    free = solve_spec(spec)
    dp = spec.hardware.world_size
    per_rank = resolve_global_batch(spec, dp).sequences // dp
    for micro in (m for m in range(1, per_rank + 1) if per_rank % m == 0):
        pinned = solve_spec(replace(spec, constraints=replace(spec.constraints, micro_batch_size=micro)))
        if pinned.feasible and pinned.best is not None and not pinned.best.plan.long_context.active:
            assert free.feasible and free.best is not None
            limit = pinned.best.step.total_s * (1 + STEP_TIME_TIE_BAND) + 1e-12  # the tie rule
            assert free.best.step.total_s <= limit, (micro, free.best.plan)


def test_zero2_single_step_split_is_found_after_an_accumulating_one_overflows() -> None:
    """ZeRO-2 holds two gradient buffers only while it accumulates: here 2 x 2 overflows the GPU
    while 4 x 1 fits, and is twice as fast as the 1 x 4 that also fits."""
    spec = spec_from(
        "model: {preset: llama-3.1-8b}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 4, nodes: 1, cpu_memory_gib: 1024}\n"
        "training: {sequence_length: 128, global_batch_size: 16, precision: fp32}\n"
        "constraints: {zero_stage: 2, offload_optimizer: none, activation_checkpointing: false, tensor_parallel_size: 1}\n"
    )
    splits = {
        micro: solve_spec(replace(spec, constraints=replace(spec.constraints, micro_batch_size=micro)))
        for micro in (1, 2, 4)
    }
    assert splits[1].feasible and not splits[2].feasible and splits[4].feasible  # the shape of the trap
    best = require_feasible(solve_spec(spec))
    assert (best.plan.micro_batch_size, best.plan.gradient_accumulation_steps) == (4, 1)
    assert best.step.total_s == require_feasible(splits[4]).step.total_s


@SETTINGS
@given(data=specs())
def test_same_spec_gives_byte_identical_output(data: dict[str, Any]) -> None:
    first = json.dumps(result_dict(solve_spec(_build(data))))
    second = json.dumps(result_dict(solve_spec(_build(data))))
    assert first == second


def test_seven_b_on_eight_80gb_gpus_does_not_offload() -> None:
    result = solve_spec(spec_from(base("llama-3.1-8b", "h100-80gb")))
    assert result.feasible and result.best is not None
    assert result.best.plan.offload_optimizer == "none" and result.best.plan.offload_param == "none"


def test_seventy_b_on_one_node_must_offload_and_states_host_ram() -> None:
    result = solve_spec(spec_from(base("llama-3.1-70b", "a100-80gb", batch=64, cpu=2048)))
    assert result.feasible and result.best is not None
    assert result.best.plan.offload_optimizer != "none"
    assert result.best.memory.cpu.offloaded_states > 70e9 * 12  # fp32 master + Adam moments
    small_host = solve_spec(spec_from(base("llama-3.1-70b", "a100-80gb", batch=64, cpu=512)))
    with pytest.raises(InfeasibleError, match="host RAM per node"):
        require_feasible(small_host)


def test_a_host_verdict_on_the_default_node_size_says_it_was_assumed() -> None:
    """A spec without hardware.cpu_memory_gib is priced against the schema's default: the solver is
    bounded by it as by a stated size, but the message, the hint and the JSON say it was assumed,
    and the verdict calls host-oom only on the stated size (on the assumed one it is the GPU's)."""
    stated = solve_spec(spec_from(base("llama-3.1-70b", "a100-80gb", batch=64, cpu=512)))
    unstated = solve_spec(spec_from(base("llama-3.1-70b", "a100-80gb", batch=64).replace(", cpu_memory_gib: 1024", "")))
    assert stated.closest is not None and unstated.closest is not None
    assert stated.closest.memory.cpu == replace(unstated.closest.memory.cpu, capacity_assumed=False)
    with pytest.raises(InfeasibleError) as told:
        require_feasible(unstated)
    assert "hardware.cpu_memory_gib not set: 512.0 GiB per node assumed" in str(told.value)
    assert "set hardware.cpu_memory_gib to the node's RAM" in (told.value.hint or "")
    with pytest.raises(InfeasibleError) as stated_told:
        require_feasible(stated)
    assert "assumed" not in str(stated_told.value) and "assumed" not in (stated_told.value.hint or "")
    assert result_dict(unstated)["memory"]["cpu"]["capacity_assumed"] is True
    assert result_dict(stated)["memory"]["cpu"]["capacity_assumed"] is False
    assert stated.closest.fit.verdict == "host-oom" and not stated.closest.host_unjudged
    assert unstated.closest.host_unjudged
    assert unstated.closest.fit.verdict in ("fits", "tight", "oom")
    assert unstated.closest.fit.fill == stated.closest.fit.fill


def test_model_that_fits_with_zero1_is_not_put_on_zero3() -> None:
    result = solve_spec(spec_from(base("gpt2", "a100-80gb", seq=1024, batch=64)))
    assert result.feasible and result.best is not None
    assert result.best.plan.zero_stage < 3


def test_eager_attention_at_long_context_recomputes_attention_not_whole_layers() -> None:
    # Korthikanti et al.: the s x s attention tensors dominate at 4k context with eager attention;
    # recomputing just the attention frees them for a few percent of extra compute.
    eager = base("llama-3.1-8b", "a100-80gb", batch=64).replace(
        "global_batch_size: 64", "global_batch_size: 64, attention: eager"
    )
    result = solve_spec(spec_from(eager))
    assert result.best is not None
    assert result.best.plan.checkpointing == "selective"
    # flash attention keeps no s x s tensors, so selective would only cost time: never proposed
    flash = solve_spec(spec_from(base("llama-3.1-8b", "a100-80gb", batch=64)))
    assert all(e.plan.checkpointing != "selective" for e in flash.ranked)


def test_v100_trains_in_fp16() -> None:
    result = solve_spec(spec_from(base("mistral-7b", "v100-32gb", nodes=2, seq=2048, batch=128)))
    assert result.best is not None and result.best.plan.precision == "fp16"


def test_fully_pinned_plan_is_reported_even_when_it_does_not_fit(capsys, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        base(
            "llama-3.1-70b",
            "a100-80gb",
            batch=64,
            extra=(
                "constraints: {zero_stage: 1, offload_optimizer: none, activation_checkpointing: false, micro_batch_size: 1}\n"
            ),
        )
    )
    result = run_cli(["solve", str(spec), "--json"], capsys)
    assert result.exit_code == ExitCode.INFEASIBLE
    body = json.loads(result.stdout)
    assert body["feasible"] is False
    assert body["plan"]["zero_stage"] == 1 and body["plan"]["micro_batch_size"] == 1
    assert body["memory"]["gpu"]["total"] > body["memory"]["gpu"]["capacity"]


def test_json_contract(capsys) -> None:
    result = run_cli(["solve", str(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml"), "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["feasible"] is True
    assert set(body["plan"]) >= {
        "precision",
        "zero_stage",
        "offload_optimizer",
        "offload_param",
        "activation_checkpointing",
        "selective_recompute",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "data_parallel_size",
        "global_batch_size",
    }
    gpu = body["memory"]["gpu"]
    for key in (
        "parameters",
        "gradients",
        "optimizer_states",
        "activations",
        "buffers",
        "overhead",
        "total",
        "capacity",
    ):
        assert isinstance(gpu[key], int) and gpu[key] >= 0
    # total is the peak of the two phases; forward/backward holds every term but the step's
    # gradient hand-off, the optimizer step holds no activations
    phases = gpu["phases"]
    assert gpu["total"] == max(phases.values())
    assert gpu["peak_phase"] in phases and phases[gpu["peak_phase"]] == gpu["total"]
    assert phases["forward_backward"] <= sum(
        gpu[k]
        for k in ("parameters", "gradients", "optimizer_states", "activations", "buffers", "transient", "overhead")
    )
    assert (
        phases["forward_backward"]
        >= gpu["parameters"] + gpu["optimizer_states"] + gpu["activations"] + gpu["buffers"] + gpu["transient"]
    )
    by_phase = gpu["gradients_by_phase"]
    assert gpu["gradients"] == max(by_phase.values())  # each term is its own largest value
    assert phases["optimizer_step"] >= gpu["parameters"] + by_phase["optimizer_step"] + gpu["optimizer_states"]
    assert body["accounting"] == "dsgen"
    for section in ("cpu", "nvme"):
        assert isinstance(body["memory"][section]["total"], int)
        assert isinstance(body["memory"][section]["capacity"], int)
    assert body["step_time_s"] > 0 and body["tokens_per_s"] > 0
    stages = sorted(alt["zero_stage"] for alt in body["alternatives"])
    assert stages == sorted({0, 1, 2, 3} - {body["plan"]["zero_stage"]})
    assert all({"feasible", "memory_gpu_total", "step_time_s", "reason"} <= set(alt) for alt in body["alternatives"])


def test_zero1_reports_the_backward_gradients_when_they_are_the_larger(capsys) -> None:
    """ZeRO-1 keeps every param.grad whole until the boundary reduction; with CPU optimizer offload
    the step itself holds only a largest-tensor staging buffer. ``gradients`` must be the former."""
    result = run_cli(
        [
            "solve",
            str(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml"),
            "--set",
            "constraints.zero_stage=1",
            "--set",
            "constraints.offload_optimizer=cpu",
            "--json",
        ],
        capsys,
    )
    assert result.exit_code == 0, result.stderr
    gpu = json.loads(result.stdout)["memory"]["gpu"]
    published = 8_030_261_248  # Llama-3.1-8B's parameter count (model card)
    staging = 2 * 128_256 * 4_096  # bf16 copy of the largest tensor, the 128,256 x 4,096 embedding
    assert gpu["gradients_by_phase"] == {"forward_backward": 2 * published + staging, "optimizer_step": staging}
    assert gpu["gradients"] == 2 * published + staging


def test_indivisible_batch_suggests_nearest() -> None:
    with pytest.raises(DsgenError) as info:
        solve_spec(spec_from(base("gpt2", "a100-80gb", batch=250)))
    assert "248 or 256" in str(info.value)


def test_new_writes_a_config_that_matches_the_plan(capsys, tmp_path: Path) -> None:
    out = tmp_path / "ds.json"
    result = run_cli(["new", str(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml"), "-o", str(out)], capsys)
    assert result.exit_code == 0, result.stderr
    config = json.loads(out.read_text())
    solved = solve_spec(load_spec(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml"))
    assert solved.best is not None
    plan = solved.best.plan
    assert config["zero_optimization"]["stage"] == plan.zero_stage
    assert config["train_micro_batch_size_per_gpu"] == plan.micro_batch_size
    assert config["bf16"] == {"enabled": True}
    assert "Your training script" in result.stdout and f"wrote {out}" in result.stdout


def test_tokens_per_step_is_converted_to_sequences() -> None:
    text = (
        "model: {preset: gpt2}\nhardware: {gpu: a100-80gb, gpus_per_node: 8}\n"
        "training: {sequence_length: 1024, tokens_per_step: 65536}\n"
    )
    result = solve_spec(spec_from(text))
    assert result.best is not None and result.best.plan.global_batch_size == 64
    assert result.batch_note is None


def test_exactly_one_of_batch_and_tokens() -> None:
    text = (
        "model: {preset: gpt2}\nhardware: {gpu: a100-80gb}\n"
        "training: {sequence_length: 1024, tokens_per_step: 65536, global_batch_size: 64}\n"
    )
    with pytest.raises(DsgenError, match="exactly one of global_batch_size or tokens_per_step"):
        spec_from(text)


def test_batch_rounding_nearest_picks_closest_and_says_so(capsys, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        base("gpt2", "a100-80gb", seq=1024, batch=250, extra="constraints: {allow_batch_rounding: nearest}\n")
    )
    result = run_cli(["solve", str(spec), "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["plan"]["global_batch_size"] == 248  # 250 is 2 from 248 and 6 from 256
    assert body["notes"] and "rounded" in body["notes"][0]
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        "model: {preset: gpt2}\nhardware: {gpu: a100-80gb, gpus_per_node: 8}\n"
        "training: {sequence_length: 1000, tokens_per_step: 100000}\nconstraints: {allow_batch_rounding: nearest}\n"
    )
    body = json.loads(run_cli(["solve", str(tokens), "--json"], capsys).stdout)
    assert body["plan"]["global_batch_size"] == 96  # 100 sequences -> nearest multiple of 8 is 96 (104 is farther)


def test_top_table_and_explain(capsys) -> None:
    example = str(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")
    table = run_cli(["solve", example, "--top", "10"], capsys)
    assert table.exit_code == 0
    rows = [line for line in table.stdout.splitlines() if line[:3].strip().isdigit()]
    assert len(rows) == 10
    body = json.loads(run_cli(["solve", example, "--json", "--top", "10"], capsys).stdout)
    times = [r["step_time_s"] for r in body["ranked"]]
    band = body["tie_band"]
    assert band == STEP_TIME_TIE_BAND and body["ranked"][0]["plan"] == body["plan"]
    assert all(t <= min(times[i:]) * (1 + band) + 1e-6 for i, t in enumerate(times))
    assert f"plans within {band:.0%} of the fastest remaining" in table.stdout
    assert "room to spare" in table.stdout and "#1: " in table.stdout  # the rule, and what decided #1
    assert all(r["verdict"] == "fits" and r["fill"] <= r["safe_line"] for r in body["ranked"])
    # every row's batch arithmetic holds for its own layout: micro x accumulation x its data-parallel
    # ranks (GPUs / TP) is the spec's batch, and the TP column shows the layout that varies
    header = next(line for line in table.stdout.splitlines() if line.split()[:2] == ["#", "stage"])
    columns = header.split()[: header.split().index("batch") + 1]  # single-word cells up to the batch
    assert "TP" in columns and {r["plan"]["tensor_parallel_size"] for r in body["ranked"]} != {1}
    for line in rows:
        cells = dict(zip(columns, line.split()[: len(columns)], strict=True))
        assert int(cells["micro"]) * int(cells["accum"]) * int(cells["DP"]) == int(cells["batch"]) == 256
        assert int(cells["DP"]) * int(cells["TP"]) == 8
    explained = run_cli(["explain", example], capsys)
    assert explained.exit_code == 0
    assert "ZeRO-0: " in explained.stdout and "GiB per GPU" in explained.stdout
    not_chosen = explained.stdout.split("model parallelism (AutoTP / AutoEP) not chosen:\n")[1]
    assert "\n  none: " in "\n" + not_chosen  # the chosen plan is AutoTP 2: the plain layout is listed
    assert "offload choices not chosen:" in explained.stdout and "compute" in explained.stdout
    assert "why this plan: " in explained.stdout


def test_slow_inter_node_link_moves_large_model_to_zeropp_only_as_far_as_allowed() -> None:
    """ZeRO++ quantization (qwZ, qgZ) changes numerics: only ``zeropp: full`` lets the solver use it."""

    def chosen(bandwidth: float, zeropp: str | None = None):
        text = base("llama-3.1-70b", "a100-80gb", nodes=4, batch=512, extra="").replace(
            "cpu_memory_gib: 1024}", f"cpu_memory_gib: 1024, inter_node_bandwidth_gbps: {bandwidth}}}"
        )
        if zeropp:
            text += f"constraints: {{zeropp: {zeropp}}}\n"
        result = solve_spec(spec_from(text))
        assert result.best is not None
        return result.best.plan

    assert chosen(50).knobs.hpz_partition_size == 1
    for zeropp in (None, "none", "hpz"):
        plan = chosen(6.25, zeropp)
        assert not plan.knobs.quantized_weights and not plan.knobs.quantized_gradients, zeropp
    assert chosen(6.25, "none").knobs.hpz_partition_size == 1
    slow = chosen(6.25, "full")
    assert slow.knobs.hpz_partition_size == 8 and slow.zero_stage == 3
    assert slow.knobs.quantized_weights and slow.knobs.quantized_gradients
