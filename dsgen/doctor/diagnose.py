"""The doctor's one pass: resolve "auto", validate, derive the batch, price the config, fix it.

Pure function of its inputs (config, spec, world size, Trainer arguments, an OOM message);
:mod:`dsgen.doctor.report` turns the :class:`Diagnosis` into JSON and text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dsgen.doctor.auto_values import Resolved, auto_keys, resolve
from dsgen.doctor.batch import Batch, Parallel, derive, parallel_of
from dsgen.doctor.config_to_plan import ConfigPlan, config_to_plan
from dsgen.doctor.fixes import Fix, find_fixes
from dsgen.doctor.keys import with_changes
from dsgen.doctor.oom_match import OomReading, read_oom
from dsgen.doctor.oom_message import parse_oom
from dsgen.errors import DsgenError, ExitCode
from dsgen.estimate.sequence_parallel import sp_violation
from dsgen.plan import Plan
from dsgen.report import PHASE_LABELS
from dsgen.solver import Evaluation, evaluate, resolve_precision
from dsgen.spec.types import Spec
from dsgen.validate import Report, validate_config
from dsgen.vocabulary import Checkpointing, StepPhase

PHASE_TERMS = {
    "forward_backward": (
        "parameters",
        "backward_gradients",
        "optimizer_states",
        "activations",
        "buffers",
        "transient",
        "overhead",
    ),
    "optimizer_step": ("parameters", "step_gradients", "optimizer_states", "buffers", "step_overhead"),
}
TERM_NAMES = {"backward_gradients": "gradients", "step_gradients": "gradients", "step_overhead": "overhead"}


@dataclass(frozen=True)
class DoctorFinding:
    """Something the doctor wants the user to know; ``error`` makes the config invalid."""

    severity: str  # error | warning | info
    code: str
    message: str
    hint: str | None = None


@dataclass(frozen=True)
class Dominant:
    """The largest GPU memory term in the phase that peaks."""

    phase: StepPhase
    term: str
    bytes: int
    share: float  # of that phase's total


@dataclass(frozen=True)
class Diagnosis:
    """Everything the doctor found; ``verdict`` is fits | oom | host-oom | invalid."""

    verdict: str
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

    @property
    def exit_code(self) -> ExitCode:
        if self.verdict == "invalid":
            return ExitCode.FINDINGS
        if self.verdict in ("oom", "host-oom"):
            return ExitCode.INFEASIBLE
        return ExitCode.OK


def _spec_at(spec: Spec, world_size: int) -> Spec:
    """The spec's hardware with the launcher's world size (whole nodes where it divides)."""
    hw = spec.hardware
    if world_size == hw.world_size:
        return spec
    if world_size % hw.gpus_per_node == 0:
        hardware = replace(hw, nodes=world_size // hw.gpus_per_node)
    else:
        hardware = replace(hw, gpus_per_node=world_size, nodes=1)
    return replace(spec, hardware=hardware)


def _assumptions(spec: Spec, world_size: int) -> dict[str, Any]:
    """Stand-ins for Trainer arguments, from the spec: its pins, its global batch, its precision."""
    c = spec.constraints
    micro = c.micro_batch_size or 1
    accum = c.gradient_accumulation_steps
    if accum is None:
        target = spec.training.global_batch_size
        if target is None and spec.training.tokens_per_step is not None:
            target = spec.training.tokens_per_step // spec.training.sequence_length
        accum = target // (world_size * micro) if target and target % (world_size * micro) == 0 else 1
    precision = resolve_precision(spec)
    return {
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": max(1, accum),
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "gradient_checkpointing": c.activation_checkpointing == "full",
    }


def _checkpointing(spec: Spec, trainer_args: Mapping[str, Any] | None) -> tuple[Checkpointing, str, str | None]:
    """(mode, where it came from, note when assumed)."""
    pinned = spec.constraints.activation_checkpointing
    if trainer_args is not None and "gradient_checkpointing" in trainer_args:
        mode: Checkpointing = "full" if trainer_args["gradient_checkpointing"] else "none"
        note = None
        if pinned is not None and pinned != mode:
            note = (
                f"the spec pins constraints.activation_checkpointing ({pinned}), but the training arguments "
                f"say gradient_checkpointing={bool(trainer_args['gradient_checkpointing'])}; the doctor follows the arguments"
            )
        return mode, "training args gradient_checkpointing", note
    if pinned is not None:
        return pinned, "spec constraints.activation_checkpointing", None
    return (
        "none",
        "assumed",
        "the spec does not say whether the script checkpoints activations (constraints.activation_checkpointing); "
        "assumed it does not",
    )


def _dominant(evaluation: Evaluation) -> Dominant:
    gpu = evaluation.memory.gpu
    phase = gpu.peak_phase
    terms = {name: int(getattr(gpu, name)) for name in PHASE_TERMS[phase]}
    name = max(terms, key=lambda t: terms[t])
    total = gpu.forward_backward if phase == "forward_backward" else gpu.optimizer_step
    return Dominant(phase, TERM_NAMES.get(name, name), terms[name], terms[name] / total if total else 0.0)


def _validate(config: dict[str, Any], resolved: Resolved, parallel: Parallel) -> Report:
    world = parallel.batch_world
    world_size = int(world) if float(world).is_integer() and world >= 1 else None
    if resolved.unresolved:
        return validate_config(config, world_size=world_size, target="hf-trainer")
    return validate_config(resolved.config, world_size=world_size)


def diagnose(
    config: dict[str, Any],
    spec: Spec,
    *,
    world_size: int | None = None,
    trainer_args: Mapping[str, Any] | None = None,
    error_text: str | None = None,
    max_fixes: int = 6,
) -> Diagnosis:
    """Everything ``dsgen doctor`` reports about ``config`` on ``spec``'s cluster."""
    if not isinstance(config, dict):
        raise DsgenError("a DeepSpeed config must be a JSON object")
    if world_size is not None and world_size < 1:
        raise DsgenError(f"--world-size must be a positive integer, got {world_size}")
    world = world_size or spec.hardware.world_size
    spec = _spec_at(spec, world)
    oom_message = parse_oom(error_text) if error_text is not None else None
    findings: list[DoctorFinding] = []
    if world != spec.hardware.world_size:
        findings.append(DoctorFinding("info", "world-size", f"priced on {world} GPUs (--world-size)"))

    assumptions = {} if trainer_args is not None else _assumptions(spec, world)
    resolved = resolve(
        config, trainer_args=trainer_args, assumptions=assumptions, world_size=world, hidden_size=spec.model.hidden_size
    )
    autos = auto_keys(config)
    if autos and trainer_args is None:
        findings.append(
            DoctorFinding(
                "warning",
                "auto-assumed",
                f'"auto" keys resolved without Trainer arguments: {", ".join(autos)}; assumed '
                + ", ".join(resolved.assumed_args),
                "pass --training-args training_args.json to resolve them as your Trainer does",
            )
        )
    for mismatch in resolved.mismatches:
        findings.append(
            DoctorFinding(
                "error",
                "trainer-mismatch",
                f"the HF Trainer refuses this config: {mismatch}",
                'set the DeepSpeed value to "auto", or make the two agree',
            )
        )
    if resolved.unresolved:
        findings.append(
            DoctorFinding(
                "info",
                "auto-unresolved",
                f'"auto" values the Trainer fills later and the prediction does not need: {", ".join(resolved.unresolved)}',
            )
        )
    parallel = parallel_of(resolved.config, world)
    if parallel.sequence_parallel > 1:  # DeepSpeed's Ulysses rules, each naming where it raises
        training = spec.training
        why = sp_violation(spec.model, parallel.sequence_parallel, world, training.sequence_length, training.attention)
        if why:
            findings.append(
                DoctorFinding("error", "sequence-parallel", why, "choose a sequence_parallel_size that satisfies it")
            )
    batch = derive(resolved.config, parallel)
    validation = _validate(config, resolved, parallel)
    for f in validation.findings:
        if f.rule_id == "batch-mismatch" and not batch.ok:
            continue  # the batch-assertion finding below quotes DeepSpeed's own message
        findings.append(DoctorFinding(f.severity, f.rule_id, f.message, f.hint))
    base_changes: dict[str, Any] = {}
    priced_batch = batch
    if not batch.ok:
        consistent = ", ".join(" / ".join(f"{k}={v}" for k, v in option.items()) for option in batch.consistent)
        findings.append(
            DoctorFinding(
                "error",
                "batch-assertion",
                f"DeepSpeedConfig raises: {batch.error} (world size {parallel.world_size}"
                + (f" / sequence_parallel_size {parallel.sequence_parallel}" if parallel.sequence_parallel > 1 else "")
                + ")",
                f"consistent values: {consistent}" if consistent else "give train_micro_batch_size_per_gpu",
            )
        )
        if batch.consistent:
            option = batch.consistent[0]
            base_changes = {k: v for k, v in option.items() if k in config and config[k] != v and config[k] != "auto"}
            priced_batch = Batch(
                option["train_batch_size"],
                option["train_micro_batch_size_per_gpu"],
                option["gradient_accumulation_steps"],
                batch.world,
            )
    global_batch = priced_batch.train_batch_size
    spec_batch = spec.training.global_batch_size
    if global_batch is not None and spec_batch is not None and spec_batch != global_batch:
        findings.append(
            DoctorFinding(
                "info",
                "spec-batch",
                f"the spec asks for a global batch of {spec_batch}; the config runs {global_batch}",
            )
        )
    mode, mode_source, mode_note = _checkpointing(spec, trainer_args)
    if mode_note:
        assumed = mode_source == "assumed"
        findings.append(
            DoctorFinding(
                "warning",
                "checkpointing-assumed" if assumed else "spec-pin",
                mode_note,
                "set constraints.activation_checkpointing in the spec" if assumed else None,
            )
        )

    config_plan: ConfigPlan | None = None
    evaluation: Evaluation | None = None
    if priced_batch.ok or base_changes:
        config_plan = config_to_plan(
            resolved.config if not base_changes else with_changes(resolved.config, base_changes),
            spec,
            priced_batch,
            parallel,
            mode,
            mode_source,
        )
        for note in config_plan.notes:
            pinned = note.startswith("the spec pins")
            findings.append(
                DoctorFinding("warning" if pinned else "info", "spec-pin" if pinned else "config-note", note)
            )
        evaluation = evaluate(spec, config_plan.plan)

    invalid = any(f.severity == "error" for f in findings)
    dominant = _dominant(evaluation) if evaluation is not None else None
    headroom_met = evaluation is not None and evaluation.feasible
    if evaluation is None or invalid:
        verdict = "invalid"
    elif not evaluation.fits_cpu or not evaluation.fits_nvme:
        verdict = "host-oom"
    elif not evaluation.fits_gpu:
        physically = evaluation.memory.gpu.total <= spec.hardware.gpu.memory_bytes
        verdict = "fits" if physically else "oom"
    else:
        verdict = "fits"
    if evaluation is not None and verdict == "fits" and not headroom_met:
        findings.append(
            DoctorFinding(
                "warning",
                "headroom",
                f"fits in {spec.hardware.gpu.name} memory but with less than the requested "
                f"{spec.constraints.memory_headroom:.0%} headroom ({evaluation.reason()})",
            )
        )
    if evaluation is not None and dominant is not None and not evaluation.fits_gpu:
        findings.append(
            DoctorFinding(
                "error" if verdict == "oom" else "warning",
                "gpu-memory",
                f"predicted {evaluation.reason()}; peak in {PHASE_LABELS[dominant.phase]}, dominated by {dominant.term} "
                f"({dominant.share:.0%} of that phase)",
            )
        )
    if evaluation is not None and verdict == "host-oom":
        findings.append(DoctorFinding("error", "host-memory", f"predicted {evaluation.reason()}"))

    fixes: tuple[Fix, ...] = ()
    if config_plan is not None and evaluation is not None and (not evaluation.feasible or base_changes):
        fixes = _fixes(config, config_plan.plan, spec, base_changes, trainer_args, assumptions, world, max_fixes)
    oom = read_oom(oom_message, spec, evaluation) if oom_message is not None and evaluation is not None else None
    if oom_message is not None and evaluation is None:
        findings.append(
            DoctorFinding(
                "warning",
                "error-unmatched",
                "the out-of-memory message cannot be set against a prediction: the config has no batch DeepSpeed accepts",
            )
        )
    return Diagnosis(
        verdict=verdict,
        headroom_met=headroom_met,
        spec=spec,
        world_size=world,
        config=config,
        resolved=resolved,
        parallel=parallel,
        batch=batch,
        validation=validation,
        config_plan=config_plan,
        evaluation=evaluation,
        dominant=dominant,
        findings=tuple(findings),
        fixes=fixes,
        oom=oom,
    )


def _fixes(
    config: dict[str, Any],
    plan: Plan,
    spec: Spec,
    base_changes: Mapping[str, Any],
    trainer_args: Mapping[str, Any] | None,
    assumptions: Mapping[str, Any],
    world: int,
    limit: int,
) -> tuple[Fix, ...]:
    """Memory fixes on top of any batch correction; each fixed config must validate cleanly."""
    base = with_changes(config, base_changes)

    trainer = trainer_args is not None or bool(auto_keys(config))

    def accept(fixed: dict[str, Any], micro: int, accum: int) -> bool:
        args = (
            trainer_args
            if trainer_args is None
            else {
                **trainer_args,
                "per_device_train_batch_size": micro,
                "gradient_accumulation_steps": accum,
            }
        )
        batch_assumptions = {**assumptions, "per_device_train_batch_size": micro, "gradient_accumulation_steps": accum}
        resolved = resolve(
            fixed,
            trainer_args=args,
            assumptions=batch_assumptions,
            world_size=world,
            hidden_size=spec.model.hidden_size,
        )
        parallel = parallel_of(resolved.config, world)
        derived = derive(resolved.config, parallel)
        # DeepSpeed must end up with exactly this split, so the global batch is kept
        same_split = derived.micro_batch_size == micro and derived.gradient_accumulation_steps == accum
        return derived.ok and same_split and not resolved.mismatches and _validate(fixed, resolved, parallel).ok

    fixes = find_fixes(base, plan, spec, lambda p: evaluate(spec, p), accept, trainer, limit)
    prefix = tuple(base_changes.items())
    if prefix:
        fixes = [replace(f, changes=prefix + f.changes, label="consistent batch values + " + f.label) for f in fixes]
        as_is = evaluate(spec, plan)
        if as_is.feasible and accept(base, plan.micro_batch_size, plan.gradient_accumulation_steps):
            fixes.insert(0, Fix("consistent batch values", prefix, (), as_is, base))
    return tuple(fixes[:limit])
