"""Compare ``dsgen validate`` with DeepSpeed's own verdicts on the real-world config corpus.

Usage::

    DSGEN_CORPUS=/path/to/corpus python bench/corpus_conformance.py [--version 0.19|0.16|0.14] [-v]

The corpus directory holds the configs plus ``ORACLE-<release>.tsv``: DeepSpeed's verdict per file
(``accept``/``reject``/``skip``), the mode it was checked in (``raw`` = as written, ``hf`` = after the
HF Trainer's "auto" substitutions, ``skip`` = not strict JSON) and the data-parallel size its batch
keys imply. Each file is validated in one process with that world size, ``--target hf-trainer``
for ``hf`` rows, and the release's ``--deepspeed-version``. Printed:

1. rejections DeepSpeed makes that dsgen also reports as errors (target: all of them);
2. configs DeepSpeed accepts that dsgen reports errors on, each with the rule that fired and why
   DeepSpeed is wrong to accept it (target: only such justified ones);
3. what dsgen makes of the rows the oracle skipped (not strict JSON);
4. timing (parse + validate, one process);
5. the severity rule: per rule, errors on configs DeepSpeed's parser accepts, split into "fails at
   initialize" (cited) and the rest (goal: the rest <= 1 % of the corpus).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsgen.errors import DsgenError
from dsgen.validate import RULES, Report, validate_file

#: Most of the corpus that may get an error DeepSpeed neither raises at parse nor at initialize.
REST_BUDGET = 0.01

ORACLES = {"0.19": "0.19.8", "0.16": "0.16.9", "0.14": "0.14.5"}

# Why DeepSpeed is wrong to accept a config that fires a rule of each phase.
WHY = {
    "engine": "DeepSpeedConfig accepts it, but the job fails once the engine starts: {deepspeed}",
    "lint": "DeepSpeed accepts it but does not do what the config says: {deepspeed}",
    "config": "DeepSpeed rejects this elsewhere: {deepspeed}",
}


@dataclass
class Row:
    file: str
    mode: str
    world_size: int | None
    verdict: str
    message: str


@dataclass
class Outcome:
    row: Row
    report: Report | None = None
    load_error: str | None = None
    seconds: float = 0.0
    rules: list[str] = field(default_factory=list)


def read_oracle(corpus: Path, release: str) -> list[Row]:
    path = corpus / f"ORACLE-{release}.tsv"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found (is DSGEN_CORPUS the corpus directory?)")
    with path.open(encoding="utf-8", newline="") as handle:
        return [
            Row(
                r["file"],
                r["mode"],
                int(r["world_size"]) if r["world_size"].isdigit() else None,
                r["verdict"],
                r["message"],
            )
            for r in csv.DictReader(handle, delimiter="\t")
        ]


def run(corpus: Path, rows: list[Row], version: str) -> tuple[list[Outcome], float, float]:
    outcomes = []
    start, cpu_start = time.perf_counter(), time.process_time()
    for row in rows:
        began = time.perf_counter()
        outcome = Outcome(row)
        try:
            outcome.report = validate_file(
                corpus / row.file,
                world_size=row.world_size,
                target="hf-trainer" if row.mode == "hf" else "deepspeed",
                deepspeed_version=version,
            )
            outcome.rules = sorted({f.rule_id for f in outcome.report.errors})
        except DsgenError as exc:
            outcome.load_error = exc.message
        outcome.seconds = time.perf_counter() - began
        outcomes.append(outcome)
    return outcomes, time.perf_counter() - start, time.process_time() - cpu_start


def _short(text: str, width: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def report_rejections(outcomes: list[Outcome]) -> int:
    rejected = [o for o in outcomes if o.row.verdict == "reject"]
    caught = [o for o in rejected if o.report is not None and not o.report.ok]
    same = [o for o in caught if o.report is not None and o.report.rejected_by_deepspeed()]
    print(f"1. Rejections DeepSpeed makes that dsgen also reports as errors: {len(caught)}/{len(rejected)}")
    print(
        f"   ... of which dsgen predicts DeepSpeedConfig's rejection itself (a config-phase rule): "
        f"{len(same)}/{len(rejected)}"
    )
    for o in caught:
        if o not in same:
            assert o.report is not None
            hardware = any(f.rule_id == "aio-gds-cuda" for f in o.report.findings)
            why = (
                "hardware-dependent: DeepSpeed only refuses aio.use_gds on a non-CUDA accelerator (the oracle "
                "ran on CPU); dsgen warns (aio-gds-cuda)"
                if hardware
                else "caught by another rule"
            )
            print(
                f"   - {o.row.file}: DeepSpeed: {_short(o.row.message, 70)}; dsgen errors: {', '.join(o.rules)}; {why}"
            )
    hardware = [
        o
        for o in rejected
        if o not in caught and o.report is not None and any(f.rule_id == "aio-gds-cuda" for f in o.report.findings)
    ]
    for o in hardware:
        print(
            f"   - {o.row.file}: DeepSpeed: {_short(o.row.message, 70)}; hardware-dependent: DeepSpeed refuses "
            "aio.use_gds only on a non-CUDA accelerator (the oracle ran on CPU); dsgen warns (aio-gds-cuda)"
        )
    missed = [o for o in rejected if o not in caught and o not in hardware]
    for o in missed:
        print(f"   MISSED {o.row.file}: {_short(o.row.message)}")
    by_rule = Counter(rule for o in same for rule in o.rules if RULES[rule].phase == "config")
    print("   config-phase rules behind them: " + ", ".join(f"{r} {n}" for r, n in by_rule.most_common()))
    return len(missed)


def report_false_alarms(outcomes: list[Outcome], verbose: bool) -> int:
    accepted = [o for o in outcomes if o.row.verdict == "accept"]
    flagged = [o for o in accepted if o.report is not None and not o.report.ok]
    unexplained = [o for o in flagged if o.report is not None and o.report.rejected_by_deepspeed()]
    print(
        f"\n2. Configs DeepSpeed accepts that dsgen reports errors on: {len(flagged)}/{len(accepted)} "
        f"(each listed with the rule and why DeepSpeed is wrong to accept it)"
    )
    grouped: dict[str, list[Outcome]] = defaultdict(list)
    for o in flagged:
        grouped[" + ".join(o.rules)].append(o)
    for rules, items in sorted(grouped.items(), key=lambda kv: -len(kv[1])):
        print(f"   [{rules}] x{len(items)}")
        for rule in rules.split(" + "):
            info = RULES[rule]
            print(f"      why: {_short(WHY[info.phase].format(deepspeed=info.deepspeed), 150)}")
        for o in items if verbose else items[:3]:
            assert o.report is not None
            first = o.report.errors[0]
            print(f"      - {o.row.file} ({o.row.mode}, W={o.row.world_size}): {_short(first.message, 90)}")
        if not verbose and len(items) > 3:
            print(f"      ... and {len(items) - 3} more (-v lists all)")
    if unexplained:
        print(f"   UNEXPLAINED: {len(unexplained)} accepted configs get a config-phase error:")
        for o in unexplained:
            print(f"   - {o.row.file}: {', '.join(o.rules)}")
    return len(unexplained)


def report_severity_rule(outcomes: list[Outcome], total: int) -> int:
    """Per rule, errors on configs DeepSpeed's parser accepts: those that fail at initialize (the
    rule's phase is ``engine``, its text cites DeepSpeed's source) and the rest. The rest must stay
    within :data:`REST_BUDGET` of the corpus (docs/validation.md, "Severity")."""
    accepted = [o for o in outcomes if o.row.verdict == "accept" and o.report is not None]
    at_init: Counter[str] = Counter()
    rest: Counter[str] = Counter()
    rest_configs = set()
    for o in accepted:
        assert o.report is not None
        for rule_id in sorted({f.rule_id for f in o.report.errors if f.phase == "engine"}):
            at_init[rule_id] += 1
        others = sorted({f.rule_id for f in o.report.errors if f.phase != "engine"})
        for rule_id in others:
            rest[rule_id] += 1
        if others:
            rest_configs.add(o.row.file)
    share = len(rest_configs) / total if total else 0.0
    print(
        f"\n5. Severity rule: errors on the {len(accepted)} configs DeepSpeed's parser accepts, per rule "
        f"(an error must fail at deepspeed.initialize or earlier)"
    )
    for rule_id, n in at_init.most_common():
        print(f"   fails at initialize  {rule_id:<28} {n:>3}   cited: {_short(RULES[rule_id].deepspeed, 90)}")
    for rule_id, n in rest.most_common():
        print(f"   REST                 {rule_id:<28} {n:>3}   {_short(RULES[rule_id].deepspeed, 90)}")
    verdict = "ok" if share <= REST_BUDGET else "OVER BUDGET"
    print(
        f"   the rest: {len(rest_configs)} configs = {100 * share:.2f} % of the {total}-config corpus "
        f"(goal <= {100 * REST_BUDGET:.0f} %): {verdict}"
    )
    return 0 if share <= REST_BUDGET else 1


def report_skipped(outcomes: list[Outcome]) -> None:
    skipped = [o for o in outcomes if o.row.verdict == "skip"]
    parsed = [o for o in skipped if o.report is not None]
    print(
        f"\n3. Rows the oracle skipped (not strict JSON): {len(skipped)}; dsgen parses {len(parsed)} of them "
        f"(comments / trailing commas, as DeepSpeed's hjson loader does) and reports the other "
        f"{len(skipped) - len(parsed)} as invalid JSON with file:line:col (placeholders, templates, ellipses)."
    )


def report_timing(outcomes: list[Outcome], total: float, cpu: float, import_seconds: float) -> None:
    n = len(outcomes)
    slowest = max(outcomes, key=lambda o: o.seconds)
    print(
        f"\n4. Timing: {n} files parsed and validated in {total:.3f} s wall / {cpu:.3f} s CPU in one process "
        f"({1000 * total / n:.2f} ms/file; 300 configs ~ {300 * total / n:.2f} s); "
        f"import dsgen.validate {import_seconds:.3f} s; slowest file {1000 * slowest.seconds:.1f} ms "
        f"({slowest.row.file})."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--version",
        choices=sorted(ORACLES),
        default="0.19",
        help="DeepSpeed release whose oracle to compare with (default 0.19 = 0.19.8)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="list every flagged config")
    args = parser.parse_args(argv)
    value = os.environ.get("DSGEN_CORPUS")
    if not value:
        print(
            "error: DSGEN_CORPUS is not set; point it at the config corpus directory, e.g.\n"
            "  DSGEN_CORPUS=../shared/corpus python bench/corpus_conformance.py",
            file=sys.stderr,
        )
        return 2
    corpus = Path(value)
    if not corpus.is_dir():
        print(f"error: DSGEN_CORPUS={value} is not a directory", file=sys.stderr)
        return 2
    rows = read_oracle(corpus, ORACLES[args.version])
    import_seconds = _import_seconds()
    outcomes, total, cpu = run(corpus, rows, args.version)
    print(f"dsgen validate vs DeepSpeed {ORACLES[args.version]} on {corpus} ({len(rows)} configs)\n")
    missed = report_rejections(outcomes)
    unexplained = report_false_alarms(outcomes, args.verbose)
    report_skipped(outcomes)
    report_timing(outcomes, total, cpu, import_seconds)
    over = report_severity_rule(outcomes, len(rows))
    return 1 if missed or unexplained or over else 0


def _import_seconds() -> float:
    """Cold import time of dsgen.validate, measured in a fresh interpreter."""
    import subprocess

    code = "import time; t = time.perf_counter(); import dsgen.validate; print(time.perf_counter() - t)"
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=60
        )
        return float(out.stdout.strip())
    except (subprocess.SubprocessError, ValueError):
        return float("nan")


if __name__ == "__main__":
    sys.exit(main())
