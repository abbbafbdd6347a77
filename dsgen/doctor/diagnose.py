"""The doctor's one pass: read the run (:mod:`dsgen.doctor.reading`: "auto" values, DeepSpeed's
batch, the validator, the Trainer's optimizer and lengths, the plan), price it, fix it from the
solver's search, report.

Pure function of its inputs (config, spec, world size, Trainer arguments, an OOM message);
:mod:`dsgen.doctor.report` turns the :class:`Diagnosis` into JSON and text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from dsgen.doctor.auto_values import Resolved, auto_keys
from dsgen.doctor.batch import Batch, Parallel
from dsgen.doctor.config_to_plan import ConfigPlan, config_to_plan
from dsgen.doctor.evaluation_batch import evaluation_notes
from dsgen.doctor.findings import DoctorFinding
from dsgen.doctor.fixes import Fix, find_fixes, plan_changes
from dsgen.doctor.keys import with_changes
from dsgen.doctor.method_fixes import MethodFix, method_fixes
from dsgen.doctor.nearest import MoreGpus, NearMiss, more_gpus, nearest_plans
from dsgen.doctor.objective_batch import objective_batch_notes
from dsgen.doctor.oom_match import OomReading, read_oom
from dsgen.doctor.oom_message import OomMessage, parse_oom
from dsgen.doctor.reading import ConfigReading, RunReading, read_config, read_run, run_validator, spec_at
from dsgen.doctor.run_optimizer import with_run_optimizer
from dsgen.errors import DsgenError, ExitCode
from dsgen.estimate.kernel_limits import KERNEL_LIMIT_HINT
from dsgen.plan import Plan
from dsgen.reporting.report import PHASE_LABELS
from dsgen.search.evaluation import Evaluation, evaluate
from dsgen.search.solver import SolveResult, solve
from dsgen.search.verdict import SAFE_LINE, FitVerdict, invalid
from dsgen.spec.types import Spec
from dsgen.units import gib
from dsgen.validate import Report
from dsgen.vocabulary import StepPhase


@dataclass(frozen=True)
class Dominant:
    """The largest GPU memory term in the phase that peaks."""

    phase: StepPhase
    term: str
    bytes: int
    share: float  # of that phase's total


@dataclass(frozen=True)
class Diagnosis:
    """Everything the doctor found; ``fit.verdict`` is fits | tight | oom | host-oom | invalid
    (dsgen.search.verdict); ``headroom_met``: the spec's own memory_headroom is met."""

    fit: FitVerdict
    headroom_met: bool
    spec: Spec
    world_size: int
    config: dict[str, Any]
    resolved: Resolved
    parallel: Parallel
    batch: Batch
    validation: Report
    config_plan: ConfigPlan | None
    evaluation: Evaluation | None
    dominant: Dominant | None
    findings: tuple[DoctorFinding, ...]
    fixes: tuple[Fix, ...]
    oom: OomReading | None
    method_fixes: tuple[MethodFix, ...] = ()  # changes to what the run trains (not config fixes)
    nearest: tuple[NearMiss, ...] = ()  # when no fix fits: the plans that miss by least, and by how much
    more_gpus: MoreGpus | None = None  # when no fix fits: the fewest nodes like the run's on which one does

    @property
    def verdict(self) -> str:
        return self.fit.verdict

    @property
    def exit_code(self) -> ExitCode:
        """0 for fits, 3 for tight, oom or host-oom, 1 for an invalid config (docs/exit-codes.md)."""
        if self.verdict == "invalid":
            return ExitCode.FINDINGS
        if self.verdict in ("tight", "oom", "host-oom"):
            return ExitCode.INFEASIBLE
        return ExitCode.OK


def _dominant(evaluation: Evaluation) -> Dominant:
    gpu = evaluation.memory.gpu
    phase = gpu.peak_phase
    terms = gpu.phase_terms(phase)
    name = max(terms, key=lambda t: terms[t])
    total = {"forward_backward": gpu.forward_backward, "optimizer_step": gpu.optimizer_step}.get(
        phase, gpu.generation_phase
    )
    return Dominant(phase, name, terms[name], terms[name] / total if total else 0.0)


@dataclass(frozen=True)
class _Pricing:
    """The run's evaluation, its verdict, and what pricing found (the Trainer's evaluation
    batch, the objective's batch, the memory findings)."""

    evaluation: Evaluation | None
    fit: FitVerdict
    dominant: Dominant | None
    findings: tuple[DoctorFinding, ...]


def diagnose(
    config: dict[str, Any],
    spec: Spec,
    *,
    world_size: int | None = None,
    trainer_args: Mapping[str, Any] | None = None,
    error_text: str | None = None,
    max_fixes: int = 6,
) -> Diagnosis:
    """Everything ``dsgen doctor`` reports about ``config`` on ``spec``'s cluster: the run read
    once (:func:`dsgen.doctor.reading.read_run`), then priced, fixed and reported."""
    reading = read_run(config, spec, world_size=world_size, trainer_args=trainer_args)
    oom_message = parse_oom(error_text) if error_text is not None else None
    pricing = _price(reading)
    search = _fix(reading, pricing, max_fixes)
    diagnosis = _report(reading, pricing, search.fixes, oom_message)
    return replace(diagnosis, **_leads(reading, pricing, search))


def _price(reading: RunReading) -> _Pricing:
    """The run's plan priced by the solver's own models, and its calibrated verdict (``invalid``
    when reading found an error, or there is no batch DeepSpeed accepts)."""
    spec, plan = reading.spec, reading.plan
    findings: list[DoctorFinding] = []
    evaluation: Evaluation | None = None
    if plan is not None:
        evaluation = evaluate(spec, plan)
        trainer_args = reading.trainer_args or {}
        for code, message, hint in evaluation_notes(trainer_args, evaluation, spec):
            findings.append(DoctorFinding("warning", code, message, hint))
        for severity, code, message, hint in objective_batch_notes(spec, plan, trainer_args):
            findings.append(DoctorFinding(severity, code, message, hint))
    refused = reading.refused or any(f.severity == "error" for f in findings)
    if evaluation is None or refused:
        fill = evaluation.fit.fill if evaluation is not None else None
        fit = invalid(fill)
    else:
        fit = evaluation.fit
    dominant = _dominant(evaluation) if evaluation is not None else None
    findings += _memory_findings(spec, evaluation, fit, dominant)
    return _Pricing(evaluation, fit, dominant, tuple(findings))


def _gathered_save_hint(evaluation: Evaluation) -> str | None:
    """When the HF Trainer's gathered 16-bit model is what a ZeRO-3 checkpoint save runs out on,
    the key that drops it (the Trainer then saves DeepSpeed's checkpoint alone: transformers
    ``trainer.py`` ``save_model``'s fallback), and what it saves; None otherwise."""
    cpu = evaluation.memory.cpu
    save = cpu.checkpoint_save
    if evaluation.plan.zero_stage != 3 or cpu.saving != cpu.total or save.state_dict <= save.engine:
        return None
    return (
        f'"stage3_gather_16bit_weights_on_model_save": false saves {gib(save.state_dict - save.engine)} of host RAM at '
        "each save: the Trainer writes DeepSpeed's checkpoint alone, and zero_to_fp32.py in it recovers the weights"
    )


def _memory_findings(
    spec: Spec, evaluation: Evaluation | None, fit: FitVerdict, dominant: Dominant | None
) -> list[DoctorFinding]:
    """What the verdict rests on: the band's evidence for tight, the numbers for oom and host-oom."""
    if evaluation is None:
        return []
    findings = []
    gpu = spec.hardware.gpu
    if fit.verdict == "tight":
        findings.append(
            DoctorFinding(
                "warning",
                "tight",
                f"predicted at {fit.fill:.0%} of GPU memory ({gpu.name}), above the safe line "
                f"({fit.band.low if fit.band else 0:.0%}): {fit.evidence}",
                "apply one of the fixes below, or accept the risk",
            )
        )
    if fit.verdict == "fits" and not evaluation.fits_gpu:
        findings.append(
            DoctorFinding(
                "warning",
                "headroom",
                f"fits below the calibrated safe line but with less than the spec's own "
                f"{spec.constraints.memory_headroom:.0%} headroom ({evaluation.reason()})",
            )
        )
    if dominant is not None and fit.verdict in ("tight", "oom"):
        findings.append(
            DoctorFinding(
                "error" if fit.verdict == "oom" else "warning",
                "gpu-memory",
                f"predicted {gib(evaluation.memory.gpu.total)} per GPU of {gib(gpu.memory_bytes)} ({fit.fill:.0%} of GPU memory); "
                f"peak in {PHASE_LABELS[dominant.phase]}, dominated by {dominant.term} "
                f"({dominant.share:.0%} of that phase)",
            )
        )
    if fit.verdict == "host-oom":
        findings.append(
            DoctorFinding(
                "error",
                "host-memory",
                f"predicted to run out: the config {evaluation.reason()}",
                _gathered_save_hint(evaluation),
            )
        )
    if evaluation.host_unjudged:
        cpu = evaluation.memory.cpu
        findings.append(
            DoctorFinding(
                "warning",
                "host-memory",
                f"host RAM not judged: the config needs {gib(cpu.total)} per node, more than the "
                f"{gib(evaluation.usable_cpu_bytes)} usable of the {gib(cpu.capacity)} assumed for a node "
                "whose RAM the spec does not state",
                "state hardware.cpu_memory_gib to have it checked",
            )
        )
    if evaluation.kernel_limit is not None:
        findings.append(
            DoctorFinding(
                "error",
                "kernel-limit",
                evaluation.kernel_limit,
                KERNEL_LIMIT_HINT,
            )
        )
    return findings


@dataclass(frozen=True)
class _Search:
    """The fixes found, and the solver's result on the last spec searched for them (the spec's own
    headroom), whose near misses lead on when no fix fits."""

    fixes: tuple[Fix, ...] = ()
    result: SolveResult | None = None


def _needs_fix(p: _Pricing) -> bool:
    return p.evaluation is not None and (p.fit.verdict in ("tight", "oom", "host-oom") or not p.evaluation.feasible)


def _fix(reading: RunReading, p: _Pricing, limit: int) -> _Search:
    """Fixes from the solver's search, for a config that is tight, out of memory or needs its
    batch corrected; nothing for one that fits."""
    if reading.plan is None or p.evaluation is None or limit <= 0:
        return _Search()
    if not _needs_fix(p) and not reading.base_changes:
        return _Search()
    return _fixes(reading, reading.plan, limit)


def _leads(reading: RunReading, p: _Pricing, search: _Search) -> dict[str, Any]:
    """Where the doctor leads beyond the config fixes: the lighter methods, each at its own best
    plan (for a run that does not fit), and, when no fix fits, the nearest plans with what each
    lacks and the fewest nodes like the run's on which a plan fits. Diagnosis fields by name."""
    plan = reading.plan
    if plan is None or p.evaluation is None or p.evaluation.feasible:
        return {}
    spec = reading.search_spec
    trainer = _under_trainer(reading)
    base = with_changes(reading.config, reading.base_changes)

    def best_plan(alternative: Spec) -> Evaluation | None:
        for headroom in _headrooms(alternative):
            result = _solve_or_none(_search_spec(alternative, plan, plan.data_parallel_size, headroom))
            if result is not None and result.feasible:
                return result.best
        return None

    def changes_to(target: Plan) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
        changes, script = plan_changes(base, plan, target, spec, trainer)
        return tuple(reading.base_changes.items()) + changes, script

    leads: dict[str, Any] = {"method_fixes": method_fixes(spec, best_plan, changes_to)}
    if search.fixes or not _needs_fix(p) or search.result is None:
        return leads
    leads["nearest"] = nearest_plans(search.result)
    ranks = reading.world_size // plan.data_parallel_size if reading.world_size % plan.data_parallel_size == 0 else 0
    if ranks:
        safe = max(spec.constraints.memory_headroom, 1 - SAFE_LINE)
        leads["more_gpus"] = more_gpus(
            spec_at(spec, reading.world_size), partial(_search_on, plan=plan, ranks=ranks, headroom=safe)
        )
    return leads


def _search_on(larger: Spec, *, plan: Plan, ranks: int, headroom: float) -> Spec:
    """The doctor's search on a larger cluster of the run's nodes: its data-parallel ranks (every
    ``ranks`` GPUs hold one replica, as in the run)."""
    world = larger.hardware.world_size
    if world % ranks:
        raise DsgenError(f"{world} GPUs do not split into replicas of {ranks}")
    return _search_spec(larger, plan, world // ranks, headroom)


def _solve_or_none(spec: Spec) -> SolveResult | None:
    """The solver's result, or None where the spec leaves no plan to search (no batch split)."""
    try:
        return solve(spec)
    except DsgenError:
        return None


def _headrooms(spec: Spec) -> list[float]:
    """The headrooms a fix is searched at, strictest first: below the calibrated safe line even
    where the spec asks for less headroom, then the spec's own (see :func:`_fixes`)."""
    own = spec.constraints.memory_headroom
    return sorted({max(own, 1 - SAFE_LINE), own}, reverse=True)


def _search_spec(spec: Spec, plan: Plan, data_parallel: int, headroom: float) -> Spec:
    """The spec the doctor searches for fixes on ``data_parallel`` ranks at ``headroom``."""
    return _fix_spec(_with_headroom(spec_at(spec, data_parallel), headroom), plan)


def _under_trainer(reading: RunReading) -> bool:
    """Whether the HF Trainer sets the batch (its arguments given, or "auto" keys in the config)."""
    return reading.trainer_args is not None or bool(auto_keys(reading.config))


def _report(reading: RunReading, p: _Pricing, fixes: tuple[Fix, ...], oom_message: OomMessage | None) -> Diagnosis:
    """The Diagnosis, with the out-of-memory message read against the prediction."""
    findings = [*reading.findings, *p.findings]
    spec = reading.spec
    oom = read_oom(oom_message, spec, p.evaluation) if oom_message is not None and p.evaluation is not None else None
    if oom_message is not None and p.evaluation is None:
        findings.append(
            DoctorFinding(
                "warning",
                "error-unmatched",
                "the out-of-memory message cannot be set against a prediction: the config has no batch DeepSpeed accepts",
            )
        )
    return Diagnosis(
        fit=p.fit,
        headroom_met=p.evaluation is not None and p.evaluation.feasible,
        spec=spec,
        world_size=reading.world_size,
        config=reading.config,
        resolved=reading.resolved,
        parallel=reading.parallel,
        batch=reading.batch,
        validation=reading.validation,
        config_plan=reading.config_plan,
        evaluation=p.evaluation,
        dominant=p.dominant,
        findings=tuple(findings),
        fixes=fixes,
        oom=oom,
    )


def _with_headroom(spec: Spec, headroom: float) -> Spec:
    if headroom == spec.constraints.memory_headroom:
        return spec
    return replace(spec, constraints=replace(spec.constraints, memory_headroom=headroom))


def _fix_spec(spec: Spec, plan: Plan) -> Spec:
    """The spec ``dsgen solve`` would search for this run: the config's precision, global batch,
    Ulysses degree (set in the training script as well, so a fix keeps it) and SP reduction dtype,
    every other search dimension free (the doctor reads them from the config, the fix may change
    them)."""
    constraints = replace(
        spec.constraints,
        sequence_parallel_size=plan.long_context.sequence_parallel_size,
        seq_parallel_communication_data_type=plan.long_context.communication_dtype,
        zero_stage=None,
        offload_optimizer=None,
        offload_param=None,
        activation_checkpointing=None,
        micro_batch_size=None,
        gradient_accumulation_steps=None,
        allow_batch_rounding="none",
    )
    training = replace(
        spec.training, global_batch_size=plan.global_batch_size, tokens_per_step=None, precision=plan.precision
    )
    return replace(spec, training=training, constraints=constraints)


def _fixes(reading: RunReading, plan: Plan, limit: int) -> _Search:
    """Fixes from the solver's ranked plans on top of any batch correction; each fixed config is
    read back as the doctor reads any config (:func:`dsgen.doctor.reading.read_config`) and must
    validate cleanly and fit."""
    spec, trainer_args, world = reading.search_spec, reading.trainer_args, reading.world_size
    base_changes = reading.base_changes
    base = with_changes(reading.config, base_changes)
    trainer = _under_trainer(reading)

    def read(fixed: dict[str, Any], micro: int, accum: int) -> ConfigReading | None:
        args = (
            trainer_args
            if trainer_args is None
            else {**trainer_args, "per_device_train_batch_size": micro, "gradient_accumulation_steps": accum}
        )
        stand_ins = {**reading.assumptions, "per_device_train_batch_size": micro, "gradient_accumulation_steps": accum}
        fixed_reading = read_config(fixed, spec, world, args, stand_ins)
        derived = fixed_reading.batch
        # DeepSpeed must end up with exactly this split, so the global batch is kept
        same_split = derived.micro_batch_size == micro and derived.gradient_accumulation_steps == accum
        ok = (
            derived.ok
            and same_split
            and not fixed_reading.resolved.mismatches
            and run_validator(fixed, fixed_reading, spec).ok
        )
        return fixed_reading if ok else None

    def price_at(headroom: float, fixed: dict[str, Any], target: Plan) -> Evaluation | None:
        fixed_reading = read(fixed, target.micro_batch_size, target.gradient_accumulation_steps)
        if fixed_reading is None:
            return None
        resolved = fixed_reading.resolved
        fixed_plan = config_to_plan(
            resolved.config, spec, fixed_reading.batch, fixed_reading.parallel, target.checkpointing, "fix"
        ).plan
        return evaluate(_with_headroom(with_run_optimizer(spec, resolved.config, trainer_args), headroom), fixed_plan)

    prefix = tuple(base_changes.items())
    fixes: list[Fix] = []
    # A fix should fit below the calibrated safe line even where the spec asks for less headroom;
    # only when no plan does are the plans the spec's own headroom allows offered (so a config gets
    # a fix whenever dsgen solve finds a plan). The solver searches data parallelism over the ranks
    # ZeRO shards across (sequence, tensor or pipeline ranks are priced as the doctor prices them).
    result: SolveResult | None = None
    for headroom in _headrooms(spec):
        result = _solve_or_none(_search_spec(spec, plan, plan.data_parallel_size, headroom))
        ranked = result.ranked if result is not None else ()
        fixes = find_fixes(base, plan, ranked, spec, partial(price_at, headroom), trainer, limit)
        if fixes:
            break
    if prefix:
        fixes = [replace(f, changes=prefix + f.changes, label="consistent batch values + " + f.label) for f in fixes]
        as_is = evaluate(with_run_optimizer(spec, base, trainer_args), plan)
        if as_is.feasible and read(base, plan.micro_batch_size, plan.gradient_accumulation_steps) is not None:
            fixes.insert(0, Fix("consistent batch values", prefix, (), as_is, base))
    return _Search(tuple(fixes[:limit]), result)
