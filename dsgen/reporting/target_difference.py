"""Why the plan for one target differs from the plan for another.

The target is part of what is priced: the HF Trainer's ``compute_loss`` drops the 16-bit logits
before backward and its ``save_model`` gathers a 16-bit state dict on the host
(:class:`dsgen.spec.types.Output`), so ``solve --target hf-trainer`` can choose another plan than
``solve`` does for a bare DeepSpeed loop. When it does, the user should see which priced term made
the difference: the other target's plan is priced under this target, and the term that grew most
where that plan fails (GPU memory, host RAM), or that moved the chosen plan across the ranking's
room line (GPU memory), or else the step-time term, is named.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from dsgen.plan import Plan, plan_dict
from dsgen.search.evaluation import Evaluation, evaluate
from dsgen.search.ranking import has_room
from dsgen.search.solver import SolveResult
from dsgen.search.verdict import ROOM_LINE
from dsgen.spec.types import Spec
from dsgen.units import gib


@dataclass(frozen=True)
class TargetDifference:
    """Which priced term makes ``target`` run another plan than ``baseline_target``.

    ``plan`` is the plan the term is read on: the baseline's plan when it fails under ``target``,
    else the chosen plan when it fails under the baseline target or has room to spare under one
    target only, else the baseline's plan, which then still fits but ranks behind. ``where`` is ``gpu``, ``host`` or ``step_time``; ``baseline``
    and ``chosen`` are the term's value for ``plan`` under each target (bytes, or seconds)."""

    target: str
    baseline_target: str
    baseline_plan: Plan
    plan: Plan
    where: str
    term: str
    baseline: float
    chosen: float
    reason: str

    def sentence(self) -> str:
        """One line for the text output."""
        if self.where == "step_time":
            values = f"{self.baseline:.2f} s under {self.baseline_target}, {self.chosen:.2f} s under {self.target}"
        else:
            values = (
                f"{gib(int(self.baseline))} under {self.baseline_target}, {gib(int(self.chosen))} under {self.target}"
            )
        which = "its" if self.plan == self.baseline_plan else "this"
        return (
            f"the {self.target} target changes the plan ({self.baseline_target} runs "
            f"{self.baseline_plan.describe()}): {which} plan's {self.term} is {values}; {self.reason}"
        )


def with_target(spec: Spec, target: str) -> Spec:
    """``spec`` with ``output.target`` set: the target's training loop is priced."""
    if spec.output.target == target:
        return spec
    return replace(spec, output=replace(spec.output, target=target))


def _numbers(value: object) -> dict[str, float]:
    """The numeric fields of a dataclass, by name (booleans left out)."""
    found: dict[str, float] = {}
    for field in fields(value):  # type: ignore[arg-type]
        number = getattr(value, field.name)
        if isinstance(number, int | float) and not isinstance(number, bool):
            found[field.name] = float(number)
    return found


def _terms(e: Evaluation, where: str) -> dict[str, float]:
    """The priced terms of ``e`` that decide ``where`` (GPU memory, host RAM or step time)."""
    if where == "gpu":
        terms = _numbers(e.memory.gpu)
        terms.pop("capacity")
    elif where == "host":
        terms = _numbers(e.memory.cpu)
        terms.pop("capacity")
        terms["checkpoint_save"] = float(e.memory.cpu.checkpoint_save.peak)
    else:
        terms = _numbers(e.step)
        terms.pop("model_flops")
    return terms


def _failing(e: Evaluation) -> str | None:
    if not e.fits_gpu:
        return "gpu"
    if not e.fits_cpu:
        return "host"
    return None


def target_difference(baseline: SolveResult, chosen: SolveResult) -> TargetDifference | None:
    """Why ``chosen`` (solved for its spec's target) runs another plan than ``baseline`` (the same
    spec for another target); None when the two plans are the same or either found none."""
    if baseline.best is None or chosen.best is None or baseline.best.plan == chosen.best.plan:
        return None
    names = (baseline.spec.output.target, chosen.spec.output.target)
    old_plan, new_plan = baseline.best.plan, chosen.best.plan
    old_under_new = evaluate(chosen.spec, old_plan, chosen.accounting)
    where = _failing(old_under_new)
    if where is not None:  # the baseline's plan does not fit this target
        plan, under_old, under_new = old_plan, baseline.best, old_under_new
        reason = f"under {names[1]} it {old_under_new.reason()}"
    else:
        new_under_old = evaluate(baseline.spec, new_plan, baseline.accounting)
        where = _failing(new_under_old)
        if where is not None:  # the chosen plan fits only this target
            plan, under_old, under_new = new_plan, new_under_old, chosen.best
            reason = f"under {names[0]} it {new_under_old.reason()}"
        elif has_room(new_under_old) != has_room(chosen.best):  # the chosen plan has room under one target only
            plan, under_old, under_new, where = new_plan, new_under_old, chosen.best, "gpu"
            reason = (
                f"both plans fit either target; this one is at {chosen.best.fit.fill:.0%} of GPU memory under "
                f"{names[1]}, {new_under_old.fit.fill:.0%} under {names[0]}, and the ranking prefers a plan "
                f"with room to spare (at or below {ROOM_LINE:.0%}) within the step-time model's error"
            )
        else:  # both fit both: the ranking differs
            plan, under_old, under_new, where = old_plan, baseline.best, old_under_new, "step_time"
            reason = (
                f"both plans fit either target; under {names[1]} the ranking (dsgen.search.ranking: no plan ahead of "
                "one faster and smaller, then room to spare, fewer moving parts, simplicity) puts this one first"
            )
    old_terms, new_terms = _terms(under_old, where), _terms(under_new, where)
    term = max(new_terms, key=lambda k: abs(new_terms[k] - old_terms.get(k, 0.0)))
    return TargetDifference(
        target=names[1],
        baseline_target=names[0],
        baseline_plan=old_plan,
        plan=plan,
        where=where,
        term=term,
        baseline=old_terms.get(term, 0.0),
        chosen=new_terms[term],
        reason=reason,
    )


def difference_dict(difference: TargetDifference | None) -> dict[str, Any] | None:
    """The ``target_difference`` object of ``solve --json`` (null when the target keeps the plan)."""
    if difference is None:
        return None
    return {
        "target": difference.target,
        "baseline_target": difference.baseline_target,
        "baseline_plan": plan_dict(difference.baseline_plan),
        "plan": plan_dict(difference.plan),
        "where": difference.where,
        "term": difference.term,
        "baseline_value": difference.baseline,
        "value": difference.chosen,
        "reason": difference.reason,
    }
