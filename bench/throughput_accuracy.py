"""dsgen's step-time prediction against published, measured DeepSpeed throughput.

For every run of bench/data/throughput_outcomes.yaml this builds the fully pinned spec of what ran
(bench/outcome_specs.py), solves it, and converts dsgen's predicted step time into the unit the
source measured (tokens/s; samples/s = tokens/s / sequence; iterations/s and 1/runtime = 1 / step
time, the workload per step being the same within a group). It prints, per run, measured and
predicted values and the predicted MFU; per group (runs of one source where one knob varies, or two
where noted), how many pairs dsgen orders as measured; and, for runs whose absolute level is known,
the spread of predicted/measured tokens/s (median, min, max). Both pricings are shown: dsgen's own
knobs and the run's knobs (see bench/outcome_specs.py).

Run: python bench/throughput_accuracy.py [--json rows.json]   (a few seconds)
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for entry in (str(REPO), str(REPO / "bench")):
    if entry not in sys.path:  # run as a script from a checkout: import this dsgen and the bench helpers
        sys.path.insert(0, entry)

from outcome_specs import load_corpus, price  # noqa: E402

from dsgen.solver import Evaluation  # noqa: E402

# Measured values closer than this (relative) are a tie: within run-to-run noise they order nothing.
TIE = 0.03


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write one row per run to this file")
    args = parser.parse_args(argv)

    corpus = load_corpus("throughput_outcomes")
    cases = {c["id"]: c for c in corpus["cases"]}
    predicted: dict[str, dict[str, float]] = {}
    rows = []
    header = (
        f"{'run':40} {'measured':>10} {'unit':16} | {'dsgen':>10} {'ratio':>6} | {'run knobs':>10} {'ratio':>6} | "
        f"{'step s':>7} {'tok/s':>8} {'MFU':>5} {'exposed':>7} {'offload':>7}"
    )
    print(header)
    print("-" * len(header))
    for case_id, case in cases.items():
        priced = price(case, corpus)
        value = float(case["measured"]["value"])
        pred = {"dsgen": in_unit(priced.dsgen, case), "run": in_unit(priced.run, case)}
        predicted[case_id] = pred
        e = priced.run
        relative = case["measured"]["unit"] == "per_runtime"  # 1 / runtime of a workload: only ratios mean anything
        implied_mfu = mfu(e, case, priced.spec.hardware.gpu.peak_tflops(e.plan.precision) * 1e12)
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
