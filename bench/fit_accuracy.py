"""dsgen's fit verdicts against published outcomes of real DeepSpeed runs, beside DeepSpeed's estimator.

For every case of bench/data/fit_outcomes.yaml (a run that fit, ran out of GPU memory or ran out of
host memory, with its source) this builds the fully pinned spec of what ran (``memory_headroom: 0``,
see bench/outcome_specs.py), solves it, and prints:

* dsgen's verdict (fits / oom / host-oom) and predicted GiB per GPU against capacity, priced twice:
  with the ZeRO knobs dsgen would render (``dsgen``) and with the run's own config (``run``);
* DeepSpeed's own model-state estimator beside it: ``estimate_zero2_model_states_mem_needs``
  (stages 1 and 2; DeepSpeed has none for stage 0) and ``estimate_zero3_model_states_mem_needs``
  (``zero_init=True``, as the HF integration builds ZeRO-3 models), GPU bytes against capacity and
  CPU bytes against the node's RAM - called from DeepSpeed itself when it imports, else dsgen's
  byte-exact transcription (dsgen/estimate/ds_estimator.py);
* for each miss, one classified reason: the first not-yet-modelled term that, added to dsgen's
  prediction, would flip the verdict (or, for over-predictions, dsgen's largest term).

Then, for every case, the verdict ``dsgen doctor`` itself gives (dsgen.doctor.diagnose on the run's
config and a spec that pins only checkpointing; fits / tight / oom / host-oom, dsgen.search.verdict) and
the calibration of its bands: the safe line and the outcomes of the runs in each band. Each verdict
is read as what it says will happen (``FitVerdict.likely``): ``tight`` as the outcome its band's
runs mostly had, which for these corpora (no run declares packed samples) is out of GPU memory.
``--corpus fit_heldout`` runs the same on the held-out published outcomes; ``--corpus`` may be given
more than once, and ``--held-out`` names every ``bench/data/fit_heldout*.yaml``. With more than one
corpus the last line pools the doctor's verdicts over all of them. Each doctor figure carries its 95 %
Wilson score interval (Wilson 1927), the range of true accuracies the sample does not rule out.

Final lines: ``verdicts right N/M (X %)`` for each pricing, for dsgen at its default
``memory_headroom`` (the verdict a user gets, with the cases it gets wrong) and for DeepSpeed's
estimator, then the GPU verdicts under other headrooms.

Run: python bench/fit_accuracy.py [--corpus NAME ...] [--held-out] [--json rows.json] [--case ID ...]   (a few seconds; DeepSpeed import
     included). A host RAM the source does not state is taken as 512 GiB and flagged "host?".
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for entry in (str(REPO), str(REPO / "bench")):
    if entry not in sys.path:  # run as a script from a checkout: import this dsgen and the bench helpers
        sys.path.insert(0, entry)

from outcome_specs import UNKNOWN_HOST_GIB, Priced, doctor_config, doctor_spec, load_corpus, price  # noqa: E402

from dsgen.doctor.diagnose import diagnose  # noqa: E402
from dsgen.facts.release import normalize_release  # noqa: E402
from dsgen.search.evaluation import Evaluation  # noqa: E402
from dsgen.search.verdict import BANDS, SAFE_LINE  # noqa: E402
from dsgen.spec.defaults import spec_default  # noqa: E402
from dsgen.targets import TARGETS  # noqa: E402

GIB = 1 << 30
VERDICTS = ("fits", "oom", "host_oom")
HEADROOMS = (0.0, 0.05, 0.10, 0.15, 0.20)


def verdict(e: Evaluation) -> str:
    """dsgen's verdict: GPU first (a run fails there first when both are short), then host RAM."""
    if not e.fits_gpu:
        return "oom"
    if not e.fits_cpu:
        return "host_oom"
    return "fits"


def right(outcome: str, e: Evaluation) -> bool:
    """A failure outcome is right when dsgen predicts that failure (whatever else it predicts)."""
    if outcome == "fits":
        return e.feasible
    if outcome == "oom":
        return not e.fits_gpu
    return not e.fits_cpu


def _ds_functions() -> tuple[Any, Any, str]:
    """DeepSpeed's estimator functions, or dsgen's transcription of them when DeepSpeed does not import."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3  # type: ignore[import-untyped]
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2  # type: ignore[import-untyped]

        return z2, z3, "deepspeed"
    except Exception:  # any import failure means: use the transcription
        from dsgen.estimate.ds_estimator import (
            estimate_zero2_model_states_mem_needs as z2,
        )
        from dsgen.estimate.ds_estimator import (
            estimate_zero3_model_states_mem_needs as z3,
        )

        return z2, z3, "dsgen transcription"


@dataclass(frozen=True)
class DsVerdict:
    """DeepSpeed's estimator for one case: GPU and host bytes, and what they imply."""

    gpu: int
    cpu: int
    verdict: str  # fits | oom | host_oom | n/a


def ds_estimate(case: dict[str, Any], priced: Priced, z2: Any, z3: Any) -> DsVerdict:
    stage = case["zero_stage"]
    if stage == 0:
        return DsVerdict(0, 0, "n/a")
    shape = priced.spec.model
    hw = priced.spec.hardware
    offload = case["offload_optimizer"] != "none"
    if stage == 3:
        cpu, gpu, _ = z3(
            shape.parameter_count(),
            shape.largest_module_parameters(),
            num_gpus_per_node=hw.gpus_per_node,
            num_nodes=hw.nodes,
            cpu_offload=offload,
            cpu_offload_params=case["offload_param"] != "none",
            zero_init=True,
        )
    else:
        cpu, gpu = z2(
            shape.parameter_count(), num_gpus_per_node=hw.gpus_per_node, num_nodes=hw.nodes, cpu_offload=offload
        )
    if gpu > hw.gpu.memory_bytes:
        return DsVerdict(int(gpu), int(cpu), "oom")
    if cpu > hw.cpu_memory_bytes:
        return DsVerdict(int(gpu), int(cpu), "host_oom")
    return DsVerdict(int(gpu), int(cpu), "fits")


def peak_overhead(e: Evaluation) -> int:
    """The allowances (CUDA context, NCCL, allocator slack) inside the peak phase's prediction."""
    gpu = e.memory.gpu
    return gpu.step_overhead if gpu.peak_phase == "optimizer_step" else gpu.overhead


def right_at(outcome: str, e: Evaluation, headroom: float) -> bool:
    """Whether the verdict is right when a plan fits only below ``(1 - headroom)`` of GPU memory."""
    fits_gpu = e.memory.gpu.total <= e.usable_gpu_bytes * (1 - headroom)
    if outcome == "fits":
        return fits_gpu and not e.host_short
    if outcome == "oom":
        return not fits_gpu
    return e.host_short


def terms(e: Evaluation) -> str:
    m = e.memory.gpu
    parts = (
        ("P", m.parameters),
        ("G", m.gradients),
        ("O", m.optimizer_states),
        ("A", m.activations),
        ("B", m.buffers),
        ("T", m.transient),
        ("X", m.overhead),
        ("S", m.step_temporary),
    )
    return " ".join(f"{k}{v / GIB:.1f}" for k, v in parts) + f" ({m.peak_phase})"


def miss_reason(case: dict[str, Any], e: Evaluation, params: int) -> str:
    """One classified reason for a miss: the first unmodelled term that would flip the verdict."""
    outcome = case["outcome"]
    usable = e.usable_gpu_bytes
    mem = e.memory.gpu
    if outcome == "oom":
        frag = int(0.10 * (mem.total - mem.parameters - mem.optimizer_states))
        short = usable - mem.total
        if frag > short:
            return (
                f"under-predicted at {mem.total / usable:.0%} ({short / GIB:.1f} GiB short); within allocator "
                f"fragmentation/rounding of dynamic memory (+10 % = {frag / GIB:.1f} GiB) and CUDA/NCCL by version"
            )
        return (
            f"under-predicted at {mem.total / usable:.0%} ({short / GIB:.1f} GiB short): no listed term explains it; "
            f"the inputs are the suspect (see `assumed`) [{terms(e)}]"
        )
    if outcome == "host_oom":
        return (
            f"host under-predicted: dsgen {e.memory.cpu.total / GIB:.0f} GiB of {e.memory.cpu.capacity / GIB:.0f} "
            "(the largest of start-up, training and a checkpoint save, beside the processes: "
            "dsgen.estimate.memory.HostMemory); unmodelled: the framework's own host copies beyond those"
        )
    if not e.fits_gpu:
        return f"over-predicted GPU at {mem.total / usable:.0%} [{terms(e)}]"
    return f"over-predicted host: {e.memory.cpu.total / GIB:.0f} GiB needed of {e.memory.cpu.capacity / GIB:.0f} usable"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write one row per case to this file")
    parser.add_argument("--case", action="append", default=[], help="only these case ids")
    parser.add_argument(
        "--corpus",
        action="append",
        default=[],
        help="bench/data/<name>.yaml, repeatable (default fit_outcomes; fit_heldout*: held out)",
    )
    parser.add_argument("--held-out", action="store_true", help="every bench/data/fit_heldout*.yaml")
    parser.add_argument(
        "--target",
        choices=TARGETS,
        help="price the doctor's verdicts as this target's training loop runs every case "
        "(default: the spec's, a loop of the user's own)",
    )
    args = parser.parse_args(argv)
    names = list(args.corpus)
    if args.held_out:
        names += held_out_corpora()
    names = list(dict.fromkeys(names)) or ["fit_outcomes"]
    if args.json and len(names) > 1:
        parser.error("--json writes one corpus's rows: name one --corpus")
    doctor_rows = [row for name in names for row in score_corpus(name, args.case, args.json, args.target)]
    if len(names) > 1:
        right_n = sum(row.right for row in doctor_rows)
        total = len(doctor_rows)
        print()
        print(f"pooled over {', '.join(names)}:")
        outcomes_by_fill(doctor_rows)
        print(f"doctor verdicts right {right_n}/{total} ({right_n / total:.0%}, {wilson_text(right_n, total)})")
        by_source_certainty(doctor_rows)
        estimator = [row for row in doctor_rows if row.ds_estimator != "n/a"]
        ds_right = sum(row.ds_estimator == row.outcome for row in estimator)
        print(
            f"DeepSpeed's model-state estimator on the same runs right {ds_right}/{len(estimator)} "
            f"({ds_right / len(estimator):.0%}, {wilson_text(ds_right, len(estimator))}; stage-0 runs have none)"
        )
    return 0


def held_out_corpora() -> list[str]:
    """Every held-out fit file, bench/data/fit_heldout*.yaml, by name."""
    return sorted(path.stem for path in (REPO / "bench" / "data").glob("fit_heldout*.yaml"))


def in_band(fill: float, low: float, high: float) -> bool:
    """Whether a fill lies in ``(low, high]``; the lowest band also takes a fill of 0."""
    return low < fill <= high or (low == 0 and fill <= high)


FILL_EDGES = (0.0, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.3, float("inf"))


def outcomes_by_fill(rows: list[DoctorRow]) -> None:
    """How often published runs ran out of GPU memory at each predicted fill, and the most any one
    line between "fits" and "oom" could get right with these predictions: what calibration alone can
    reach, whatever the safe line (runs the doctor calls host-oom, or that ran out of host memory,
    are left out of both)."""
    gpu = [row for row in rows if row.verdict != "host-oom" and row.outcome != "host_oom"]
    print("outcomes by dsgen doctor's predicted GPU fill (runs called or ending host-oom left out):")
    for low, high in itertools.pairwise(FILL_EDGES):
        inside = [row for row in gpu if in_band(row.fill, low, high)]
        ooms = sum(row.outcome == "oom" for row in inside)
        upper = "inf" if high == float("inf") else f"{high:.0%}"
        print(f"  ({low:.0%}, {upper}]: {len(inside):3} runs, {ooms:3} ran out of GPU memory")

    def right_below(line: float) -> int:
        return sum((row.fill > line) == (row.outcome == "oom") for row in gpu)

    best_right, best_line = max((right_below(line), line) for line in sorted({0.0, *(row.fill for row in gpu)}))
    ours = right_below(SAFE_LINE)
    print(
        f"  one line between fits and oom: at dsgen's safe line {SAFE_LINE:.0%} {ours}/{len(gpu)} ({ours / len(gpu):.0%})"
        f" right; the best line on these predictions, {best_line:.1%}, {best_right}/{len(gpu)} ({best_right / len(gpu):.0%})"
    )


#: How fully a source states its run, as the case's collector judged it before any scoring: ``strict``
#: (the source itself states model, GPUs, ZeRO stage, offload, micro-batch, precision, checkpointing
#: and a length every batch has; ``strict: true``), ``unsure`` (the collector's note begins
#: "UNSURE": an outcome or input the source leaves open), else ``stated``.
SOURCE_CERTAINTIES = ("strict", "stated", "unsure")


def source_certainty(case: dict[str, Any]) -> str:
    """The collector's judgement of one case's source (:data:`SOURCE_CERTAINTIES`)."""
    if case.get("strict") is True:
        return "strict"
    if str(case.get("note") or "").startswith("UNSURE"):
        return "unsure"
    return "stated"


def by_source_certainty(rows: list[DoctorRow]) -> None:
    """The doctor's verdicts split by how fully each source states its run: where the misses lie
    when the sources leave inputs or outcomes open."""
    print("doctor verdicts by how fully the source states the run (the collector's judgement, made before scoring):")
    for certainty in SOURCE_CERTAINTIES:
        inside = [row for row in rows if source_certainty(row.case) == certainty]
        right_n = sum(row.right for row in inside)
        share = f"{right_n / len(inside):.0%}, {wilson_text(right_n, len(inside))}" if inside else "none"
        print(f"  {certainty:7} {right_n:3}/{len(inside):<3} ({share})")


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95 % for the default z): unlike the
    normal approximation it stays inside [0, 1] and is sound for the few dozen runs a corpus has."""
    if trials == 0:
        return 0.0, 1.0
    share = successes / trials
    denominator = 1 + z * z / trials
    centre = (share + z * z / (2 * trials)) / denominator
    spread = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - spread), min(1.0, centre + spread)


def wilson_text(successes: int, trials: int) -> str:
    low, high = wilson_interval(successes, trials)
    return f"95 % interval {low:.0%}-{high:.0%}"


def score_corpus(name: str, case_ids: list[str], json_path: Path | None, target: str | None = None) -> list[DoctorRow]:
    """Print every figure of one corpus; returns the doctor's verdict on each case."""
    print(f"=== bench/data/{name}.yaml")
    corpus = load_corpus(name)
    case_ids = case_ids or []
    cases = [c for c in corpus["cases"] if not case_ids or c["id"] in case_ids]
    z2, z3, ds_source = _ds_functions()
    rows = []
    tallies = {"dsgen": [0, 0], "run": [0, 0], "ds": [0, 0]}
    release = normalize_release(str(corpus.get("deepspeed_version", spec_default("training.deepspeed_version"))))
    print(f"priced as DeepSpeed {release} (the corpus header's deepspeed_version; a case may name its own)")
    header = (
        f"{'case':44} {'outcome':8} | {'dsgen':8} {'GiB':>6} | {'run knobs':9} {'GiB':>6} | {'cap':>5} | "
        f"{'DS est.':8} {'GPU':>6} {'CPU':>6} | host"
    )
    print(header)
    print("-" * len(header))
    misses = []
    evaluated: list[tuple[dict[str, Any], Evaluation, DsVerdict]] = []
    for case in cases:
        priced = price(case, corpus)
        ds = ds_estimate(case, priced, z2, z3)
        evaluated.append(({**case, "_params": priced.spec.model.parameter_count()}, priced.run, ds))
        outcome = case["outcome"]
        ok_dsgen = right(outcome, priced.dsgen)
        ok_run = right(outcome, priced.run)
        ok_ds = ds.verdict == outcome
        for key, is_right in (("dsgen", ok_dsgen), ("run", ok_run)):
            tallies[key][0] += is_right
            tallies[key][1] += 1
        if ds.verdict != "n/a":
            tallies["ds"][0] += ok_ds
            tallies["ds"][1] += 1
        cap = priced.spec.hardware.gpu.memory_bytes / GIB
        host_known = "host?" if _host_unstated(case) else ""

        def mark(ok: bool) -> str:
            return " " if ok else "✗"

        print(
            f"{case['id'][:44]:44} {outcome:8} | {verdict(priced.dsgen):7}{mark(ok_dsgen)} "
            f"{priced.dsgen.memory.gpu.total / GIB:6.1f} | {verdict(priced.run):8}{mark(ok_run)} "
            f"{priced.run.memory.gpu.total / GIB:6.1f} | {cap:5.1f} | {ds.verdict:7}{mark(ok_ds or ds.verdict == 'n/a')} "
            f"{ds.gpu / GIB:6.1f} {ds.cpu / GIB:6.0f} | {host_known}"
        )
        if not ok_run:
            misses.append((case["id"], miss_reason(case, priced.run, priced.spec.model.parameter_count())))
        rows.append(
            {
                "id": case["id"],
                "outcome": outcome,
                "dsgen_verdict": verdict(priced.dsgen),
                "dsgen_gpu_gib": round(priced.dsgen.memory.gpu.total / GIB, 2),
                "run_knobs_verdict": verdict(priced.run),
                "run_knobs_gpu_gib": round(priced.run.memory.gpu.total / GIB, 2),
                "run_knobs_host_gib": round(priced.run.memory.cpu.total / GIB, 1),
                "run_knobs_overhead_gib": round(peak_overhead(priced.run) / GIB, 2),
                "capacity_gib": round(cap, 2),
                "measured_gib": case.get("measured_gib"),
                "ds_estimator_verdict": ds.verdict,
                "ds_estimator_gpu_gib": round(ds.gpu / GIB, 2),
                "ds_estimator_cpu_gib": round(ds.cpu / GIB, 1),
            }
        )
    print()
    print("misses (priced with the run's own knobs), classified:")
    for case_id, reason in misses:
        print(f"  {case_id}: {reason}")
    measured = [r for r in rows if r["measured_gib"]]
    if measured:
        print()
        print(
            "predicted (run knobs) / measured per-GPU memory where the source reports it; 'w/o X' leaves out dsgen's\n"
            "overhead term (CUDA context, NCCL, allocator slack), which torch.cuda.max_memory_allocated does not see:"
        )
        for r in measured:
            bare = r["run_knobs_gpu_gib"] - r["run_knobs_overhead_gib"]
            print(
                f"  {r['id']:44} {r['run_knobs_gpu_gib']:6.1f} / {r['measured_gib']:5.1f} = "
                f"{r['run_knobs_gpu_gib'] / r['measured_gib']:.2f}   w/o X: {bare:6.1f} = {bare / r['measured_gib']:.2f}"
            )
    print()
    for key, label in (("dsgen", "dsgen (its own knobs)"), ("run", "dsgen (the run's knobs)")):
        n, m = tallies[key]
        print(f"verdicts right {n}/{m} ({n / m:.0%}) - {label}")
    default = float(spec_default("constraints.memory_headroom"))
    at_default = sum(right_at(case["outcome"], e, default) for case, e, _ in evaluated)
    print(
        f"verdicts right {at_default}/{len(evaluated)} ({at_default / len(evaluated):.0%}) - dsgen (the run's knobs) "
        f"at its default memory_headroom {default:g}: the verdict a user gets"
    )
    for case, e, _ in evaluated:
        if not right_at(case["outcome"], e, default):
            print(
                f"  wrong at {default:g}: {case['id']} ({case['outcome']}; GPU {e.memory.gpu.total / e.usable_gpu_bytes:.0%})"
            )
    print()
    print("by outcome (run knobs | DeepSpeed estimator):")
    for kind in VERDICTS:
        of_kind = [(c, e, d) for c, e, d in evaluated if c["outcome"] == kind]
        ok = sum(right(kind, e) for _, e, _ in of_kind)
        with_ds = [d for _, _, d in of_kind if d.verdict != "n/a"]
        ds_ok = sum(d.verdict == kind for d in with_ds)
        print(f"  {kind:9} dsgen {ok}/{len(of_kind)} | DeepSpeed estimator {ds_ok}/{len(with_ds)}")
    print()
    print("GPU verdicts under a memory_headroom h (a plan 'fits' when predicted <= (1 - h) x capacity; run knobs):")
    for h in HEADROOMS:
        ok = wrong_fits = wrong_ooms = 0
        for case, e, _ in evaluated:
            fits_gpu = e.memory.gpu.total <= e.usable_gpu_bytes * (1 - h)
            outcome = case["outcome"]
            if outcome == "fits":
                good = fits_gpu and e.fits_cpu
                wrong_fits += not good
            elif outcome == "oom":
                good = not fits_gpu
                wrong_ooms += not good
            else:
                good = not e.fits_cpu
            ok += good
        print(
            f"  h = {h:.2f}: right {ok}/{len(evaluated)} ({ok / len(evaluated):.0%}); "
            f"runs that fit called oom: {wrong_fits}, runs that ran out of GPU memory called fits: {wrong_ooms}"
        )
    n, m = tallies["ds"]
    if m:
        print(
            f"DeepSpeed estimator {n}/{m} ({n / m:.0%}) - {ds_source}; stage-0 cases have no estimator and are not counted"
        )
    ds_verdicts = {case["id"]: ds.verdict for case, _, ds in evaluated}
    doctor_rows = [
        replace(row, ds_estimator=ds_verdicts[row.case["id"]]) for row in doctor_verdicts(cases, corpus, target)
    ]
    if json_path:
        json_path.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return doctor_rows


def _host_unstated(case: dict[str, Any]) -> bool:
    """Whether the source states no host RAM (the bench then prices UNKNOWN_HOST_GIB)."""
    return not case.get("host_ram_gib")


DOCTOR_RIGHT = {"fits": "fits", "oom": "oom", "host_oom": "host-oom"}  # outcome -> FitVerdict.likely


@dataclass(frozen=True)
class DoctorRow:
    """``dsgen doctor``'s verdict on one published run, beside what the run did."""

    case: dict[str, Any]
    fill: float
    verdict: str
    right: bool
    ds_estimator: str = "n/a"  # DeepSpeed's model-state estimator on the same run (DsVerdict.verdict)

    @property
    def outcome(self) -> str:
        return str(self.case["outcome"])


def doctor_verdicts(cases: list[dict[str, Any]], corpus: dict[str, Any], target: str | None = None) -> list[DoctorRow]:
    """What ``dsgen doctor`` says of every run, and the calibration of its bands (``target``:
    :func:`outcome_specs.doctor_spec`)."""
    print()
    loop = f", run by the {target} target's loop" if target else ""
    print(f"dsgen doctor's own verdict per case (the run's config, a spec pinning only checkpointing{loop}):")
    rows = []
    for case in cases:
        spec = doctor_spec(case, corpus, target)
        d = diagnose(doctor_config(case, corpus, spec.model), spec, max_fixes=0)
        ok = d.fit.likely == DOCTOR_RIGHT[case["outcome"]]
        rows.append(DoctorRow(case, d.fit.fill, d.verdict, ok))
        print(
            f"  {case['id'][:48]:48} {case['outcome']:8} doctor {d.verdict:8} fill {d.fit.fill:6.1%} {'' if ok else 'x'}"
        )
    right_n = sum(row.right for row in rows)
    print(
        f"doctor verdicts right {right_n}/{len(rows)} ({right_n / len(rows):.0%}, {wilson_text(right_n, len(rows))})"
        " - tight read as its band's lean (FitVerdict.likely)"
    )
    for row in rows:
        if not row.right:
            assumed = row.verdict == "host-oom" and _host_unstated(row.case)
            unstated = (
                f", on the {UNKNOWN_HOST_GIB:g} GiB assumed for a host the source does not state" if assumed else ""
            )
            print(f"  wrong: {row.case['id']} ({row.outcome}; doctor {row.verdict} at {row.fill:.0%}{unstated})")
    print()
    print(f"calibration: safe line {SAFE_LINE:.0%} of GPU capacity (1 - the default memory_headroom)")
    gpu_rows = [row for row in rows if row.verdict != "host-oom"]
    for band in BANDS:
        inside = [r for r in gpu_rows if in_band(r.fill, band.low, band.high)]
        ooms = sum(r.outcome == "oom" for r in inside)
        high = "inf" if band.high == float("inf") else f"{band.high:.0%}"
        print(
            f"  calibration {band.verdict:6} ({band.low:.0%}, {high}]: {len(inside)} runs, {ooms} ran out of GPU memory"
            f"  (dsgen.search.verdict.BANDS says {band.runs} / {band.gpu_oom})"
        )
    host = [row for row in rows if row.verdict == "host-oom"]
    on_assumed_host = sum(_host_unstated(row.case) for row in host)
    print(
        f"  host-oom verdicts: {len(host)} runs, {sum(row.outcome == 'host_oom' for row in host)} ran out of host memory"
        f" ({on_assumed_host} of them on the assumed {UNKNOWN_HOST_GIB:g} GiB: the source states no host RAM)"
    )
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
