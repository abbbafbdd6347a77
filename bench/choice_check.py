"""The solver's choice over a wide generated set of specs (issue 48): no chosen plan is dominated,
every pin is honoured or refused by name, and how many choices the ranking rule changed, and why.

For each spec (presets dense and MoE, GPUs from a 4090 to an H200, 1 to 16 GPUs, full training,
LoRA and QLoRA, SFT, DPO and GRPO, and one pinned constraint key in most of them) it solves and
checks:

* **dominance**: no feasible plan the search priced is no slower and no larger (GPU peak, host
  peak) than the chosen plan and better in one (:func:`beats`, compared here on the predicted
  numbers, not with dsgen's own ranking code); counted both over every plan and over the plans of
  the chosen plan's layout (AutoTP, AutoEP, Ulysses degree) that offload no more (the acceptance);
* **pins**: the chosen plan, as the output contract writes it (``plan_dict``: the ``plan`` object
  of ``solve --json``), carries the pinned value (:func:`pin_held`), or the solve ends in a
  ``DsgenError`` whose key path or message names the pinned key;
* **pruning**: the choice-only search (``scope="choice"``, what ``new`` and ``sweep`` run) gives the
  same chosen plan, or closest miss, as the full search, and how many candidates each priced;
* **changes**: the plan the rule before issue 48 would have chosen among the same feasible plans
  (the tie band, then simplicity alone: :func:`previous_choice`, kept here for the comparison),
  and which part of today's rule (``dsgen.search.ranking.decided_by``) made the difference.

Run: .venv/bin/python bench/choice_check.py [--count 600] [--seed 48]   (a minute or two)
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from itertools import takewhile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsgen.api import load_spec, solve_spec
from dsgen.errors import DsgenError
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND
from dsgen.plan import plan_dict
from dsgen.search.evaluation import Evaluation
from dsgen.search.knob_variants import default_knobs
from dsgen.search.ranking import has_room, moving_parts, rank_key, simplicity_key
from dsgen.search.solver import SolveResult

DENSE = ["gpt2-xl", "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "qwen2.5-14b"]
DENSE += ["gemma-2-9b", "phi-3-mini", "llama-3.1-70b"]
MOE = ["qwen3-30b-a3b", "mixtral-8x7b"]
GPUS = ["h100-80gb", "a100-80gb", "a100-40gb", "h200", "l40s", "rtx-4090", "v100-32gb"]
METHODS = [("full", "sft"), ("full", "sft"), ("lora", "sft"), ("qlora", "sft"), ("lora", "dpo"), ("full", "dpo")]
METHODS += [("lora", "grpo"), ("full", "grpo")]
#: one pinned key per spec (or none): key -> the values tried
PINS: dict[str, list[Any]] = {
    "zero_stage": [0, 1, 2, 3],
    "offload_optimizer": ["none", "cpu"],
    "offload_param": ["none", "cpu"],
    "activation_checkpointing": [False, True],
    "micro_batch_size": [1, 2, 4],
    "gradient_accumulation_steps": [1, 2, 4],
    "zeropp": ["none", "hpz"],
    "sequence_parallel_size": [1, 2, 4],
    "tiled_mlp": [False, True],
    "tiled_loss": [False, True],
    "checkpoint_offload": [False, True],
    "seq_parallel_communication_data_type": ["fp32", "bf16"],
    "tensor_parallel_size": [1, 2, 4],
    "expert_parallel_size": [1, 2, 4, 8],
}


def generated_specs(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` spec documents drawn with a fixed seed (the same set every run)."""
    draw = random.Random(seed)
    keys = [None, *PINS]
    found = []
    for _ in range(count):
        moe = draw.random() < 0.2
        model = draw.choice(MOE if moe else DENSE)
        method, objective = draw.choice(METHODS)
        gpus, nodes = draw.choice([(1, 1), (2, 1), (4, 1), (8, 1), (8, 2)])
        length = 768 if objective == "grpo" else draw.choice([1024, 2048, 4096, 8192])
        training: dict[str, Any] = {
            "sequence_length": length,
            # GRPO's completions of one prompt fall in one generation batch (num_generations: 8)
            "global_batch_size": gpus * nodes * draw.choice([1, 2, 4, 8, 16]) * (8 if objective == "grpo" else 1),
        }
        if method != "full":
            training["finetuning"] = method
        if objective != "sft":
            training["objective"] = objective
        spec: dict[str, Any] = {
            "model": {"preset": model},
            "hardware": {
                "gpu": draw.choice(GPUS),
                "gpus_per_node": gpus,
                "nodes": nodes,
                "cpu_memory_gib": draw.choice([128, 512, 2048]),
            },
            "training": training,
        }
        key = draw.choice(keys)
        if key is not None:
            spec["constraints"] = {key: draw.choice(PINS[key])}
        found.append(spec)
    return found


def previous_choice(ranked: list[Evaluation], result: SolveResult) -> Evaluation:
    """The plan the rule before issue 48 chose: within the band of the fastest, the simplest."""
    ordered = sorted(ranked, key=rank_key)
    limit = ordered[0].step.total_s * (1 + STEP_TIME_TIE_BAND)
    bases = {stage: default_knobs(result.spec.model, stage) for stage in range(4)}
    window = takewhile(lambda e: e.step.total_s <= limit, ordered)
    return min(window, key=lambda e: (simplicity_key(e, bases[e.plan.zero_stage]), rank_key(e)))


def _layout(e: Evaluation) -> tuple[int, int, int]:
    p = e.plan
    return (p.tensor_parallel_size, p.expert_parallel_size, p.long_context.sequence_parallel_size)


def _offloads(e: Evaluation) -> tuple[int, int, float]:
    p = e.plan
    ratio = p.offload_ratio if p.offload_optimizer != "none" else 0.0
    return (p.offload_param != "none", p.offload_optimizer != "none", ratio)


def beats(a: Evaluation, b: Evaluation) -> bool:
    """``a`` is no slower and no larger (GPU peak, host peak) than ``b``, and better in one."""
    mine = (a.step.total_s, a.memory.gpu.total, a.memory.cpu.total)
    theirs = (b.step.total_s, b.memory.gpu.total, b.memory.cpu.total)
    return all(x <= y for x, y in zip(mine, theirs, strict=True)) and mine != theirs


def pin_held(key: str, value: Any, plan: dict[str, Any]) -> bool:
    """Whether the output contract's ``plan`` object carries the pinned ``constraints.key: value``."""
    if key == "zeropp":
        on = (plan["zeropp"]["hpz_partition_size"] > 1, plan["zeropp"]["quantized_weights"])
        return on == {"none": (False, False), "hpz": (True, False), "full": (True, True)}[value]
    if key == "seq_parallel_communication_data_type" and plan["sequence_parallel_size"] == 1:
        return True  # DeepSpeed reads it only under Ulysses
    return bool(plan[key] == value)


def dominated_by(chosen: Evaluation, ranked: tuple[Evaluation, ...], same_layout: bool) -> list[Evaluation]:
    """The feasible plans that dominate ``chosen`` (of its layout, offloading no more, if asked)."""
    return [
        e
        for e in ranked
        if beats(e, chosen)
        and (not same_layout or (_layout(e) == _layout(chosen) and _offloads(e) <= _offloads(chosen)))
    ]


def why_changed(new: Evaluation, old: Evaluation, ranked: tuple[Evaluation, ...]) -> str:
    if dominated_by(old, ranked, same_layout=False):
        return "the old choice was dominated"
    if has_room(new) != has_room(old):
        return "room to spare below the safe line"
    if moving_parts(new) != moving_parts(old):
        return "fewer moving parts"
    return "other"


def check(spec_doc: dict[str, Any]) -> dict[str, Any]:
    """One spec's outcome: ``status`` ok / refused / infeasible, and the checks' findings."""
    pinned = next(iter(spec_doc.get("constraints", {})), None)
    try:
        spec = load_spec(spec_doc)
        result = solve_spec(spec)
        pruned = solve_spec(spec, scope="choice")
    except DsgenError as error:
        named = pinned is not None and (pinned in (error.path or "") or pinned in str(error))
        return {"status": "refused", "pin": pinned, "named": named, "message": str(error)}
    same = pruned.best == result.best and pruned.closest == result.closest
    counts = {"same_as_pruned": same, "candidates": result.candidates_evaluated, "pruned": pruned.candidates_evaluated}
    if not result.feasible or result.best is None:
        return {"status": "infeasible", "pin": pinned, **counts}
    best, ranked = result.best, result.ranked
    old = previous_choice(list(ranked), result)
    return {
        "status": "ok",
        "pin": pinned,
        "unmet": pinned is not None and not pin_held(pinned, spec_doc["constraints"][pinned], plan_dict(best.plan)),
        "dominated_any": len(dominated_by(best, ranked, same_layout=False)),
        "dominated_layout": len(dominated_by(best, ranked, same_layout=True)),
        "changed": old is not best and old.plan != best.plan,
        "why": why_changed(best, old, ranked) if old is not best and old.plan != best.plan else None,
        **counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("--seed", type=int, default=48)
    args = parser.parse_args()
    rows = [check(doc) for doc in generated_specs(args.count, args.seed)]
    status = Counter(r["status"] for r in rows)
    ok = [r for r in rows if r["status"] == "ok"]
    print(f"specs: {len(rows)} ({status['ok']} solved, {status['infeasible']} infeasible, {status['refused']} refused)")
    print(
        f"chosen plans dominated by a feasible plan of the same layout offloading no more: "
        f"{sum(r['dominated_layout'] > 0 for r in ok)}"
    )
    print(f"chosen plans dominated by any feasible plan: {sum(r['dominated_any'] > 0 for r in ok)}")
    pinned = [r for r in rows if r["pin"] is not None]
    honoured = sum(r["status"] == "ok" and not r["unmet"] for r in pinned)
    refused = sum(r["status"] == "refused" and r["named"] for r in pinned)
    unnamed = [r for r in pinned if r["status"] == "refused" and not r["named"]]
    dropped = [r for r in pinned if r["status"] == "ok" and r["unmet"]]
    infeasible = sum(r["status"] == "infeasible" for r in pinned)
    print(
        f"pinned specs: {len(pinned)}: honoured {honoured}, refused naming the key {refused}, "
        f"no plan fits (exit 3) {infeasible}, refused without naming it {len(unnamed)}, pin dropped {len(dropped)}"
    )
    for r in unnamed[:5]:
        print(f"  refused without naming {r['pin']}: {r['message']}")
    priced = [r for r in rows if r["status"] != "refused"]
    print(
        f"the choice-only search (new, sweep) against the full one: the same plan (or closest miss) on "
        f"{sum(r['same_as_pruned'] for r in priced)} of {len(priced)} specs, "
        f"{sum(r['pruned'] for r in priced):,} candidates priced against {sum(r['candidates'] for r in priced):,}"
    )
    changed = Counter(r["why"] for r in ok if r["changed"])
    print(f"choices changed against the rule before issue 48: {sum(changed.values())} of {len(ok)}")
    for why, n in changed.most_common():
        print(f"  {n:4}  {why}")


if __name__ == "__main__":
    main()
