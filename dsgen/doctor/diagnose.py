"""The doctor's one pass, as the steps it performs: resolve "auto" values, validate (with
DeepSpeed's batch derivation), price the config, fix it from the solver's search, report.

Pure function of its inputs (config, spec, world size, Trainer arguments, an OOM message);
:mod:`dsgen.doctor.report` turns the :class:`Diagnosis` into JSON and text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from dsgen.deepspeed_release import profile_of
from dsgen.doctor.auto_values import Resolved, auto_keys, resolve
from dsgen.doctor.batch import Batch, Parallel, derive, parallel_of
from dsgen.doctor.config_to_plan import ConfigPlan, config_to_plan
from dsgen.doctor.evaluation_batch import evaluation_notes
from dsgen.doctor.fixes import Fix, find_fixes
from dsgen.doctor.keys import with_changes
from dsgen.doctor.method_fixes import MethodFix, method_fixes
from dsgen.doctor.objective_batch import objective_batch_notes
from dsgen.doctor.oom_match import OomReading, read_oom
from dsgen.doctor.oom_message import OomMessage, parse_oom
from dsgen.doctor.parallelism import accelerate_data_parallel_size, sp_disagreement, trainer_sp_size
from dsgen.doctor.run_optimizer import run_optimizer, with_run_optimizer
from dsgen.doctor.sequence_length import run_sequence_length
from dsgen.errors import DsgenError, ExitCode
from dsgen.estimate.kernel_limits import KERNEL_LIMIT_HINT
from dsgen.estimate.memory import HELD_BESIDE_TERMS, GpuMemory
from dsgen.estimate.sequence_parallel import sp_violation
from dsgen.evaluation import Evaluation, evaluate
from dsgen.long_context import TRICKS
from dsgen.plan import Plan
from dsgen.report import PHASE_LABELS
from dsgen.solver import resolve_precision, solve
from dsgen.spec.types import Spec
from dsgen.units import gib
from dsgen.validate import Report, validate_config
from dsgen.verdict import SAFE_LINE, FitVerdict, invalid
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
        *HELD_BESIDE_TERMS,
    ),
    "optimizer_step": (
        "parameters",
        "step_gradients",
        "optimizer_states",
        "step_buffers",
        "step_temporary",
        "step_overhead",
        *HELD_BESIDE_TERMS,
    ),
    "generation": (
        "parameters",
        "optimizer_states",
        "step_buffers",
        "step_overhead",
        "generation",
        "generation_gather",
        *HELD_BESIDE_TERMS,
    ),
}
TERM_NAMES = {
    "backward_gradients": "gradients",
    "step_gradients": "gradients",
    "step_buffers": "buffers",
    "step_temporary": "transient",
    "step_overhead": "overhead",
}


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
    """Everything the doctor found; ``fit.verdict`` is fits | tight | oom | host-oom | invalid
    (dsgen.verdict); ``headroom_met``: the spec's own memory_headroom is met."""

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

    @property
    def verdict(self) -> str:
        return self.fit.verdict

    @property
    def exit_code(self) -> ExitCode:
        """0 for fits, 3 for tight, oom or host-oom, 1 for an invalid config (README)."""
        if self.verdict == "invalid":
            return ExitCode.FINDINGS
        if self.verdict in ("tight", "oom", "host-oom"):
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


def _tricks_assumed(spec: Spec, plan: Plan) -> list[DoctorFinding]:
    """A Ulysses config whose spec leaves an ALST trick unpinned: the doctor takes the training code
    not to apply it (no config file says), which at long sequences decides the verdict."""
    if plan.long_context.sequence_parallel_size == 1:
        return []
    unpinned = [name for name in TRICKS if getattr(spec.constraints, name) is None]
    if spec.training.liger_kernel:
        unpinned = [name for name in unpinned if name != "tiled_loss"]  # Liger's fused loss already tiles it
    if not unpinned:
        return []
    names = ", ".join(f"constraints.{name}" for name in unpinned)
    return [
        DoctorFinding(
            "warning",
            "long-context-assumed",
            f"the config runs Ulysses sequence parallelism, but the spec does not say whether the training code "
            f"applies {names}; assumed it does not",
            "pin them (true or false) in the spec to price what the script does",
        )
    ]


def phase_terms(gpu: GpuMemory, phase: StepPhase) -> dict[str, int]:
    """The terms one phase sums, by the names the reports print (``step_gradients`` as ``gradients``)."""
    return {TERM_NAMES.get(name, name): int(getattr(gpu, name)) for name in PHASE_TERMS[phase]}


def _dominant(evaluation: Evaluation) -> Dominant:
    gpu = evaluation.memory.gpu
    phase = gpu.peak_phase
    terms = phase_terms(gpu, phase)
    name = max(terms, key=lambda t: terms[t])
    total = {"forward_backward": gpu.forward_backward, "optimizer_step": gpu.optimizer_step}.get(
        phase, gpu.generation_phase
    )
    return Dominant(phase, name, terms[name], terms[name] / total if total else 0.0)


def _run_validator(config: dict[str, Any], resolved: Resolved, parallel: Parallel, deepspeed_version: str) -> Report:
    """The validator with the parser profile of the spec's release (``training.deepspeed_version``)."""
    profile = profile_of(deepspeed_version)
    world = parallel.batch_world
    world_size = int(world) if float(world).is_integer() and world >= 1 else None
    if resolved.unresolved:
        return validate_config(config, world_size=world_size, target="hf-trainer", deepspeed_version=profile)
    return validate_config(resolved.config, world_size=world_size, deepspeed_version=profile)


@dataclass(frozen=True)
class _Resolution:
    """Step 1: the config with "auto" filled, the parallel layout and DeepSpeed's batch."""

    resolved: Resolved
    assumptions: Mapping[str, Any]
    parallel: Parallel
    batch: Batch
    findings: tuple[DoctorFinding, ...]


@dataclass(frozen=True)
class _Validation:
    """Step 2: the validator's report, and the batch the config is priced at (DeepSpeed's, or the
    first consistent one when DeepSpeed's assertion fails, with the keys that correct it)."""

    report: Report
    priced_batch: Batch
    base_changes: Mapping[str, Any]
    findings: tuple[DoctorFinding, ...]


@dataclass(frozen=True)
class _Pricing:
    """Step 3: the config as a plan, its evaluation, the verdict of that evaluation, and what this
    step found (checkpointing assumed, the config's notes, the memory findings)."""

    config_plan: ConfigPlan | None
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
    """Everything ``dsgen doctor`` reports about ``config`` on ``spec``'s cluster."""
    _check_inputs(config, world_size)
    world = world_size or spec.hardware.world_size
    start: tuple[DoctorFinding, ...] = ()
    if world != spec.hardware.world_size:
        start = (DoctorFinding("info", "world-size", f"priced on {world} GPUs (--world-size)"),)
    spec = _spec_at(spec, world)
    stated_length = spec.training.sequence_length
    spec, length_note = run_sequence_length(spec, trainer_args)
    if length_note is not None:
        severity = "warning" if spec.training.sequence_length != stated_length else "info"
        start = (*start, DoctorFinding(severity, "sequence-length", length_note))
    if trainer_args is not None and not spec.output.logits_released:
        # Trainer arguments mean the HF Trainer runs the loop: its loss backward is priced as such
        spec = replace(spec, output=replace(spec.output, target="hf-trainer"))
    oom_message = parse_oom(error_text) if error_text is not None else None
    resolution = _resolve(config, spec, world, trainer_args)
    validation = _validate(config, spec, resolution)
    reading = run_optimizer(resolution.resolved.config, trainer_args, spec.training.optimizer)
    run_spec = with_run_optimizer(spec, resolution.resolved.config, trainer_args)
    pricing = _price(run_spec, trainer_args, resolution, validation)
    # the solver searches with the spec's optimizer (a fix may add offload, which hands the step to
    # DeepSpeed's CPU optimizer); each fixed config is priced with the one it would run
    fixes = _fix(config, spec, trainer_args, resolution, validation, pricing, world, max_fixes)
    optimizer: tuple[DoctorFinding, ...] = ()
    if reading.note is not None:
        optimizer = (DoctorFinding("warning" if reading.contradicts_spec else "info", "optimizer", reading.note),)
    findings = (*start, *resolution.findings, *validation.findings, *optimizer, *pricing.findings)
    return _report(config, run_spec, world, resolution, validation, pricing, fixes, findings, oom_message)


def _check_inputs(config: Any, world_size: int | None) -> None:
    if not isinstance(config, dict):
        raise DsgenError("a DeepSpeed config must be a JSON object")
    if world_size is not None and world_size < 1:
        raise DsgenError(f"--world-size must be a positive integer, got {world_size}")


def _resolve(config: dict[str, Any], spec: Spec, world: int, trainer_args: Mapping[str, Any] | None) -> _Resolution:
    """Fill "auto" as the HF Trainer would (its arguments, or stand-ins from the spec), then
    derive the parallel layout and DeepSpeed's batch triple."""
    assumptions = {} if trainer_args is not None else _assumptions(spec, world)
    resolved = resolve(
        config, trainer_args=trainer_args, assumptions=assumptions, world_size=world, hidden_size=spec.model.hidden_size
    )
    findings: list[DoctorFinding] = []
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
    trainer_sp = trainer_sp_size(trainer_args)
    if trainer_sp is not None and trainer_sp > 1:
        resolved, rewrite = _accelerate_batch_rewrite(resolved, trainer_args, world // trainer_sp)
        findings.extend(rewrite)
    parallel = parallel_of(resolved.config, world, trainer_sp)
    disagreement = sp_disagreement(resolved.config, trainer_sp)
    if disagreement:
        findings.append(
            DoctorFinding(
                "error",
                "sequence-parallel-mismatch",
                disagreement,
                "give the same degree in both: sequence_parallel_size in the DeepSpeed config and "
                "parallelism_config.sp_size in the training arguments",
            )
        )
    if parallel.sequence_parallel > 1:  # DeepSpeed's Ulysses rules, each naming where it raises
        training = spec.training
        why = sp_violation(spec.model, parallel.sequence_parallel, world, training.sequence_length, training.attention)
        if why:
            findings.append(
                DoctorFinding("error", "sequence-parallel", why, "choose a sequence_parallel_size that satisfies it")
            )
    return _Resolution(resolved, assumptions, parallel, derive(resolved.config, parallel), tuple(findings))


def _accelerate_batch_rewrite(
    resolved: Resolved, trainer_args: Mapping[str, Any] | None, data_parallel: int
) -> tuple[Resolved, list[DoctorFinding]]:
    """With the DeepSpeed SP backend Accelerate sets ``train_batch_size`` last, as micro x
    accumulation x its ParallelismConfig's data-parallel size (``Accelerator._prepare_deepspeed``),
    while DeepSpeed asserts it against world / SP ranks: a data-parallel size left at 1 under
    fewer SP ranks than GPUs fails there."""
    config = resolved.config
    micro, accum = config.get("train_micro_batch_size_per_gpu"), config.get("gradient_accumulation_steps", 1)
    if not isinstance(micro, int) or not isinstance(accum, int):
        return resolved, []
    dp = accelerate_data_parallel_size(trainer_args)
    findings = []
    if dp != data_parallel:
        findings.append(
            DoctorFinding(
                "error",
                "sequence-parallel-data-parallel",
                f"Accelerate rewrites train_batch_size to micro {micro} x accumulation {accum} x its "
                f"ParallelismConfig data-parallel size {dp} (dp_replicate_size x dp_shard_size; "
                "Accelerator._prepare_deepspeed), but DeepSpeed asserts it against "
                f"{data_parallel} data-parallel ranks (GPUs / sp_size)",
                f"set parallelism_config.dp_shard_size to {data_parallel} in the training arguments "
                f"(PARALLELISM_CONFIG_DP_SHARD_SIZE={data_parallel})",
            )
        )
    rewritten = with_changes(config, {"train_batch_size": micro * accum * dp})
    return replace(resolved, config=rewritten), findings


def _validate(config: dict[str, Any], spec: Spec, r: _Resolution) -> _Validation:
    """The validator's findings, DeepSpeed's batch assertion quoted, and the batch to price."""
    report = _run_validator(config, r.resolved, r.parallel, spec.training.deepspeed_version)
    batch = r.batch
    findings = [
        DoctorFinding(f.severity, f.rule_id, f.message, f.hint)
        for f in report.findings
        # the batch-assertion finding below quotes DeepSpeed's own message
        if not (f.rule_id == "batch-mismatch" and not batch.ok)
    ]
    base_changes: dict[str, Any] = {}
    priced_batch = batch
    if not batch.ok:
        consistent = ", ".join(" / ".join(f"{k}={v}" for k, v in option.items()) for option in batch.consistent)
        sp = r.parallel.sequence_parallel
        findings.append(
            DoctorFinding(
                "error",
                "batch-assertion",
                f"DeepSpeedConfig raises: {batch.error} (world size {r.parallel.world_size}"
                + (f" / sequence_parallel_size {sp}" if sp > 1 else "")
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
    return _Validation(report, priced_batch, base_changes, tuple(findings))


def _price(spec: Spec, trainer_args: Mapping[str, Any] | None, r: _Resolution, v: _Validation) -> _Pricing:
    """The config as a plan, priced by the solver's own models, and its calibrated verdict
    (``invalid`` when an earlier step found an error, or there is no batch DeepSpeed accepts)."""
    findings: list[DoctorFinding] = []
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
    if v.priced_batch.ok or v.base_changes:
        source = r.resolved.config if not v.base_changes else with_changes(r.resolved.config, v.base_changes)
        config_plan = config_to_plan(source, spec, v.priced_batch, r.parallel, mode, mode_source)
        for note in config_plan.notes:
            pinned = note.startswith("the spec pins")
            findings.append(
                DoctorFinding("warning" if pinned else "info", "spec-pin" if pinned else "config-note", note)
            )
        findings += _tricks_assumed(spec, config_plan.plan)
        evaluation = evaluate(spec, config_plan.plan)
        for code, message, hint in evaluation_notes(trainer_args or {}, evaluation, spec):
            findings.append(DoctorFinding("warning", code, message, hint))
        for severity, code, message, hint in objective_batch_notes(spec, config_plan.plan, trainer_args or {}):
            findings.append(DoctorFinding(severity, code, message, hint))
    refused = any(f.severity == "error" for f in (*r.findings, *v.findings, *findings))
    if evaluation is None or refused:
        fill = evaluation.fit.fill if evaluation is not None else None
        fit = invalid(fill)
    else:
        fit = evaluation.fit
    dominant = _dominant(evaluation) if evaluation is not None else None
    findings += _memory_findings(spec, evaluation, fit, dominant)
    return _Pricing(config_plan, evaluation, fit, dominant, tuple(findings))


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
                f"predicted at {fit.fill:.0%} of {gpu.name} memory, above the safe line "
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
                f"predicted {gib(evaluation.memory.gpu.total)} per GPU of {gib(gpu.memory_bytes)} ({fit.fill:.0%}); "
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


def _fix(
    config: dict[str, Any],
    spec: Spec,
    trainer_args: Mapping[str, Any] | None,
    r: _Resolution,
    v: _Validation,
    p: _Pricing,
    world: int,
    limit: int,
) -> tuple[Fix, ...]:
    """Fixes from the solver's search, for a config that is tight, out of memory or needs its
    batch corrected; nothing for one that fits."""
    if p.config_plan is None or p.evaluation is None or limit <= 0:
        return ()
    needs_fix = p.fit.verdict in ("tight", "oom", "host-oom") or not p.evaluation.feasible
    if not needs_fix and not v.base_changes:
        return ()
    return _fixes(config, p.config_plan.plan, spec, v.base_changes, trainer_args, r.assumptions, world, limit)


def _report(
    config: dict[str, Any],
    spec: Spec,
    world: int,
    r: _Resolution,
    v: _Validation,
    p: _Pricing,
    fixes: tuple[Fix, ...],
    earlier: tuple[DoctorFinding, ...],
    oom_message: OomMessage | None,
) -> Diagnosis:
    """The Diagnosis, with the out-of-memory message read against the prediction."""
    findings = list(earlier)
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
        world_size=world,
        config=config,
        resolved=r.resolved,
        parallel=r.parallel,
        batch=r.batch,
        validation=v.report,
        config_plan=p.config_plan,
        evaluation=p.evaluation,
        dominant=p.dominant,
        findings=tuple(findings),
        fixes=fixes,
        oom=oom,
        method_fixes=method_fixes(spec, p.evaluation.plan)
        if p.evaluation is not None and not p.evaluation.feasible
        else (),
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
    """Fixes from the solver's ranked plans on top of any batch correction; each fixed config is
    read back as the doctor reads any config and must validate cleanly and fit."""
    base = with_changes(config, base_changes)
    trainer = trainer_args is not None or bool(auto_keys(config))

    def read(fixed: dict[str, Any], micro: int, accum: int) -> tuple[Resolved, Parallel, Batch] | None:
        args = (
            trainer_args
            if trainer_args is None
            else {**trainer_args, "per_device_train_batch_size": micro, "gradient_accumulation_steps": accum}
        )
        batch_assumptions = {**assumptions, "per_device_train_batch_size": micro, "gradient_accumulation_steps": accum}
        resolved = resolve(
            fixed,
            trainer_args=args,
            assumptions=batch_assumptions,
            world_size=world,
            hidden_size=spec.model.hidden_size,
        )
        trainer_sp = trainer_sp_size(trainer_args)
        if trainer_sp is not None and trainer_sp > 1:
            resolved, _ = _accelerate_batch_rewrite(resolved, args, world // trainer_sp)
        parallel = parallel_of(resolved.config, world, trainer_sp)
        derived = derive(resolved.config, parallel)
        # DeepSpeed must end up with exactly this split, so the global batch is kept
        same_split = derived.micro_batch_size == micro and derived.gradient_accumulation_steps == accum
        ok = (
            derived.ok
            and same_split
            and not resolved.mismatches
            and _run_validator(fixed, resolved, parallel, spec.training.deepspeed_version).ok
        )
        return (resolved, parallel, derived) if ok else None

    def price_at(headroom: float, fixed: dict[str, Any], target: Plan) -> Evaluation | None:
        reading = read(fixed, target.micro_batch_size, target.gradient_accumulation_steps)
        if reading is None:
            return None
        resolved, parallel, derived = reading
        fixed_plan = config_to_plan(resolved.config, spec, derived, parallel, target.checkpointing, "fix").plan
        return evaluate(_with_headroom(with_run_optimizer(spec, resolved.config, trainer_args), headroom), fixed_plan)

    prefix = tuple(base_changes.items())
    fixes: list[Fix] = []
    # A fix should fit below the calibrated safe line even where the spec asks for less headroom;
    # only when no plan does are the plans the spec's own headroom allows offered (so a config gets
    # a fix whenever dsgen solve finds a plan). The solver searches data parallelism over the ranks
    # ZeRO shards across (sequence, tensor or pipeline ranks are priced as the doctor prices them).
    own = spec.constraints.memory_headroom
    for headroom in sorted({max(own, 1 - SAFE_LINE), own}, reverse=True):
        search = _fix_spec(_with_headroom(_spec_at(spec, plan.data_parallel_size), headroom), plan)
        fixes = find_fixes(base, plan, solve(search).ranked, spec, partial(price_at, headroom), trainer, limit)
        if fixes:
            break
    if prefix:
        fixes = [replace(f, changes=prefix + f.changes, label="consistent batch values + " + f.label) for f in fixes]
        as_is = evaluate(with_run_optimizer(spec, base, trainer_args), plan)
        if as_is.feasible and read(base, plan.micro_batch_size, plan.gradient_accumulation_steps) is not None:
            fixes.insert(0, Fix("consistent batch values", prefix, (), as_is, base))
    return tuple(fixes[:limit])
