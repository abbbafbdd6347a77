"""dsgen against published long-context runs (issue 21): verdicts, the frontier, throughput.

Reads bench/data/long_context_runs.yaml (each run with its source and a quote) and prints:

1. Verdict agreement: the verdict dsgen itself gives each run, against what happened. An
   ArcticTraining recipe: ``dsgen doctor`` on the DeepSpeed config the recipe ran, the spec saying
   what its code applies (tiling, checkpoint offload, checkpointing); another run that offloaded
   its optimizer: ``dsgen doctor`` on the config of its stated settings. Any other run: ``dsgen
   solve`` with the run's settings pinned (stage, Ulysses degree, tricks), micro-batch 1, one
   sequence per data-parallel rank. Goal: >= 90 %.
2. ``dsgen frontier`` for Llama-3.1-8B on 1, 8 and 32 H100 80GB (1.9 TB host RAM per node, as the
   ALST runs had) against the paper's 500K, 3.7M and 15M. Goal: within x1.25.
3. Predicted against published speed where a source gives one (tokens/s, or seconds per optimizer
   step; both as predicted speed / published speed). Goal: median ratio within x1.5.

Run: .venv/bin/python bench/long_context_published.py
     .venv/bin/python bench/long_context_published.py --data bench/data/long_context_heldout.yaml
(another file of runs in the same format; the frontier is printed where the file has one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dataclasses import replace  # noqa: E402

from dsgen.api import frontier_of, load_spec, solve_spec  # noqa: E402
from dsgen.doctor.diagnose import diagnose  # noqa: E402
from dsgen.errors import DsgenError  # noqa: E402
from dsgen.estimate.memory import HOST_RESERVE  # noqa: E402
from dsgen.search.evaluation import Evaluation  # noqa: E402
from dsgen.search.verdict import LONG_CONTEXT_BANDS, Band, band_of  # noqa: E402
from dsgen.spec.types import Spec  # noqa: E402

DATA = REPO / "bench" / "data" / "long_context_runs.yaml"
VERDICT_GOAL, FRONTIER_GOAL, THROUGHPUT_GOAL = 0.90, 1.25, 1.5


def arctic_recipe(run: dict[str, Any]) -> bool:
    """Whether ``run`` is one of ArcticTraining's recipes (or a length tried in one)."""
    return str(run["source"]).startswith("ArcticTraining")


def spec_data(run: dict[str, Any], corpus: dict[str, Any]) -> dict[str, Any]:
    """``run`` as a spec mapping; ``corpus`` (the file's header) gives the host RAM and the DeepSpeed
    release where the run does not state its own."""
    gpus = run["gpus"]
    per_node = min(gpus, 8)
    sp = run["constraints"].get("sequence_parallel_size", 1)
    return {
        "model": {"preset": run["model"]},
        "hardware": {
            "gpu": run.get("gpu", "h100-80gb"),
            "gpus_per_node": per_node,
            "nodes": gpus // per_node,
            "cpu_memory_gib": run.get("host_gib", corpus["host_gib"]),
        },
        "training": {
            "sequence_length": run["sequence_length"],
            # one sequence per data-parallel rank, unless the source states its global batch
            "global_batch_size": run.get("global_batch_size", gpus // sp),
            "attention": run.get("attention", "flash"),
            "liger_kernel": run.get("liger_kernel", False),
            "packed_samples": run.get("packed_samples", False),
            "deepspeed_version": str(run.get("deepspeed_version", corpus["deepspeed_version"])),
        },
        # headroom 0, as bench/fit_accuracy.py: a run at its published limit used all of the GPU;
        # every ArcticTraining recipe reduces SP gradients in bf16 ("seq_parallel_communication_data_type: bf16")
        "constraints": {
            "micro_batch_size": 1,
            "memory_headroom": 0.0,
            **({"seq_parallel_communication_data_type": "bf16"} if arctic_recipe(run) else {}),
            **run["constraints"],
        },
        # ArcticTraining's SFTTrainer.loss returns the loss alone (arctic_training/trainer/sft_trainer.py:
        # "outputs = self.model(**batch, use_cache=False); loss = outputs.loss; return loss"), so the
        # 16-bit logits are freed before backward, as under the HF Trainer: dsgen prices that loop
        # as the hf-trainer target's (dsgen.spec.types.Output.logits_released)
        **({"output": {"target": "hf-trainer"}} if arctic_recipe(run) else {}),
    }


#: What a recipe's training code decides and no DeepSpeed config carries: the spec tells
#: ``dsgen doctor`` (docs/doctor.md). ArcticTraining checkpoints unless told not to
#: (arctic_training/config/model.py: ``disable_activation_checkpoint: bool = False``).
CODE_CONSTRAINTS = ("activation_checkpointing", "tiled_mlp", "tiled_loss", "checkpoint_offload")


def stated_config(run: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config ``run``'s stated settings make: its ZeRO stage and offload devices (the
    whole optimizer offloaded, DeepSpeed's default ``offload_optimizer.ratio``), its Ulysses degree,
    bf16, micro-batch 1 and the accumulation that meets its global batch; every other key is
    DeepSpeed's default."""
    c = run["constraints"]
    sp = c.get("sequence_parallel_size", 1)
    zero: dict[str, Any] = {"stage": c["zero_stage"]}
    for key in ("offload_optimizer", "offload_param"):
        if c.get(key, "none") != "none":
            zero[key] = {"device": c[key]}
    batch = run.get("global_batch_size", run["gpus"] // sp)
    return {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": batch,
        "gradient_accumulation_steps": batch // (run["gpus"] // sp),
        "sequence_parallel_size": sp,
        "bfloat16": {"enabled": True},
    }


def recipe_config(run: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config ArcticTraining hands DeepSpeed for ``run``'s recipe
    (arctic_training/config/trainer.py, ``build_deepspeed_config``): the recipe's own
    ``zero_optimization`` block, which replaces ArcticTraining's defaults whole
    (``ds_config.get("zero_optimization", {...})``), its ``seq_parallel_communication_data_type:
    bf16``, and the keys ArcticTraining adds (micro-batch 1, no accumulation, ``train_batch_size``
    = GPUs / SP, bf16, clipping 1.0)."""
    return {
        **stated_config(run),
        "seq_parallel_communication_data_type": "bf16",
        "steps_per_print": 10,
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "wall_clock_breakdown": False,
    }


def _loaded(data: dict[str, Any], run: dict[str, Any]) -> tuple[Spec, str]:
    """``data`` loaded as a dsgen spec, and what had to change for dsgen to take it: dsgen models
    Liger-Kernel's memory for dense models only and refuses the setting otherwise; such a run is
    loaded without it, and the returned caveat says so ("" when nothing changed)."""
    try:
        return load_spec(data), ""
    except DsgenError as exc:
        if exc.path != "training.liger_kernel":
            raise
        data = {**data, "training": {**data["training"], "liger_kernel": False}}
        return load_spec(data), f"priced without Liger ({exc.message}); "


def pinned_spec(run: dict[str, Any], corpus: dict[str, Any]) -> tuple[Spec, str]:
    """``run``'s settings loaded as a dsgen spec, every search dimension pinned, with
    :func:`_loaded`'s caveat."""
    return _loaded(spec_data(run, corpus), run)


def priced(run: dict[str, Any], corpus: dict[str, Any]) -> tuple[Evaluation, str]:
    """What dsgen itself says of ``run``, and :func:`_loaded`'s caveat.

    An ArcticTraining recipe: ``dsgen doctor`` on the DeepSpeed config the recipe ran
    (:func:`recipe_config`). Any other run that offloaded its optimizer: ``dsgen doctor`` on the
    config of its stated settings (:func:`stated_config`): it offloaded the whole optimizer, which a
    spec's constraints cannot pin (``solve`` may choose part of it). Both with a spec that states
    the cluster, the sequence and what the code applies (:data:`CODE_CONSTRAINTS`). Any other run:
    ``dsgen solve`` on a spec pinning its settings, the plan ``solve`` prints.
    """
    c = run["constraints"]
    if not arctic_recipe(run) and c.get("offload_optimizer", "none") == "none":
        spec, caveat = pinned_spec(run, corpus)
        result = solve_spec(spec)
        shown = result.best if result.best is not None else result.closest
        assert shown is not None
        return shown, caveat
    data = spec_data(run, corpus)
    code = {key: value for key, value in c.items() if key in CODE_CONSTRAINTS}
    # ArcticTraining checkpoints unless told not to
    data["constraints"] = {"activation_checkpointing": True, **code} if arctic_recipe(run) else code
    spec, caveat = _loaded(data, run)
    config = recipe_config(run) if arctic_recipe(run) else stated_config(run)
    d = diagnose(config, spec, max_fixes=0)
    refused = [f.message for f in d.validation.findings if f.severity == "error"]
    assert d.evaluation is not None and not refused, f"{run['id']}: the doctor refused the config: {refused}"
    return d.evaluation, caveat


def outcomes_by_band(evaluated: list[tuple[dict[str, Any], Evaluation]]) -> dict[Band, list[str]]:
    """The published outcomes of the runs dsgen gives a GPU verdict, by the band (dsgen.search.verdict's
    edges) their predicted fill falls in: the evidence dsgen.search.verdict.LONG_CONTEXT_BANDS states."""
    bands: dict[Band, list[str]] = {band: [] for band in LONG_CONTEXT_BANDS}
    for run, e in evaluated:
        if e.fit.verdict in ("fits", "tight", "oom"):
            bands[band_of(e.fit.fill, LONG_CONTEXT_BANDS)].append(run["outcome"])
    return bands


OUTCOME_OF = {"fits": "fits", "oom": "oom", "host-oom": "host_oom", "invalid": "fails"}


def leave_one_out(evaluated: list[tuple[dict[str, Any], Evaluation]]) -> None:
    """Whether each tight verdict read against this corpus (packed samples) would lean the same
    way had its own run been left out of the band's counts: the lean is not the run's own label."""
    bands = outcomes_by_band(evaluated)
    same = total = 0
    for run, e in evaluated:
        fit = e.fit
        band = fit.long_context_band
        if fit.verdict != "tight" or band is None or fit.governing_band is not band:
            continue
        outcomes = list(bands[band_of(fit.fill, LONG_CONTEXT_BANDS)])
        outcomes.remove(run["outcome"])
        without = replace(band, runs=len(outcomes), gpu_oom=outcomes.count("oom"))
        total += 1
        # dsgen's own reading (FitVerdict.likely) of the same verdict against the smaller band
        same += replace(fit, long_context_band=without).likely == fit.likely
    if not total:
        return
    print(
        f"  leave-one-out: {same} of the {total} tight verdicts read against this corpus lean the same way"
        " with their own run left out of the band's counts"
    )


def host_bands(evaluated: list[tuple[dict[str, Any], Evaluation]]) -> None:
    """The published outcomes by predicted host fill (host RAM per node / the node's RAM), around
    the reserve dsgen keeps (HOST_RESERVE): the evidence on where host-oom should start."""
    edges = ((0.0, 1 - HOST_RESERVE), (1 - HOST_RESERVE, 1.0), (1.0, float("inf")))
    print("  outcomes by predicted host fill (host RAM per node / the node's RAM):")
    for low, high in edges:
        inside = [run["outcome"] for run, e in evaluated if low < e.memory.cpu.total / e.memory.cpu.capacity <= high]
        counts = ", ".join(f"{inside.count(o)} {o}" for o in ("fits", "oom", "host_oom", "fails"))
        label = f"({low:.0%}, {'inf' if high == float('inf') else f'{high:.0%}'}]"
        print(f"    {label:12} {len(inside):3} runs: {counts}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="a YAML file of runs (default: %(default)s)")
    corpus = yaml.safe_load(parser.parse_args().data.read_text())
    agree = {False: 0, True: 0}  # by heldout
    counted = {False: 0, True: 0}
    tries = [0, 0]  # agreeing, counted: the recipes' commented-out lengths (held out)
    evaluated: list[tuple[dict[str, Any], Evaluation]] = []
    peaks: list[float] = []
    ratios: list[float] = []
    print("1. verdicts (pinned settings); * = held out (first priced after the model was written)")
    print(f"  {'run':<46} {'published':>9} {'dsgen':>6}  peak GPU   note")
    for run in corpus["runs"]:
        heldout = bool(run.get("heldout"))
        e, caveat = priced(run, corpus)
        # dsgen's own verdict of that run (what doctor or solve prints for it), read as what it says will
        # happen (FitVerdict.likely: tight leans to its governing band's majority), as
        # bench/fit_accuracy.py reads it; host-oom is right only for a run that ran out of host
        # memory, and invalid (a kernel limit, memory permitting) only for a run that fails
        # without running out of memory
        verdict = OUTCOME_OF[e.fit.likely]
        agree[heldout] += verdict == run["outcome"]
        counted[heldout] += 1
        evaluated.append((run, e))
        if run.get("recipe_try"):
            tries[0] += verdict == run["outcome"]
            tries[1] += 1
        peak = e.memory.gpu.total / 2**30
        lean = f" (likely {e.fit.likely})" if e.fit.verdict == "tight" else ""
        note = caveat + f"{e.fit.verdict}{lean} at {e.fit.fill:.0%}; " + ("" if e.feasible else e.reason())
        if "measured_peak_gib" in run:
            peaks.append(peak / run["measured_peak_gib"])
            note = f"measured {run['measured_peak_gib']} GB (x{peaks[-1]:.2f}); {note}"
        # Speed is compared for every run that published one: the run trained, so its plan's step
        # time means something whatever verdict dsgen gives its memory.
        if "tokens_per_s" in run:
            ratio = e.tokens_per_s / run["tokens_per_s"]
            ratios.append(ratio)
            note += f" tokens/s {e.tokens_per_s:,.0f} vs {run['tokens_per_s']:,} published (x{ratio:.2f})"
        if "iteration_s" in run:
            ratio = run["iteration_s"] / e.step.total_s  # predicted speed / published speed, as tokens/s
            ratios.append(ratio)
            note += f" step {e.step.total_s:,.0f} s vs {run['iteration_s']:,} s published (speed x{ratio:.2f})"
        mark = "" if verdict == run["outcome"] else "  <-- disagrees"
        name = ("* " if heldout else "  ") + run["id"]
        print(f"  {name:<46} {run['outcome']:>9} {verdict:>6}  {peak:6.1f} GiB {note}{mark}")
    for heldout, label in ((False, "the runs the model was built beside"), (True, "held out")):
        if not counted[heldout]:
            continue
        share = agree[heldout] / counted[heldout]
        print(
            f"  agreement, {label}: {agree[heldout]}/{counted[heldout]} = {share:.0%} "
            f"(goal >= {VERDICT_GOAL:.0%}): {'met' if share >= VERDICT_GOAL else 'NOT met'}"
        )
    if tries[1]:
        rest = (agree[True] - tries[0], counted[True] - tries[1])
        print(
            f"    of which the recipes' commented-out tries: {tries[0]}/{tries[1]}; "
            f"the other held-out runs: {rest[0]}/{rest[1]}"
        )
    print("  outcomes by the band of dsgen's predicted GPU fill (runs with a GPU verdict):")
    for band, outcomes in outcomes_by_band(evaluated).items():
        counts = ", ".join(f"{outcomes.count(o)} {o}" for o in ("fits", "oom", "host_oom"))
        high = "inf" if band.high == float("inf") else f"{band.high:.0%}"
        label = f"({band.low:.0%}, {high}]"
        print(
            f"    {label:12} {len(outcomes):3} runs: {counts}"
            f"  (dsgen.search.verdict.LONG_CONTEXT_BANDS says {band.runs} / {band.gpu_oom} out of GPU memory)"
        )
    leave_one_out(evaluated)
    host_bands(evaluated)
    total = sum(agree.values()) / sum(counted.values())
    print(f"  agreement, all: {sum(agree.values())}/{sum(counted.values())} = {total:.0%}")
    if peaks:
        print(
            f"  predicted / measured peak, {len(peaks)} runs with a published figure: median x{statistics.median(peaks):.2f}, "
            f"range x{min(peaks):.2f}-x{max(peaks):.2f}"
        )

    if "frontier" not in corpus:
        print("\n2. frontier: not in this file")
    else:
        frontier_figures(corpus)
    throughput_figures(ratios)
    return 0


def frontier_figures(corpus: dict[str, Any]) -> None:
    """``dsgen frontier`` against the published longest sequences (section 2)."""
    print(
        "\n2. frontier: Llama-3.1-8B on H100 80GB, 1.9 TB host RAM per node"
        + (", Liger-Kernel as the paper's runs" if corpus["frontier"].get("liger_kernel") else "")
    )
    published = corpus["frontier"]["published"]
    frontier = corpus["frontier"]
    data = spec_data(
        {
            "source": "ArcticTraining recipes (the paper's runs, so their training loop)",
            "model": frontier["model"],
            "gpus": 8,
            "sequence_length": 131072,
            "constraints": {},
            "liger_kernel": frontier.get("liger_kernel", False),
        },
        corpus,
    )
    data["constraints"] = {}  # the frontier searches everything, with dsgen's default headroom
    spec = load_spec(data)
    worst = 1.0
    for point in frontier_of(spec, "sequence_length", sorted(published)):
        want = published[point.gpus]
        got = point.value or 0
        factor = max(got / want, want / got) if got else float("inf")
        worst = max(worst, factor)
        plan = point.result.best.plan.describe() if point.result.best else "-"
        print(f"  {point.gpus:>3} GPUs: dsgen {got:>11,}  published {want:>11,}  x{got / want:.2f}  ({plan})")
    print(
        f"  worst factor x{worst:.2f} (goal within x{FRONTIER_GOAL}): {'met' if worst <= FRONTIER_GOAL else 'NOT met'}"
    )


def throughput_figures(ratios: list[float]) -> None:
    """Predicted over published speed (section 3)."""
    print("\n3. throughput where published")
    if ratios:
        median = statistics.median(ratios)
        factor = max(median, 1 / median)
        print(
            f"  {len(ratios)} run(s); median predicted/published speed x{median:.2f}, range x{min(ratios):.2f}-x{max(ratios):.2f} "
            f"(goal within x{THROUGHPUT_GOAL}): {'met' if factor <= THROUGHPUT_GOAL else 'NOT met'}"
        )
    else:
        print("  no published throughput in the corpus")


if __name__ == "__main__":
    raise SystemExit(main())
