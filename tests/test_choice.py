"""The choice an expert would make (issue 48): no dominated plan, every pin honoured or refused by
name, and the cases the issue found, through the command a user runs.

What a pin means is read from the JSON's ``plan`` object (the output contract) and, for AutoEP,
from the DeepSpeed config ``dsgen new`` writes: not from the solver's own pin bookkeeping.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsgen.api import load_spec, solve_spec
from dsgen.errors import ExitCode
from dsgen.search.ranking import dominates
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR, REPO_ROOT, bench_module

#: constraint key -> (a spec it applies to, the pinned value, how the JSON plan shows the pin).
#: Each value differs from the free choice of its spec, so honouring it is a change the solver must make.
LLAMA_8B = {
    "model": {"preset": "llama-3.1-8b"},
    "hardware": {"gpu": "h100-80gb", "gpus_per_node": 8, "nodes": 2, "cpu_memory_gib": 1024},
    "training": {"sequence_length": 4096, "global_batch_size": 256},
}
QWEN3_MOE = {
    "model": {"preset": "qwen3-30b-a3b"},
    "hardware": {"gpu": "h100-80gb", "gpus_per_node": 8, "nodes": 1, "cpu_memory_gib": 2048},
    "training": {"sequence_length": 8192, "global_batch_size": 64},
}
PINS: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "zero_stage": (LLAMA_8B, 3, lambda plan: plan["zero_stage"] == 3),
    "offload_optimizer": (LLAMA_8B, "cpu", lambda plan: plan["offload_optimizer"] == "cpu"),
    "offload_param": (LLAMA_8B, "cpu", lambda plan: plan["offload_param"] == "cpu" and plan["zero_stage"] == 3),
    "activation_checkpointing": (LLAMA_8B, True, lambda plan: plan["activation_checkpointing"] is True),
    "micro_batch_size": (LLAMA_8B, 4, lambda plan: plan["micro_batch_size"] == 4),
    "gradient_accumulation_steps": (LLAMA_8B, 2, lambda plan: plan["gradient_accumulation_steps"] == 2),
    "zeropp": (LLAMA_8B, "hpz", lambda plan: plan["zeropp"]["hpz_partition_size"] > 1),
    "sequence_parallel_size": (LLAMA_8B, 2, lambda plan: plan["sequence_parallel_size"] == 2),
    "tiled_mlp": (LLAMA_8B, True, lambda plan: plan["tiled_mlp"] is True),
    "tiled_loss": (LLAMA_8B, True, lambda plan: plan["tiled_loss"] is True),
    "checkpoint_offload": (LLAMA_8B, True, lambda plan: plan["checkpoint_offload"] is True),
    "seq_parallel_communication_data_type": (
        {**LLAMA_8B, "constraints": {"sequence_parallel_size": 4}},
        "bf16",
        lambda plan: plan["seq_parallel_communication_data_type"] == "bf16" and plan["sequence_parallel_size"] == 4,
    ),
    "tensor_parallel_size": (LLAMA_8B, 4, lambda plan: plan["tensor_parallel_size"] == 4),
    "expert_parallel_size": (QWEN3_MOE, 4, lambda plan: plan["expert_parallel_size"] == 4),
    # not dimensions of a plan: the room the plan must leave, and whether the batch may be rounded
    "memory_headroom": (LLAMA_8B, 0.3, lambda plan: True),  # checked on the fill below
    "allow_batch_rounding": (
        {**LLAMA_8B, "training": {**LLAMA_8B["training"], "global_batch_size": 250}},
        "nearest",
        lambda plan: plan["global_batch_size"] == 256,  # 250 sequences do not split over 16 GPUs; 256 do
    ),
}


def test_every_constraint_key_of_the_schema_is_covered() -> None:
    schema = json.loads((REPO_ROOT / "schemas" / "spec.schema.json").read_text())
    constraints = schema["properties"]["constraints"]["properties"]
    assert set(constraints) == set(PINS)


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("key", sorted(PINS))
def test_a_pin_is_a_pin(key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, value, holds = PINS[key]
    doc = json.loads(json.dumps(base))
    doc.setdefault("constraints", {})[key] = value
    result = run_cli(["solve", str(_write(tmp_path, doc)), "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert holds(body["plan"]), (key, body["plan"])
    if key == "memory_headroom":
        assert body["memory"]["gpu"]["total"] <= 0.7 * body["memory"]["gpu"]["capacity"]
    # and every plan ranked carries it too
    ranked = json.loads(run_cli(["solve", str(_write(tmp_path, doc)), "--json", "--top", "20"], capsys).stdout)
    assert all(holds(row["plan"]) for row in ranked["ranked"])


@pytest.mark.parametrize(
    ("key", "value", "code", "gpu"),
    [
        ("zeropp", "hpz", ExitCode.BAD_INPUT, "h100-80gb"),  # one node: hpZ has no second node to spare
        ("expert_parallel_size", 3, ExitCode.BAD_INPUT, "h100-80gb"),  # divides neither 128 experts nor 8 GPUs
        ("tensor_parallel_size", 16, ExitCode.BAD_INPUT, "h100-80gb"),  # beyond the 8 GPUs of a node
        ("zero_stage", 0, ExitCode.INFEASIBLE, "h100-80gb"),  # every rank would hold all 30.5 B parameters
    ],
)
def test_a_pin_that_cannot_hold_is_refused_by_name(
    key: str, value: Any, code: ExitCode, gpu: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(json.dumps(QWEN3_MOE))
    doc["hardware"]["gpu"] = gpu
    doc["constraints"] = {key: value}
    result = run_cli(["solve", str(_write(tmp_path, doc))], capsys)
    assert result.exit_code == code
    assert key in (result.stderr if code == ExitCode.BAD_INPUT else result.stdout.split("DOES NOT FIT")[1])


@pytest.mark.parametrize(
    ("preset", "degree", "length"), [("qwen3-30b-a3b", 4, 8192), ("mixtral-8x7b", 8, 4096)]
)
def test_a_pinned_expert_parallel_degree_reaches_the_deepspeed_config(
    preset: str, degree: int, length: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's two cases: the unpinned layout was searched beside the pinned one and won its tie."""
    doc = json.loads(json.dumps(QWEN3_MOE))
    doc["model"] = {"preset": preset}
    doc["training"]["sequence_length"] = length
    doc["constraints"] = {"expert_parallel_size": degree}
    out = tmp_path / "ds_config.json"
    result = run_cli(["new", str(_write(tmp_path, doc)), "-o", str(out)], capsys)
    assert result.exit_code == 0, result.stderr
    config = json.loads(out.read_text())
    assert config["expert_parallel"]["autoep_size"] == degree


def _best(text: str):
    return solve_spec(load_spec(yaml.safe_load(text)))


def test_grpo_on_8_h100_takes_no_plan_slower_and_larger_than_one_it_priced() -> None:
    result = _best(
        "model: {preset: qwen2.5-7b}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 1024}\n"
        "training: {sequence_length: 768, global_batch_size: 64, objective: grpo}\n"
    )
    assert result.best is not None
    assert not any(dominates(e, result.best) for e in result.ranked)


def test_llama_3b_on_one_4090_takes_the_faster_smaller_checkpointed_plan() -> None:
    """The issue's second case: micro 1 without checkpointing was chosen over micro 2 with it,
    which dsgen itself priced faster and smaller."""
    result = _best(
        "model: {preset: llama-3.2-3b}\n"
        "hardware: {gpu: rtx-4090, gpus_per_node: 1, cpu_memory_gib: 128}\n"
        "training: {sequence_length: 2048, global_batch_size: 16}\n"
    )
    assert result.best is not None
    assert not any(dominates(e, result.best) for e in result.ranked)
    no_ckpt_micro1 = [e for e in result.ranked if e.plan.checkpointing == "none" and e.plan.micro_batch_size == 1]
    assert no_ckpt_micro1 and result.best not in no_ckpt_micro1


def test_a_wide_generated_set_never_chooses_a_dominated_plan_and_never_drops_a_pin() -> None:
    """bench/choice_check.py's generated specs (a smaller draw than the bench's 600): the same checks."""
    bench = bench_module("choice_check")
    rows = [bench.check(doc) for doc in bench.generated_specs(120, seed=7)]
    solved = [r for r in rows if r["status"] == "ok"]
    assert len(solved) >= 60
    assert all(r["dominated_any"] == 0 for r in solved)
    assert all(not r["unmet"] for r in solved)
    assert all(r["named"] for r in rows if r["status"] == "refused" and r["pin"] is not None)
    # the choice-only search new and sweep run chooses what the full search does, on fewer candidates
    priced = [r for r in rows if r["status"] != "refused"]
    assert all(r["same_as_pruned"] for r in priced)
    assert sum(r["pruned"] for r in priced) < 0.8 * sum(r["candidates"] for r in priced)


def test_every_example_chooses_an_undominated_plan_and_the_pruned_search_the_same() -> None:
    for path in sorted(EXAMPLES_DIR.glob("*.yaml")):
        spec = load_spec(path)
        result = solve_spec(spec)
        assert result.best is not None, path
        assert not any(dominates(e, result.best) for e in result.ranked), path
        pruned = solve_spec(spec, scope="choice")
        assert pruned.best == result.best and pruned.candidates_evaluated <= result.candidates_evaluated, path


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES_DIR.glob("*.yaml")))
def test_solve_top_and_explain_show_the_same_plans_numbers_and_order(
    example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 48: the ``--top`` table lists the JSON's ranked plans in its order, with its numbers;
    explain names the same plan, the same rule's reason and the same alternatives."""
    spec = str(EXAMPLES_DIR / example)
    body = json.loads(run_cli(["solve", spec, "--json", "--top", "10"], capsys).stdout)
    table = run_cli(["solve", spec, "--top", "10"], capsys).stdout
    explained = run_cli(["explain", spec], capsys).stdout
    if not body["feasible"]:
        assert "(no feasible plan)" in table
        return
    assert body["ranked"][0]["plan"] == body["plan"]
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["#", "stage"]) + 1
    rows = lines[start : start + len(body["ranked"])]
    assert [f"{r['step_time_s']:.3f}" for r in body["ranked"]] == [
        next(cell for cell in row.split() if cell.count(".") == 1 and len(cell.split(".")[1]) == 3) for row in rows
    ]
    assert f"#1: {body['decided_by']}" in table and f"why this plan: {body['decided_by']}" in explained
    for alt in body["alternatives"]:
        line = next(line for line in explained.splitlines() if line.startswith(f"  ZeRO-{alt['zero_stage']}: "))
        assert line == f"  ZeRO-{alt['zero_stage']}: {alt['reason']}"
    for alt in body["model_parallel_alternatives"]:
        assert f"  {alt['layout']}: {alt['reason']}; " in explained
    for alt in body["offload_alternatives"]:
        assert f"  {alt['offload']}: {alt['reason']}" in explained
