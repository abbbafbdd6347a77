"""Microseconds per candidate: what one :func:`dsgen.search.evaluation.evaluate` call costs the solver.

The solver prices every candidate it searches with ``evaluate`` (about 580 per spec), so its cost
per call is most of a solve's. This bench prices a fixed list of (spec, plan) pairs, the
candidates the solver priced for the 120-spec grid of ``bench/pricing_identity.py`` (10 presets x
3 lengths x 1 or 8 nodes x H100 or A100 40 GB), in the solver's order, in one fresh process, and
prints the mean over all of them, in the process's CPU time and in wall time. The first pass
starts with every cache empty, as a solve in a fresh process does; the later passes show what is
left once every memoised term is warm.

On a shared machine both clocks move with the neighbours' load, so ``--instructions`` also counts
the instructions per call with callgrind (valgrind): the same process run with no pass and with
one, the difference over the candidates priced. That figure does not move with the load; it is
the one to compare two versions of the estimators by (``--every 10``, the candidates of one spec
in ten, keeps it to minutes).

The list is read from ``--plans`` (a file ``bench/pricing_identity.py`` wrote); without one it is
recorded first from the solver (warming the caches), so the figure for two versions of the
estimators is comparable only over the same file:

    .venv/bin/python bench/pricing_identity.py -o /tmp/pricing.jsonl --plans /tmp/pricing_plans.jsonl --section solver
    .venv/bin/python bench/candidate_speed.py --plans /tmp/pricing_plans.jsonl
    .venv/bin/python bench/candidate_speed.py --plans /tmp/pricing_plans.jsonl --every 10 --instructions
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

from pricing_identity import generated_specs, plan_from, solver_section  # bench/pricing_identity.py
from solve_speed import instructions  # bench/solve_speed.py: callgrind's count of one run

from dsgen.api import load_spec
from dsgen.plan import Plan
from dsgen.search.evaluation import evaluate
from dsgen.spec.types import Spec

GRID = 120  # the first specs of generated_specs(): the profile's grid


def fixed_list(plans_file: Path | None, specs: dict[str, Spec], every: int = 1) -> list[tuple[Spec, Plan]]:
    """(spec, plan) in the order recorded, of one spec in ``every`` of ``specs`` (each with all its
    candidates, in order: the caches see what a solve shows them); recorded from the solver first
    when no file is given."""
    if plans_file is None:
        with tempfile.TemporaryDirectory() as tmp:
            recorded = Path(tmp) / "plans.jsonl"
            with recorded.open("w") as out, open("/dev/null", "w") as sink:
                solver_section(list(specs.items()), sink, out)
            return fixed_list(recorded, specs, every)
    kept = set(list(specs)[::every])
    pairs = []
    with plans_file.open() as source:
        for line in source:
            # canonical JSON, keys sorted: the spec's name is the last value, read before the plan
            name = json.loads(line[line.rindex('"spec":') + len('"spec":') :].rstrip().removesuffix("}"))
            if name in kept:
                pairs.append((specs[name], plan_from(json.loads(line)["plan"])))
    return pairs


def count_instructions(plans: Path, every: int, candidates: int) -> None:
    """Instructions per ``evaluate`` call: one cold pass less the same process without it."""
    base = [sys.executable, __file__, "--plans", str(plans), "--every", str(every)]
    without = instructions([*base, "--passes", "0"])
    with_pass = instructions([*base, "--passes", "1"])
    if without is None or with_pass is None:
        raise SystemExit("--instructions needs valgrind")
    print(f"{(with_pass - without) / candidates:,.0f} instructions per evaluate() (callgrind, cold pass)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", type=Path, default=None, help="a plan list bench/pricing_identity.py wrote")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--every", type=int, default=1, help="price the candidates of one spec in this many")
    parser.add_argument("--instructions", action="store_true", help="also count instructions with callgrind")
    args = parser.parse_args()
    specs = {name: load_spec(data) for name, data in list(generated_specs())[:GRID]}
    pairs = fixed_list(args.plans, specs, args.every)
    if args.plans is None:  # recording warmed the caches: start again from a fresh process
        print("recorded the plan list from the solver; pass --plans for a cold first pass", file=sys.stderr)
    gc.collect()
    for index in range(args.passes):
        start, start_cpu = time.perf_counter(), time.process_time()
        for spec, plan in pairs:
            evaluate(spec, plan)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        label = "cold caches" if index == 0 else "warm caches"
        print(
            f"pass {index + 1} ({label}): {len(pairs)} candidates of {len(specs)} specs: "
            f"{cpu / len(pairs) * 1e6:.1f} us CPU per evaluate() ({elapsed / len(pairs) * 1e6:.1f} us wall)"
        )
    if args.instructions:
        if args.plans is None:
            raise SystemExit("--instructions needs --plans (both runs must price the same list)")
        count_instructions(args.plans, args.every, len(pairs))


if __name__ == "__main__":
    main()
