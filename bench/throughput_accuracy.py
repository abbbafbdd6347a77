"""dsgen's step-time prediction against published, measured DeepSpeed throughput.

For every run of bench/data/throughput_outcomes.yaml this builds the fully pinned spec of what ran
(bench/outcome_specs.py), solves it, and converts dsgen's predicted step time into the unit the
source measured (tokens/s; samples/s = tokens/s / sequence; iterations/s and 1/runtime = 1 / step
time, the workload per step being the same within a group). It prints, per run, measured and
predicted values and the predicted MFU; per group (runs of one source where one knob varies, or two
where noted), how many pairs dsgen orders as measured; and, for runs whose absolute level is known,
the spread of predicted/measured tokens/s (median, min, max). Both pricings are shown: dsgen's own
knobs and the run's knobs (see bench/outcome_specs.py).

Under the solver's tie rule (issue 22) a pair predicted within ``STEP_TIME_TIE_BAND`` goes to the
simpler plan (dsgen.search.ranking.simplicity_key), as ``dsgen solve`` would choose; the bench counts those
pairs as the solver orders them. It prints the band's derivation ("pair-ratio error": the median of
|log(predicted ratio / measured ratio)| over the pairs that differ in a dimension the solver
chooses) and the CPU-offload calibration (measured offload seconds / dsgen's first-order price,
dsgen.estimate.throughput.CPU_OFFLOAD_MEASURED_FACTOR).

Run: python bench/throughput_accuracy.py [--json rows.json] [--corpus throughput_heldout]   (a few seconds)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for entry in (str(REPO), str(REPO / "bench")):
    if entry not in sys.path:  # run as a script from a checkout: import this dsgen and the bench helpers
        sys.path.insert(0, entry)

from outcome_specs import load_corpus, price  # noqa: E402

from dsgen.estimate.throughput import CPU_OFFLOAD_MEASURED_FACTOR, STEP_TIME_TIE_BAND  # noqa: E402
from dsgen.search.evaluation import Evaluation  # noqa: E402
from dsgen.search.ranking import rank_within_error  # noqa: E402
from dsgen.spec.types import Spec  # noqa: E402

# Measured values closer than this (relative) are a tie: within run-to-run noise they order nothing.
TIE = 0.03
#: What a group may vary for its pairs to measure the solver's own choices (the tie band's basis).
SOLVER_DIMENSIONS = {
    "zero_stage",
    "offload_optimizer",
    "offload_param",
    "activation_checkpointing",
    "micro_batch",
    "grad_accum",
}


def preferred(a: Evaluation, b: Evaluation, rates: tuple[float, float], specs: tuple[Spec, Spec]) -> int:
    """Which of two plans dsgen puts first (0 = ``a``, 1 = ``b``). Where both steps carry the same
    work, the solver's own ranking decides (dsgen.search.ranking.rank_within_error: within the tie band
    the simpler plan first). Plans whose steps carry different work (another micro-batch at the
    same accumulation) are never ranked against each other by the solver, whose candidates all
    meet one global batch: those go by predicted speed in the measured unit (``rates``)."""
    same_work = a.plan.global_batch_size * a.sequence_length == b.plan.global_batch_size * b.sequence_length
    if same_work and specs[0].model == specs[1].model:
        return 0 if rank_within_error([a, b], specs[0].model)[0] is a else 1
    return 0 if rates[0] >= rates[1] else 1


def in_unit(e: Evaluation, case: dict[str, Any]) -> float:
    """dsgen's prediction for ``e`` in the unit the source measured."""
    unit = case["measured"]["unit"]
    if unit == "tokens_per_s":
        return e.tokens_per_s
    if unit == "samples_per_s":
        return e.tokens_per_s / case["sequence_length"]
    if unit in ("iterations_per_s", "per_runtime"):
        return 1.0 / e.step.total_s
    raise ValueError(f"{case['id']}: unknown unit {unit}")


def measured_tokens_per_s(case: dict[str, Any]) -> float | None:
    m = case["measured"]
    if not case.get("absolute"):
        return None
    if m["unit"] == "tokens_per_s":
        return float(m["value"])
    if m["unit"] == "samples_per_s":
        return float(m["value"]) * case["sequence_length"]
    return None


def ratio_text(predicted: float, measured: float, relative: bool) -> str:
    """predicted/measured, or a dash where the unit is relative (1 / runtime of some workload)."""
    return f"{'-':>6}" if relative else f"{predicted / measured:6.2f}"


def mfu(e: Evaluation, case: dict[str, Any], gpu_peak_flops: float) -> float:
    world = case["gpus_per_node"] * case["nodes"]
    return e.step.model_flops / e.step.total_s / world / gpu_peak_flops


def pair_ratio_errors(
    corpus: dict[str, Any], cases: dict[str, dict[str, Any]], predicted: dict[str, dict[str, float]]
) -> list[float]:
    """|log(predicted ratio / measured ratio)| for every countable pair of a group that varies only
    dimensions the solver chooses (run knobs): the basis of dsgen's tie band."""
    errors = []
    for group in corpus["groups"].values():
        if not set(group["varies"]) <= SOLVER_DIMENSIONS:
            continue
        for a, b in itertools.combinations(group["cases"], 2):
            ma, mb = float(cases[a]["measured"]["value"]), float(cases[b]["measured"]["value"])
            if abs(ma - mb) <= TIE * max(ma, mb):
                continue
            pa, pb = predicted[a]["run"], predicted[b]["run"]
            errors.append(abs(math.log((pa / pb) / (ma / mb))))
    return errors


def offload_calibration(
    corpus: dict[str, Any], cases: dict[str, dict[str, Any]], evaluations: dict[str, tuple[Evaluation, Spec]]
) -> dict[str, tuple[float, float]]:
    """Per optimizer-offload pair: (measured offload seconds per step, dsgen's first-order price).

    Measured seconds come from the measured tokens/s where the source gives an absolute level, else
    from the measured ratio applied to dsgen's step without offload; the first-order price is
    dsgen's offload seconds without CPU_OFFLOAD_MEASURED_FACTOR."""
    found = {}
    for name, group in corpus["groups"].items():
        if group["varies"] != ["offload_optimizer"]:
            continue
        off, on = sorted(group["cases"], key=lambda c: cases[c]["offload_optimizer"] != "none")
        (e_off, _), (e_on, _) = evaluations[off], evaluations[on]
        m_off, m_on = float(cases[off]["measured"]["value"]), float(cases[on]["measured"]["value"])
        tokens_off, tokens_on = measured_tokens_per_s(cases[off]), measured_tokens_per_s(cases[on])
        if tokens_off and tokens_on:
            work = e_on.plan.global_batch_size * cases[on]["sequence_length"]
            measured_extra = work / tokens_on - work / tokens_off
        else:
            measured_extra = e_off.step.total_s * (m_off / m_on - 1)
        priced = e_on.step.offload_s / CPU_OFFLOAD_MEASURED_FACTOR
        if priced > 0:
            found[name] = (measured_extra, priced)
    return found


def price_corpus(
    corpus: dict[str, Any],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, float]], dict[str, tuple[Evaluation, Spec]]]:
    """Every run of ``corpus`` priced: cases by id, predictions in the measured unit, evaluations."""
    cases = {c["id"]: c for c in corpus["cases"]}
    predicted: dict[str, dict[str, float]] = {}
    evaluations: dict[str, tuple[Evaluation, Spec]] = {}
    for case_id, case in cases.items():
        priced = price(case, corpus)
        evaluations[case_id] = (priced.run, priced.spec)
        predicted[case_id] = {"dsgen": in_unit(priced.dsgen, case), "run": in_unit(priced.run, case)}
    return cases, predicted, evaluations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write one row per run to this file")
    parser.add_argument("--corpus", default="throughput_outcomes", help="bench/data/<name>.yaml")
    args = parser.parse_args(argv)

    corpus = load_corpus(args.corpus)
    cases, predicted, evaluations = price_corpus(corpus)
    rows = []
    header = (
        f"{'run':40} {'measured':>10} {'unit':16} | {'dsgen':>10} {'ratio':>6} | {'run knobs':>10} {'ratio':>6} | "
        f"{'step s':>7} {'tok/s':>8} {'MFU':>5} {'exposed':>7} {'offload':>7}"
    )
    print(header)
    print("-" * len(header))
    for case_id, case in cases.items():
        e, spec = evaluations[case_id]
        value = float(case["measured"]["value"])
        pred = predicted[case_id]
        relative = case["measured"]["unit"] == "per_runtime"  # 1 / runtime of a workload: only ratios mean anything
        implied_mfu = mfu(e, case, spec.hardware.gpu.peak_tflops(e.plan.precision) * 1e12)
        print(
            f"{case_id[:40]:40} {value:10.4g} {case['measured']['unit']:16} | {pred['dsgen']:10.4g} "
            f"{ratio_text(pred['dsgen'], value, relative)} | {pred['run']:10.4g} {ratio_text(pred['run'], value, relative)} | {e.step.total_s:7.2f} "
            f"{e.tokens_per_s:8.0f} "
            f"{implied_mfu:5.2f} {e.step.exposed_comm_s:7.2f} {e.step.offload_s:7.2f}"
        )
        tokens = measured_tokens_per_s(case)
        rows.append(
            {
                "id": case_id,
                "measured": value,
                "unit": case["measured"]["unit"],
                "predicted_dsgen_knobs": pred["dsgen"],
                "predicted_run_knobs": pred["run"],
                "step_s_run_knobs": e.step.total_s,
                "compute_s": e.step.compute_s,
                "exposed_comm_s": e.step.exposed_comm_s,
                "offload_s": e.step.offload_s,
                "measured_tokens_per_s": tokens,
                "predicted_tokens_per_s": e.tokens_per_s,
            }
        )

    for key, label in (("dsgen", "dsgen's own knobs"), ("run", "the runs' own knobs")):
        print()
        print(f"pair order within groups ({label}):")
        totals = {"one knob": [0, 0], "two knobs": [0, 0]}
        for name, group in corpus["groups"].items():
            ok = n = 0
            wrong: list[str] = []
            ties: list[str] = []
            for a, b in itertools.combinations(group["cases"], 2):
                ma, mb = float(cases[a]["measured"]["value"]), float(cases[b]["measured"]["value"])
                if abs(ma - mb) <= TIE * max(ma, mb):
                    ties.append(f"{a} vs {b}: measured {ma:.4g}/{mb:.4g}")
                    continue
                pa, pb = predicted[a][key], predicted[b][key]
                n += 1
                if (ma > mb) == (pa > pb) and pa != pb:
                    ok += 1
                else:
                    wrong.append(f"{a} vs {b}: measured {ma:.4g}/{mb:.4g}={ma / mb:.2f}, predicted {pa / pb:.2f}")
            kind = "one knob" if len(group["varies"]) == 1 else "two knobs"
            totals[kind][0] += ok
            totals[kind][1] += n
            print(f"  {name:26} varies {'+'.join(group['varies']):32} {ok}/{n}")
            for line in wrong:
                print(f"      misordered: {line}")
            for line in ties:
                print(f"      measured tie (within {TIE:.0%}), not counted: {line}")
        all_ok = sum(v[0] for v in totals.values())
        all_n = sum(v[1] for v in totals.values())
        for kind, (ok, n) in totals.items():
            print(f"  pairs ordered as measured, {kind} varying: {ok}/{n}")
        print(f"pairs ordered as measured: {all_ok}/{all_n} ({all_ok / all_n:.0%}) - {label}")

    print()
    print(
        f"pair order under the solver's tie rule (run knobs; ties within {STEP_TIME_TIE_BAND:.0%} go to the simpler plan):"
    )
    errors = pair_ratio_errors(corpus, cases, predicted)
    tie_ok = tie_n = 0
    for name, group in corpus["groups"].items():
        for a, b in itertools.combinations(group["cases"], 2):
            ma, mb = float(cases[a]["measured"]["value"]), float(cases[b]["measured"]["value"])
            if abs(ma - mb) <= TIE * max(ma, mb):
                continue
            (ea, sa), (eb, sb) = evaluations[a], evaluations[b]
            pa, pb = predicted[a]["run"], predicted[b]["run"]
            # the solver compares step times of one workload; per-sample units keep the order of
            # plans that differ in sequence or model (their workloads differ), so use the unit's order
            same_work = set(group["varies"]) <= SOLVER_DIMENSIONS
            first = preferred(ea, eb, (pa, pb), (sa, sb)) if same_work else (0 if pa > pb else 1)
            measured_first = 0 if ma > mb else 1
            tie_n += 1
            tie_ok += first == measured_first
            if first != measured_first:
                print(f"  misordered: {name}: {a} vs {b}: measured {ma / mb:.2f}, predicted {pa / pb:.2f}")
    print(
        f"pairs ordered as measured under the tie rule: {tie_ok}/{tie_n} ({tie_ok / tie_n:.0%}) - the runs' own knobs"
    )
    if errors:
        median = statistics.median(errors)
        print(
            f"pair-ratio error over {len(errors)} pairs that vary a solver dimension: median |log(pred/meas)| "
            f"{median:.3f} = {math.exp(median) - 1:.0%} (the tie band in dsgen: {STEP_TIME_TIE_BAND:.0%})"
        )
    calibration = offload_calibration(corpus, cases, evaluations)
    for name, (measured_extra, priced) in calibration.items():
        print(
            f"offload calibration {name}: measured offload {measured_extra:.2f} s / first-order price "
            f"{priced:.2f} s = {measured_extra / priced:.2f}"
        )
    if calibration:
        ratios_off = [m / p for m, p in calibration.values()]
        print(
            f"offload calibration: median {statistics.median(ratios_off):.2f} over {len(ratios_off)} pairs "
            f"(dsgen uses CPU_OFFLOAD_MEASURED_FACTOR {CPU_OFFLOAD_MEASURED_FACTOR})"
        )

    ratios = [
        (r["id"], r["predicted_tokens_per_s"] / r["measured_tokens_per_s"]) for r in rows if r["measured_tokens_per_s"]
    ]
    if ratios:
        values = [v for _, v in ratios]
        print()
        print("predicted/measured tokens/s (run knobs) where the absolute level is known:")
        for case_id, v in ratios:
            print(f"  {case_id:40} {v:5.2f}")
        print(
            f"spread predicted/measured: median {statistics.median(values):.2f}, min {min(values):.2f}, "
            f"max {max(values):.2f} over {len(values)} runs"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
