"""dsgen's fit verdicts on published fine-tuning runs: LoRA, QLoRA, freeze-tuning, preference and RL objectives.

For every case of bench/data/finetune_runs.yaml (in sample) or, with ``--held-out``,
bench/data/finetune_heldout_blind.yaml (collected blind to dsgen), this builds the fully pinned spec
of what ran (the run's ZeRO stage, offload, checkpointing, micro-batch and accumulation, its method,
adapters, quantization, objective, reference model and generation; ``memory_headroom: 0``), prices
it, and prints dsgen's verdict beside the published outcome: a ``fits`` run is right when the plan
is below GPU (and host) capacity, an ``oom`` run when it is above the GPU's. Where a source states
its per-GPU peak (``measured_gib``) the prediction's error against it is printed too.

A case whose spec dsgen refuses (a field it cannot express, a missing sequence length) is listed
with the reason and not scored. Final lines: verdicts right N/M with the 95 % Wilson interval,
split by the collector's ``strict`` mark, and the median and worst error against stated peaks.

Run: python bench/finetune_accuracy.py [--held-out] [--case ID ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for entry in (str(REPO), str(REPO / "bench")):
    if entry not in sys.path:  # run as a script from a checkout: import this dsgen and the bench helpers
        sys.path.insert(0, entry)

from fit_accuracy import right, wilson_text  # noqa: E402
from outcome_specs import build_spec, load_corpus, spec_mapping  # noqa: E402

from dsgen.api import solve_spec  # noqa: E402
from dsgen.catalog.linear_layers import linear_layer_names  # noqa: E402
from dsgen.errors import DsgenError  # noqa: E402
from dsgen.spec.defaults import spec_default  # noqa: E402

GIB = 1 << 30
IN_SAMPLE = "finetune_runs"
HELD_OUT = "finetune_heldout_blind"
# optimizers the runs name that dsgen prices as another: the paged AdamW variants keep AdamW's
# fp32 states on the GPU until memory runs short (bitsandbytes' paged optimizers)
OPTIMIZER_AS = {
    "paged_adamw_32bit": "adamw",
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw",
    "paged_adamw_8bit": "adamw-8bit",
}


# module names of the checkpoints' own code (BLOOM, Qwen-1's remote code, ChatGLM) that the corpus
# prices with another family's layout: their role decides what dsgen targets
MLP_NAMES = frozenset(
    {"dense_h_to_4h", "dense_4h_to_h", "w1", "w2", "w3", "mlp", "c_fc", "gate_proj", "up_proj", "down_proj"}
)
REQUIRED = ("sequence_length", "micro_batch", "grad_accum", "gpus_per_node", "nodes", "zero_stage")


def _targets(targets: Any, shape_names: tuple[str, ...]) -> Any:
    """The run's LoRA targets in the priced family's names: a list naming modules the family does
    not have (the checkpoint's own code names them otherwise) becomes all-linear when it names MLP
    modules, else attention."""
    if isinstance(targets, str) or targets is None:
        return "all-linear" if targets in (None, "all", "all-linear") else targets
    if all(name in shape_names for name in targets):
        return list(targets)
    return "all-linear" if MLP_NAMES & set(targets) else "attention"


def finetune_mapping(case: dict[str, Any], corpus: dict[str, Any]) -> dict[str, Any]:
    """The pinned spec of ``case`` as a mapping: the fit corpora's fields, then the method's."""
    run = dict(case)
    generation = run.get("generation") or None
    if run.get("objective") in ("grpo", "ppo"):
        if not generation:
            raise DsgenError("the source states no generation lengths")
        prompt = generation.get("max_prompt_length") or spec_default("training.generation.max_prompt_length")
        completion = generation.get("max_completion_length") or spec_default(
            "training.generation.max_completion_length"
        )
        run["sequence_length"] = prompt + completion
    missing = [key for key in REQUIRED if run.get(key) is None]
    if missing:
        raise DsgenError(f"the source states no {', '.join(missing)}")
    run["attention"] = run.get("attention") or "sdpa"
    run["optimizer"] = OPTIMIZER_AS.get(run.get("optimizer") or "adamw", run.get("optimizer") or "adamw")
    run["packed_samples"] = bool(run.get("packed_samples"))
    mapping = spec_mapping(run, corpus)
    training = mapping["training"]
    method = run.get("method") or "full"
    training["finetuning"] = method
    if method in ("lora", "qlora") and run.get("lora"):
        lora = {k: v for k, v in run["lora"].items() if v is not None and k in ("rank", "alpha")}
        names = linear_layer_names(build_spec(mapping).model)
        lora["target_modules"] = _targets(run["lora"].get("target_modules"), names)
        training["lora"] = lora
    if method == "qlora" and run.get("quantization"):
        q = {k: v for k, v in run["quantization"].items() if v is not None and k in ("bits", "type", "double_quant")}
        training["quantization"] = q
    if method == "freeze" and run.get("freeze"):
        training["freeze"] = {"trainable_layers": run["freeze"]["trainable_layers"]}
    objective = run.get("objective") or "sft"
    training["objective"] = objective
    if run.get("reference_model") and objective != "sft":
        training["reference_model"] = run["reference_model"]
    if generation and objective in ("grpo", "ppo"):
        keys = (
            "num_generations",
            "max_prompt_length",
            "max_completion_length",
            "engine",
            "vllm_gpu_memory_utilization",
        )
        training["generation"] = {k: generation[k] for k in keys if generation.get(k) is not None}
        batch = training["global_batch_size"]
        if batch % training["generation"].get("num_generations", 8):
            # TRL checks the generation batch (completions), which the run met; the micro-batch counts completions
            training["generation"]["num_generations"] = 1
    return mapping


def score(name: str, only: list[str]) -> None:
    corpus = load_corpus(name)
    scored: list[tuple[dict[str, Any], bool]] = []
    errors: list[float] = []
    print(f"{'case':<52} {'outcome':<7} {'dsgen':<9} {'GiB':>7} {'cap':>6} {'stated':>7}  right")
    for case in corpus["cases"]:
        if only and case["id"] not in only:
            continue
        try:
            spec = build_spec(finetune_mapping(case, corpus))
            result = solve_spec(spec)
        except DsgenError as exc:
            print(f"{case['id']:<52} {case['outcome']:<7} not scored: {str(exc).splitlines()[0][:90]}")
            continue
        e = result.best if result.best is not None else result.closest
        assert e is not None
        ok = right(case["outcome"], e)
        scored.append((case, ok))
        predicted = e.memory.gpu.total / GIB
        stated = case.get("measured_gib")
        if stated and case["outcome"] == "fits":
            errors.append(predicted / stated - 1)
        print(
            f"{case['id']:<52} {case['outcome']:<7} {e.fit.verdict:<9} {predicted:>7.1f} "
            f"{e.memory.gpu.capacity / GIB:>6.1f} {stated if stated else '-':>7}  {'yes' if ok else 'NO'}"
        )
    hits = sum(ok for _, ok in scored)
    print(f"\n{name}: verdicts right {hits}/{len(scored)} ({wilson_text(hits, len(scored))})")
    for label, keep in (("strict", True), ("stated by the source, with inferred fields", False)):
        part = [ok for case, ok in scored if bool(case.get("strict")) is keep]
        if part:
            print(f"  {label}: {sum(part)}/{len(part)}")
    for outcome in ("fits", "oom"):
        part = [ok for case, ok in scored if case["outcome"] == outcome]
        if part:
            print(f"  published {outcome}: {sum(part)}/{len(part)}")
    if errors:
        absolute = [abs(x) for x in errors]
        print(
            f"  against stated per-GPU peaks of runs that fit ({len(errors)}): median |error| "
            f"{statistics.median(absolute):.0%}, worst {max(errors, key=abs):+.0%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held-out", action="store_true", help="score the blind held-out set")
    parser.add_argument("--case", action="append", default=[], help="score only this case id")
    args = parser.parse_args()
    score(HELD_OUT if args.held_out else IN_SAMPLE, args.case)


if __name__ == "__main__":
    main()
