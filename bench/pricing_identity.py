"""Proof that speeding up the pricing of one candidate changes no number.

Every number dsgen reports comes from :func:`dsgen.search.evaluation.evaluate`. This script writes, for a
generated set of specs, a canonical JSON line per priced plan: the plan's fields, every memory
term (GPU, host, NVMe, the model-state record), the step-time terms, the verdict and the reasons,
with floats written by ``repr`` (every bit of them). Run it before and after a change to the
estimators and compare the two files byte for byte (``cmp``).

Two sections, so that a change to the solver's ranking (which is not pricing) can be told apart:

* ``solver``: ``dsgen.api.solve_spec`` on each spec; one line for every evaluation in
  ``result.ranked`` and for ``result.best`` / ``result.closest``. Changes when the search or the
  ranking changes, as well as when pricing does.
* ``direct``: a fixed list of (spec, plan) pairs, priced with ``evaluate`` alone, keyed by plan,
  independent of the solver. The list is every candidate the solver priced when the list was
  recorded (``--plans``, written on first use and only read afterwards). Each line carries the
  plan and the SHA-256 of its canonical record (``--full``: the record itself); one plan in ten is
  priced in DeepSpeed's estimator accounting as well (a line with ``"accounting"``).

    .venv/bin/python bench/pricing_identity.py -o /tmp/pricing_before.jsonl --plans /tmp/pricing_plans.jsonl
    ... change the estimators ...
    .venv/bin/python bench/pricing_identity.py -o /tmp/pricing_after.jsonl --plans /tmp/pricing_plans.jsonl
    cmp /tmp/pricing_before.jsonl /tmp/pricing_after.jsonl

``--section direct`` skips the solver (and the other way round); ``--limit N`` keeps the first N
specs and ``--every N`` one plan in N of the direct section (a quick look). When the solver itself
changed, ``-o SOLVER_OUTPUT --check DIRECT_BEFORE`` checks every evaluation the new solver shows
against the same plan in the old direct section, by plan rather than by rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

from dsgen.api import load_spec, solve_spec
from dsgen.errors import DsgenError
from dsgen.plan import LongContext, ModelParallel, Plan, ZeroKnobs
from dsgen.search.evaluation import Evaluation, evaluate
from dsgen.spec.types import Spec
from dsgen.vocabulary import Accounting

#: The sweep's ten presets (bench/sweep_speed.py): dense models from 124M to 14B parameters.
PRESETS = (
    "gpt2",
    "gpt2-xl",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "llama-3.1-8b",
    "mistral-7b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "gemma-2-9b",
    "phi-3-mini",
)


def _spec(
    preset: str, gpu: str, nodes: int, seq: int, batch: int = 256, **sections: dict[str, Any]
) -> dict[str, Any]:
    """One spec mapping: ``sections`` add keys to training / constraints / hardware."""
    spec: dict[str, Any] = {
        "model": {"preset": preset},
        "hardware": {"gpu": gpu, "gpus_per_node": 8, "nodes": nodes, "cpu_memory_gib": 1024},
        "training": {"sequence_length": seq, "global_batch_size": batch},
    }
    for section, keys in sections.items():
        spec.setdefault(section, {}).update(keys)
    return spec


def generated_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, spec mapping): the 120-spec grid of the profile, then methods, objectives, MoE
    models, AutoTP/AutoEP pins and long sequences with Ulysses."""
    for preset in PRESETS:
        for seq in (1024, 4096, 16384):
            for nodes in (1, 8):
                for gpu in ("h100-80gb", "a100-40gb"):
                    yield f"{preset}-s{seq}-n{nodes}-{gpu}", _spec(preset, gpu, nodes, seq)
    lora = {"rank": 16, "alpha": 32, "target_modules": "all-linear"}
    for preset in ("llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b"):
        for method in ("lora", "qlora", "freeze"):
            for gpu in ("h100-80gb", "a100-40gb"):
                training: dict[str, Any] = {"finetuning": method}
                if method != "freeze":
                    training["lora"] = lora
                yield f"{preset}-{method}-{gpu}", _spec(preset, gpu, 1, 4096, 64, training=training)
    for preset in ("llama-3.1-8b", "qwen2.5-7b"):
        for objective in ("dpo", "grpo", "kto", "ppo"):
            for method in ("full", "lora"):
                training = {"objective": objective, "finetuning": method}
                if objective in ("grpo", "ppo"):  # the training sequence is prompt + completion
                    training["generation"] = {"max_prompt_length": 512, "max_completion_length": 1536}
                if method == "lora":
                    training["lora"] = lora
                yield (
                    f"{preset}-{objective}-{method}",
                    _spec(preset, "h100-80gb", 1, 2048, 64, training=training),
                )
    for preset in ("qwen3-30b-a3b", "mixtral-8x7b"):
        for seq in (4096, 8192):
            yield f"{preset}-s{seq}", _spec(preset, "h100-80gb", 1, seq, 64)
            for ep in (2, 4, 8):
                yield (
                    f"{preset}-s{seq}-ep{ep}",
                    _spec(preset, "h100-80gb", 1, seq, 64, constraints={"expert_parallel_size": ep}),
                )
        yield f"{preset}-lora", _spec(preset, "h100-80gb", 1, 4096, 64, training={"finetuning": "lora"})
    for preset in ("llama-3.1-8b", "qwen2.5-14b", "llama-3.1-70b"):
        for tp in (2, 4, 8):
            yield (
                f"{preset}-tp{tp}",
                _spec(preset, "h100-80gb", 1, 4096, 64, constraints={"tensor_parallel_size": tp}),
            )
        yield f"{preset}-a100-free", _spec(preset, "a100-40gb", 1, 4096, 64)
    for preset, sp in (("llama-3.1-8b", 8), ("qwen2.5-7b", 4)):  # Qwen2.5-7B: 28 query heads
        for seq in (65536, 131072):
            yield f"{preset}-s{seq}", _spec(preset, "h100-80gb", 1, seq, 8)
            yield (
                f"{preset}-s{seq}-sp{sp}",
                _spec(preset, "h100-80gb", 1, seq, 8, constraints={"sequence_parallel_size": sp}),
            )
            yield (
                f"{preset}-s{seq}-sp4-bf16comm",
                _spec(
                    preset,
                    "h100-80gb",
                    1,
                    seq,
                    8,
                    constraints={"sequence_parallel_size": 4, "seq_parallel_communication_data_type": "bf16"},
                ),
            )
    yield "llama-3.1-8b-s32768-4090", _spec("llama-3.1-8b", "rtx-4090", 1, 32768, 8)
    yield "mistral-7b-v100-fp16", _spec("mistral-7b", "v100-32gb", 2, 2048, 64)


# ---- canonical records --------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """``value`` as JSON: dataclasses as their fields and public properties, cached or not (a
    derived term such as ``GpuMemory.total`` is what reports print), floats by ``repr`` so every
    bit counts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        record: dict[str, Any] = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name in sorted(dir(type(value))):
            if name.startswith("_") or not isinstance(getattr(type(value), name), (property, cached_property)):
                continue
            try:
                record["@" + name] = _plain(getattr(value, name))
            except Exception as error:  # a property that raises is part of the behaviour too
                record["@" + name] = f"raises {type(error).__name__}: {error}"
        return record
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return repr(value)


#: What an evaluation says in words or through the verdict's bands (dsgen.search.verdict): not pricing,
#: and worded by other modules, so a record that proves the pricing unchanged leaves them out.
NOT_PRICING = ("@fit", "@host_capacity_note")


def evaluation_record(evaluation: Evaluation) -> dict[str, Any]:
    """Every number one evaluation prices: its fields (plan, every memory and step-time term, the
    usable bytes, the kernel limit), its numeric properties and the shortfall."""
    record = _plain(evaluation)
    for name in NOT_PRICING:
        record.pop(name, None)
    # the inputs the step time is priced from (the spec's model, hardware and training) are not
    # a priced number, and the step time, priced when first asked for, is recorded as the field it was
    record.pop("priced_on", None)
    record.pop("given_step", None)
    record["step"] = record.pop("@step")
    record["shortfall()"] = repr(evaluation.shortfall())
    record["describe()"] = evaluation.plan.describe()
    return record


def canonical(record: Any) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


_PARTS: dict[Any, Any] = {}


def plan_from(data: dict[str, Any]) -> Plan:
    """The plan ``dataclasses.asdict`` wrote, rebuilt. Equal parts (knobs, long-context and
    model-parallel choices) are one object, as in the solver, which builds each once per structure."""
    fields = dict(data)
    for name, cls in (("knobs", ZeroKnobs), ("long_context", LongContext), ("model_parallel", ModelParallel)):
        part = cls(**fields[name])
        fields[name] = _PARTS.setdefault(part, part)
    return Plan(**fields)


# ---- the two sections ---------------------------------------------------------------------
def solver_section(specs: list[tuple[str, Spec]], out: Any, record_plans: Any | None) -> int:
    """Solve each spec; one line per ranked / best / closest evaluation. With ``record_plans``,
    also write every candidate the solver priced (the direct section's fixed list)."""
    import dsgen.search.solver as solver_module

    lines = 0
    original = solver_module.evaluate
    for name, spec in specs:
        seen: set[Plan] = set()
        priced: list[Plan] = []

        def recording(spec_: Spec, plan: Plan, *args: Any, _seen: set[Plan] = seen, _priced: list[Plan] = priced) -> Evaluation:
            if plan not in _seen:
                _seen.add(plan)
                _priced.append(plan)
            return original(spec_, plan, *args)

        solver_module.evaluate = recording  # type: ignore[assignment]
        try:
            result = solve_spec(spec)
        except DsgenError as error:
            out.write(canonical({"section": "solver", "spec": name, "error": str(error)}) + "\n")
            lines += 1
            continue
        finally:
            solver_module.evaluate = original  # type: ignore[assignment]
        shown = [("ranked", i, e) for i, e in enumerate(result.ranked)]
        shown += [(role, 0, e) for role, e in (("best", result.best), ("closest", result.closest)) if e is not None]
        for role, index, evaluation in shown:
            numbers = evaluation_record(evaluation)
            digest = hashlib.sha256(canonical(numbers).encode()).hexdigest()
            record = {"section": "solver", "spec": name, "role": role, "index": index, "sha256": digest, **numbers}
            out.write(canonical(record) + "\n")
            lines += 1
        if record_plans is not None:
            for plan in priced:
                record_plans.write(canonical({"spec": name, "plan": dataclasses.asdict(plan)}) + "\n")
    return lines


def direct_section(specs: dict[str, Spec], plans_file: Path, out: Any, full: bool, every: int = 1) -> int:
    """Price every (spec, plan) of the fixed list with ``evaluate`` alone (of the specs given;
    ``every``: one plan in that many, for a quick look)."""
    lines = 0
    with plans_file.open() as source:
        for index, line in enumerate(source):
            entry = json.loads(line)
            if index % every or entry["spec"] not in specs:
                continue
            plan = plan_from(entry["plan"])
            # dsgen's accounting for every plan; DeepSpeed's estimator's for one in ten
            accountings: tuple[Accounting, ...] = ("dsgen", "deepspeed-estimator") if index % 10 == 0 else ("dsgen",)
            for accounting in accountings:
                text = canonical(evaluation_record(evaluate(specs[entry["spec"]], plan, accounting)))
                record: dict[str, Any] = {"section": "direct", "spec": entry["spec"], "plan": entry["plan"]}
                if accounting != "dsgen":
                    record["accounting"] = accounting
                record["record" if full else "sha256"] = (
                    json.loads(text) if full else hashlib.sha256(text.encode()).hexdigest()
                )
                out.write(canonical(record) + "\n")
                lines += 1
    return lines


def _fields_of(record: dict[str, Any]) -> dict[str, Any]:
    """A plan's fields back from its record in the solver section (properties dropped, floats read)."""
    fields = {name: value for name, value in record.items() if not name.startswith("@")}
    for name in ("knobs", "long_context", "model_parallel"):
        fields[name] = {k: v for k, v in fields[name].items() if not k.startswith("@")}
    fields["offload_ratio"] = float(fields["offload_ratio"])
    return fields


def check(solver_file: Path, direct_file: Path) -> None:
    """Each evaluation a solver section shows, against the same (spec, plan) priced in a direct
    section (of another version, say): the solver's ranking may change, a plan's numbers may not."""
    expected: dict[tuple[str, Plan], str] = {}
    with direct_file.open() as source:
        for line in source:
            entry = json.loads(line)
            if entry["section"] == "direct" and "accounting" not in entry:
                expected[(entry["spec"], plan_from(entry["plan"]))] = entry["sha256"]
    same = differ = unknown = 0
    with solver_file.open() as source:
        for line in source:
            entry = json.loads(line)
            if entry["section"] != "solver" or "error" in entry:
                continue
            want = expected.get((entry["spec"], plan_from(_fields_of(entry["plan"]))))
            if want is None:
                unknown += 1
            elif want == entry["sha256"]:
                same += 1
            else:
                differ += 1
                print(f"differs: {entry['spec']} {entry['describe()']}", file=sys.stderr)
    print(f"solver evaluations: {same} priced the same, {differ} differ, {unknown} not in {direct_file}")
    if differ:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--plans", type=Path, default=Path("/tmp/pricing_plans.jsonl"))
    parser.add_argument("--section", choices=("both", "solver", "direct"), default="both")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--full", action="store_true", help="direct section: whole records, not their hashes")
    parser.add_argument("--every", type=int, default=1, help="direct section: one plan in this many (a quick look)")
    parser.add_argument("--check", type=Path, default=None, help="a direct section: check -o's solver lines against it")
    args = parser.parse_args()
    if args.check is not None:
        check(args.output, args.check)
        return
    specs = [(name, load_spec(data)) for name, data in generated_specs()][: args.limit]
    start = time.perf_counter()
    with args.output.open("w") as out:
        if args.section in ("both", "solver"):
            recording = None if args.plans.exists() else args.plans.open("w")
            try:
                lines = solver_section(specs, out, recording)
            finally:
                if recording is not None:
                    recording.close()
            print(f"solver: {len(specs)} specs, {lines} lines", file=sys.stderr)
        if args.section in ("both", "direct"):
            if not args.plans.exists():
                raise SystemExit(f"{args.plans} does not exist: run the solver section first to record it")
            lines = direct_section(dict(specs), args.plans, out, args.full, args.every)
            print(f"direct: {lines} plans from {args.plans}", file=sys.stderr)
    print(f"wrote {args.output} in {time.perf_counter() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
