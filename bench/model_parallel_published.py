"""Score dsgen on published AutoTP / AutoEP runs (bench/data/model_parallel_runs.yaml).

Each case becomes a fully pinned spec (stage, no offload, checkpointing, micro-batch, accumulation,
the AutoTP and AutoEP degrees, ``memory_headroom`` 0), so ``solve`` prices exactly the plan that ran.
For each case it prints dsgen's predicted per-GPU peak, the published figure and the verdict; for
each published pair (plain ZeRO against AutoTP/AutoEP, the corpus's ``pair``) whether dsgen orders the
two the same way in memory and in tokens per second. A case dsgen cannot express (a model family it
lacks, a layout it does not price) is listed as not scored, with the reason.

    .venv/bin/python bench/model_parallel_published.py

The corpus was collected blind (its header says how); no term was moved to flip a case.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from outcome_specs import build_spec, load_corpus

from dsgen.api import solve_spec
from dsgen.errors import DsgenError
from dsgen.search.evaluation import Evaluation
from dsgen.units import GIB

#: the corpus's architecture keys that dsgen's ``architecture`` block takes as they are
ARCHITECTURE_KEYS = (
    "family",
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "attention_bias",
    "num_experts",
    "experts_per_token",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)
#: keys that describe a layout dsgen's architecture block cannot state (a case using them is not scored)
UNEXPRESSIBLE = ("linear_attention_layers", "intermediate_size_mlp")


def architecture(model: dict[str, Any]) -> dict[str, Any]:
    """The corpus model as dsgen's ``architecture`` block, or a DsgenError naming what it lacks."""
    lacking = [key for key in UNEXPRESSIBLE if model.get(key)]
    if model.get("shared_experts", 0) > 1:
        lacking.append("shared_experts > 1")
    if lacking:
        raise DsgenError(f"dsgen's architecture block cannot state {', '.join(lacking)}")
    block = {key: model[key] for key in ARCHITECTURE_KEYS if model.get(key) is not None}
    if model.get("moe_intermediate_size") == model.get("intermediate_size") and block.get("family") == "mixtral":
        block.pop("moe_intermediate_size")  # Mixtral's experts have the MLP width
    return block


def case_mapping(case: dict[str, Any], corpus: dict[str, Any]) -> dict[str, Any]:
    """The fully pinned spec of ``case``."""
    if case.get("offload", "none") != "none":
        raise DsgenError(f"offload {case['offload']} is not pinned by this bench")
    missing = [k for k in ("micro_batch_size", "sequence_length") if case.get(k) is None]
    if missing:
        raise DsgenError(f"the source states no {', '.join(missing)}")
    # an unstated accumulation is priced as 1: the per-GPU peak does not depend on it except for
    # ZeRO-2's second gradient buffer while accumulating (ACCUMULATION_ASSUMED marks those cases)
    accumulation = case.get("gradient_accumulation_steps") or 1
    gpu = case["gpu"]
    world = case["gpus_per_node"] * case["nodes"]
    tp, ep = case["tensor_parallel_size"], case["expert_parallel_size"]
    return {
        "model": {"architecture": architecture(corpus["models"][case["model"]])},
        "hardware": {
            "gpu": dict(corpus["gpus"][gpu]) if gpu in corpus.get("gpus", {}) else gpu,
            "gpus_per_node": case["gpus_per_node"],
            "nodes": case["nodes"],
        },
        "training": {
            "sequence_length": case["sequence_length"],
            "global_batch_size": case["micro_batch_size"] * accumulation * world // tp,
            "precision": case["precision"],
            "attention": "sdpa",
            "optimizer": {"type": "adamw"},
        },
        "constraints": {
            "zero_stage": case["zero_stage"],
            "offload_optimizer": "none",
            "offload_param": "none",
            "activation_checkpointing": bool(case.get("activation_checkpointing")),
            "micro_batch_size": case["micro_batch_size"],
            "gradient_accumulation_steps": accumulation,
            "tensor_parallel_size": tp,
            "expert_parallel_size": ep,
            "memory_headroom": 0,
        },
    }


def priced(case: dict[str, Any], corpus: dict[str, Any]) -> Evaluation:
    result = solve_spec(build_spec(case_mapping(case, corpus)))
    e = result.best if result.best is not None else result.closest
    assert e is not None
    return e


def right(outcome: str, e: Evaluation) -> bool:
    """A published fit is right when dsgen says it fits on the GPU; a published OOM when it does not."""
    return e.fits_gpu if outcome == "fits" else not e.fits_gpu


def main() -> None:
    corpus = load_corpus("model_parallel_runs")
    evaluations: dict[str, Evaluation] = {}
    verdicts: list[bool] = []
    errors: list[float] = []
    print(f"{'case':<58} {'outcome':<7} {'dsgen GiB':>9} {'cap':>6} {'stated':>7} {'tok/s dsgen':>11} {'stated':>9}  right")
    for case in corpus["cases"]:
        try:
            e = priced(case, corpus)
        except DsgenError as exc:
            print(f"{case['id']:<58} {case['outcome']:<7} not scored: {str(exc).splitlines()[0][:100]}")
            continue
        evaluations[case["id"]] = e
        ok = right(case["outcome"], e)
        verdicts.append(ok)
        stated = case.get("measured_gib")
        predicted = e.memory.gpu.total / GIB
        if stated and case["outcome"] == "fits":
            errors.append(predicted / stated - 1)
        tokens = case.get("tokens_per_s")
        assumed = "" if case.get("gradient_accumulation_steps") else " (accumulation 1 assumed)"
        print(
            f"{case['id']:<58} {case['outcome']:<7} {predicted:>9.1f} {e.memory.gpu.capacity / GIB:>6.1f} "
            f"{stated if stated else '-':>7} {e.tokens_per_s:>11,.0f} {f'{tokens:,.0f}' if tokens else '-':>9}  "
            f"{'yes' if ok else 'NO'}{assumed}"
        )
    print(f"\nverdicts right: {sum(verdicts)}/{len(verdicts)} scored of {len(corpus['cases'])} cases")
    if errors:
        print(
            f"per-GPU peak of runs that fit ({len(errors)}): median |error| "
            f"{statistics.median(abs(x) for x in errors):.0%}, worst {max(errors, key=abs):+.0%}"
        )
    print("\npairs (plain ZeRO vs model parallel): does dsgen order them as published?")
    seen: set[frozenset[str]] = set()
    for case in corpus["cases"]:
        other = case.get("pair")
        key = frozenset((case["id"], other or ""))
        if not other or key in seen or case["id"] not in evaluations or other not in evaluations:
            continue
        seen.add(key)
        mate = next(c for c in corpus["cases"] if c["id"] == other)
        a, b = evaluations[case["id"]], evaluations[other]
        for label, ours, theirs in (
            ("memory", (a.memory.gpu.total, b.memory.gpu.total), (case.get("measured_gib"), mate.get("measured_gib"))),
            ("tokens/s", (a.tokens_per_s, b.tokens_per_s), (case.get("tokens_per_s"), mate.get("tokens_per_s"))),
        ):
            if None in theirs or case["outcome"] != "fits" or mate["outcome"] != "fits":
                continue
            same = (ours[0] < ours[1]) == (theirs[0] < theirs[1])
            print(f"  {case['id']} vs {other}: {label} {'same order' if same else 'REVERSED'}")


if __name__ == "__main__":
    main()
