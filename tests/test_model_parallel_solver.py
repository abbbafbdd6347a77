"""AutoTP and AutoEP as search dimensions: what the solver proposes, refuses and reports.

The layouts it may propose are DeepSpeed's (dsgen.facts.model_parallel, each rule checked against DeepSpeed
in tests/test_model_parallel_rules.py) within what dsgen prices (dsgen.search.model_parallel_choices); the
choice between them is the ranking rule's like every other dimension (docs/how-dsgen-chooses.md): never
a plan slower and larger than another, and within the step-time model's measured error room to spare
below the safe line first, then fewer moving parts (model parallelism is one), then the simpler plan.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsgen.api import load_spec, solve_spec
from dsgen.errors import DsgenError
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND
from dsgen.search.solver import SolveResult
from dsgen.search.verdict import ROOM_LINE, SAFE_LINE
from tests.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _solve(text: str, tmp_path: Path, *overrides: str) -> SolveResult:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return solve_spec(load_spec(path, list(overrides)))


MOE = """
model: {preset: qwen3-30b-a3b}
hardware: {gpu: h100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 2048}
training: {sequence_length: 4096, global_batch_size: 64, attention: flash}
"""


def _fastest(result: SolveResult, keep) -> float:  # type: ignore[no-untyped-def]
    return min(e.step.total_s for e in result.ranked if keep(e.plan))


def test_an_moe_model_on_one_node_gets_autoep_when_it_beats_zero3_beyond_the_band(tmp_path: Path) -> None:
    result = _solve(MOE, tmp_path)
    assert result.best is not None and result.feasible
    assert result.best.plan.expert_parallel_size > 1
    without = _fastest(result, lambda p: p.expert_parallel_size == 1)
    assert without > result.best.step.total_s * (1 + STEP_TIME_TIE_BAND)
    # explain lists the layouts not chosen, the plain one among them
    labels = [label for label, _, _ in result.model_parallel_alternatives]
    assert "none" in labels


def test_a_dense_8b_model_on_one_node_takes_autotp_2_when_only_model_parallelism_leaves_room_within_the_band(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The flagship example (Llama-3.1-8B, 8 x H100, 4,096 tokens). The fastest plan, plain ZeRO, is
    predicted above the room line, close to the safe line, and so is every plain (TP 1) plan within the
    step-time band of it; the plans in the band with room to spare all use AutoTP. Room goes before
    moving parts, so an AutoTP plan is chosen: the one with no offload (fewer moving parts), the smallest
    TP degree and the lowest ZeRO stage among them (the simpler plan)."""
    example = str(EXAMPLES / "llama-3.1-8b-8xh100.yaml")
    result = solve_spec(load_spec(example))
    best = result.best
    assert best is not None
    fastest = min(result.ranked, key=lambda e: e.step.total_s)
    band = [e for e in result.ranked if e.step.total_s <= fastest.step.total_s * (1 + STEP_TIME_TIE_BAND)]
    assert fastest.plan.tensor_parallel_size == 1 and ROOM_LINE < fastest.fit.fill <= SAFE_LINE
    assert all(e.fit.fill > ROOM_LINE for e in band if e.plan.tensor_parallel_size == 1)
    room = [e for e in band if e.fit.fill <= ROOM_LINE]
    assert room and all(e.plan.tensor_parallel_size > 1 for e in room)
    assert best in room
    plain = [e for e in room if e.plan.offload_optimizer == e.plan.offload_param == "none"]
    smallest = min(e.plan.tensor_parallel_size for e in plain)
    lowest = min(e.plan.zero_stage for e in plain if e.plan.tensor_parallel_size == smallest)
    assert best.plan.offload_optimizer == best.plan.offload_param == "none"
    assert (best.plan.tensor_parallel_size, best.plan.zero_stage) == (smallest, lowest) == (2, 1)
    # never a plan slower and larger (GPU and host peak) than another feasible plan
    assert not any(
        e.step.total_s <= best.step.total_s
        and e.memory.gpu.total <= best.memory.gpu.total
        and e.memory.cpu.total <= best.memory.cpu.total
        and (e.step.total_s, e.memory.gpu.total, e.memory.cpu.total)
        != (best.step.total_s, best.memory.gpu.total, best.memory.cpu.total)
        for e in result.ranked
    )
    body = json.loads(run_cli(["solve", example, "--json"], capsys).stdout)
    assert (body["plan"]["tensor_parallel_size"], body["plan"]["expert_parallel_size"]) == (2, 1)
    assert "room to spare" in body["decided_by"]
    layouts = {a["layout"]: a for a in body["model_parallel_alternatives"]}
    assert set(layouts) >= {"none", "AutoTP 4", "AutoTP 8"}
    assert layouts["none"]["step_time_s"] == pytest.approx(fastest.step.total_s, abs=1e-6)  # the faster plain plan


def test_a_pinned_tp_degree_splits_the_batch_over_world_over_tp(tmp_path: Path) -> None:
    example = str(EXAMPLES / "llama-3.1-8b-8xh100.yaml")
    result = solve_spec(load_spec(example, ["constraints.tensor_parallel_size=2"]))
    assert result.best is not None
    plan = result.best.plan
    assert plan.tensor_parallel_size == 2 and plan.batch_parallel_size == 4 and plan.zero_ranks == 4
    assert plan.micro_batch_size * plan.gradient_accumulation_steps * 4 == 256 == plan.global_batch_size
    assert plan.deepspeed_train_batch_size == 512  # what DeepSpeed asserts: every rank counted


@pytest.mark.parametrize(
    ("text", "override", "key", "words"),
    [
        (MOE, "constraints.tensor_parallel_size=2", "constraints.tensor_parallel_size", "mixture of experts"),
        (MOE, "constraints.expert_parallel_size=3", "constraints.expert_parallel_size", "does not divide the 128"),
        (
            "model: {preset: llama-3.1-8b}\nhardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
            "training: {sequence_length: 4096, global_batch_size: 64}\n",
            "constraints.expert_parallel_size=2",
            "constraints.expert_parallel_size",
            "not a mixture of experts",
        ),
        (
            "model: {preset: llama-3.1-8b}\nhardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
            "training: {sequence_length: 4096, global_batch_size: 64}\n",
            "constraints.tensor_parallel_size=16",
            "constraints.tensor_parallel_size",
            "does not divide the 8 GPUs of a node",
        ),
        (
            "model: {preset: llama-3.1-8b}\nhardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
            "training: {sequence_length: 4096, global_batch_size: 64}\n"
            "constraints: {sequence_parallel_size: 2}\n",
            "constraints.tensor_parallel_size=2",
            "constraints.tensor_parallel_size",
            "mutually exclusive",
        ),
        (
            "model: {preset: llama-3.1-8b}\nhardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
            "training: {sequence_length: 4096, global_batch_size: 64, finetuning: lora}\n",
            "constraints.tensor_parallel_size=2",
            "constraints.tensor_parallel_size",
            "full training, not lora",
        ),
        (
            "model: {preset: llama-3.1-8b}\nhardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
            "training: {sequence_length: 4096, global_batch_size: 64, deepspeed_version: '0.16.3'}\n",
            "constraints.tensor_parallel_size=2",
            "constraints.tensor_parallel_size",
            "needs DeepSpeed 0.16.4",
        ),
    ],
)
def test_a_pinned_degree_dsgen_cannot_run_is_refused_naming_the_key(
    tmp_path: Path, text: str, override: str, key: str, words: str
) -> None:
    with pytest.raises(DsgenError) as raised:
        _solve(text, tmp_path, override)
    assert raised.value.path == key and words in str(raised.value)


def test_the_release_decides_which_stages_autotp_is_proposed_with(tmp_path: Path) -> None:
    """AutoTP with ZeRO-3 runs from DeepSpeed 0.19.4 (before, ``_configure_tensor_parallel_states``
    asserts); AutoTP itself from 0.16.4."""
    text = (
        "model: {preset: llama-3.1-8b}\nhardware: {gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 1024}\n"
        "training: {sequence_length: 4096, global_batch_size: 64, deepspeed_version: 'VERSION'}\n"
    )
    old = _solve(text.replace("VERSION", "0.19.3"), tmp_path)
    assert any(e.plan.tensor_parallel_size > 1 for e in old.ranked)
    assert not any(e.plan.tensor_parallel_size > 1 and e.plan.zero_stage == 3 for e in old.ranked)
    new = _solve(text.replace("VERSION", "0.19.8"), tmp_path)
    assert any(e.plan.tensor_parallel_size > 1 and e.plan.zero_stage == 3 for e in new.ranked)
    older = _solve(text.replace("VERSION", "0.16.3"), tmp_path)
    assert not any(e.plan.tensor_parallel_size > 1 for e in older.ranked)


def test_a_sweep_varies_the_tp_degree_like_any_other_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "base.yaml").write_text((EXAMPLES / "llama-3.1-8b-8xh100.yaml").read_text())
    (tmp_path / "sweep.yaml").write_text(
        'base: base.yaml\nname: "tp{{ constraints.tensor_parallel_size }}"\n'
        "grid:\n  constraints.tensor_parallel_size: [1, 2, 8]\n"
    )
    result = run_cli(["sweep", str(tmp_path / "sweep.yaml"), "--dry-run", "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["name"], r["tensor_parallel_size"], r["expert_parallel_size"]) for r in rows] == [
        ("tp1", 1, 1),
        ("tp2", 2, 1),
        ("tp8", 8, 1),
    ]
    # the ranks with distinct micro-batches: 8 GPUs / TP, and the batch is met over them
    for row, tp in zip(rows, (1, 2, 8), strict=True):
        assert row["data_parallel_size"] == 8 // tp
        assert row["micro_batch_size"] * row["gradient_accumulation_steps"] * (8 // tp) == row["global_batch_size"] == 256
