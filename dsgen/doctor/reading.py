"""The doctor's first stage: read everything the user gave into the run it describes.

A config says less than a run: ``"auto"`` values wait for the HF Trainer, the batch is DeepSpeed's
derivation, the optimizer may be the Trainer's, the sequence length TRL's ``max_length``, the
checkpointing the script's. Every such reading happens here, once, and yields a :class:`RunReading`:
the spec the run trains (:attr:`RunReading.spec`), the :class:`~dsgen.plan.Plan` its config runs,
and what was found or assumed on the way (:attr:`RunReading.findings`). Pricing
(:mod:`dsgen.doctor.diagnose`) is one step after it and reads nothing but the reading.

The readers it calls, each owning one source: :mod:`~dsgen.doctor.auto_values` (``"auto"``),
:mod:`~dsgen.doctor.parallelism` (Accelerate's SP layout), :mod:`~dsgen.doctor.batch` (DeepSpeed's
batch triple), :mod:`~dsgen.doctor.sequence_length` (TRL's lengths),
:mod:`~dsgen.doctor.run_optimizer` (who builds the optimizer) and
:mod:`~dsgen.doctor.config_to_plan` (every ZeRO knob). The method and objective files (PEFT, TRL,
LLaMA-Factory) are read before this, into the spec (:mod:`dsgen.doctor.method_files`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dsgen.doctor.auto_values import Resolved, auto_keys, resolve
from dsgen.doctor.batch import Batch, Parallel, derive, parallel_of
from dsgen.doctor.config_to_plan import ConfigPlan, config_to_plan
from dsgen.doctor.findings import DoctorFinding
from dsgen.doctor.keys import with_changes
from dsgen.doctor.model_parallel_findings import model_parallel_violations
from dsgen.doctor.parallelism import accelerate_data_parallel_size, sp_disagreement, trainer_sp_size
from dsgen.doctor.run_optimizer import run_optimizer, with_run_optimizer
from dsgen.doctor.sequence_length import run_sequence_length
from dsgen.errors import DsgenError
from dsgen.estimate.sequence_parallel import sp_violation
from dsgen.facts.model_parallel import tp_batch
from dsgen.facts.release import profile_of
from dsgen.plan import Plan
from dsgen.search.long_context import TRICKS
from dsgen.search.solver import resolve_precision
from dsgen.spec.types import Spec
from dsgen.validate import Report, TrainingMethod, validate_config
from dsgen.vocabulary import Checkpointing

#: Validator rules the doctor states itself, from more than the config says: GRPO's generation batch
#: (with the Trainer's steps_per_generation) and AutoTP's batch world (DeepSpeed's own assertion,
#: quoted as batch-assertion, and the tp-batch-overcount note).
DOCTOR_OWN_RULES = frozenset({"grpo-generation-batch", "autotp-batch-world"})


@dataclass(frozen=True)
class ConfigReading:
    """A config read at one set of Trainer arguments: "auto" filled, the parallel layout,
    DeepSpeed's batch triple, and what reading it found."""

    resolved: Resolved
    parallel: Parallel
    batch: Batch
    findings: tuple[DoctorFinding, ...] = ()


@dataclass(frozen=True)
class RunReading:
    """The run a config, a spec and the Trainer's arguments describe, ready to price.

    ``search_spec`` is the spec the solver searches for fixes (the spec's own optimizer: a fix may
    add offload, which hands the step to DeepSpeed's CPU optimizer); ``spec`` is the one this
    config is priced with (the optimizer the config and arguments build). ``priced_batch`` is
    DeepSpeed's batch, or, when DeepSpeed's assertion fails, the first consistent one, reached by
    ``base_changes``. ``config_plan`` is None when no batch DeepSpeed accepts exists."""

    config: dict[str, Any]
    spec: Spec
    search_spec: Spec
    world_size: int
    trainer_args: Mapping[str, Any] | None
    assumptions: Mapping[str, Any]
    config_reading: ConfigReading
    validation: Report
    priced_batch: Batch
    base_changes: Mapping[str, Any]
    config_plan: ConfigPlan | None
    findings: tuple[DoctorFinding, ...]

    @property
    def resolved(self) -> Resolved:
        return self.config_reading.resolved

    @property
    def parallel(self) -> Parallel:
        return self.config_reading.parallel

    @property
    def batch(self) -> Batch:
        return self.config_reading.batch

    @property
    def plan(self) -> Plan | None:
        return None if self.config_plan is None else self.config_plan.plan

    @property
    def refused(self) -> bool:
        """Whether reading found something DeepSpeed or the Trainer refuses."""
        return any(f.severity == "error" for f in self.findings)


def read_run(
    config: dict[str, Any],
    spec: Spec,
    *,
    world_size: int | None = None,
    trainer_args: Mapping[str, Any] | None = None,
) -> RunReading:
    """Everything the doctor needs to know about ``config`` on ``spec``'s cluster, read once."""
    _check_inputs(config, world_size)
    world = world_size or spec.hardware.world_size
    findings: list[DoctorFinding] = []
    if world != spec.hardware.world_size:
        findings.append(DoctorFinding("info", "world-size", f"priced on {world} GPUs (--world-size)"))
    spec = spec_at(spec, world)
    stated_length = spec.training.sequence_length
    spec, length_note = run_sequence_length(spec, trainer_args)
    if length_note is not None:
        severity = "warning" if spec.training.sequence_length != stated_length else "info"
        findings.append(DoctorFinding(severity, "sequence-length", length_note))
    if trainer_args is not None and not spec.output.logits_released:
        # Trainer arguments mean the HF Trainer runs the loop: its loss backward is priced as such
        spec = replace(spec, output=replace(spec.output, target="hf-trainer"))

    assumptions = {} if trainer_args is not None else trainer_stand_ins(spec, world)
    reading = read_config(config, spec, world, trainer_args, assumptions)
    findings += reading.findings
    report, priced_batch, base_changes, batch_findings = _validate(config, spec, reading)
    findings += batch_findings

    optimizer = run_optimizer(reading.resolved.config, trainer_args, spec.training.optimizer)
    if optimizer.note is not None:
        severity = "warning" if optimizer.contradicts_spec else "info"
        findings.append(DoctorFinding(severity, "optimizer", optimizer.note))
    run_spec = with_run_optimizer(spec, reading.resolved.config, trainer_args)

    mode, mode_source, mode_note = _checkpointing(run_spec, trainer_args)
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
    if priced_batch.ok or base_changes:
        source = reading.resolved.config if not base_changes else with_changes(reading.resolved.config, base_changes)
        config_plan = config_to_plan(source, run_spec, priced_batch, reading.parallel, mode, mode_source)
        for note in config_plan.notes:
            pinned = note.startswith("the spec pins")
            findings.append(
                DoctorFinding("warning" if pinned else "info", "spec-pin" if pinned else "config-note", note)
            )
        findings += _tricks_assumed(run_spec, config_plan.plan)
    return RunReading(
        config=config,
        spec=run_spec,
        search_spec=spec,
        world_size=world,
        trainer_args=trainer_args,
        assumptions=assumptions,
        config_reading=reading,
        validation=report,
        priced_batch=priced_batch,
        base_changes=base_changes,
        config_plan=config_plan,
        findings=tuple(findings),
    )


def _check_inputs(config: Any, world_size: int | None) -> None:
    if not isinstance(config, dict):
        raise DsgenError("a DeepSpeed config must be a JSON object")
    if world_size is not None and world_size < 1:
        raise DsgenError(f"--world-size must be a positive integer, got {world_size}")


def spec_at(spec: Spec, world_size: int) -> Spec:
    """The spec's hardware with the launcher's world size (whole nodes where it divides)."""
    hw = spec.hardware
    if world_size == hw.world_size:
        return spec
    if world_size % hw.gpus_per_node == 0:
        hardware = replace(hw, nodes=world_size // hw.gpus_per_node)
    else:
        hardware = replace(hw, gpus_per_node=world_size, nodes=1)
    return replace(spec, hardware=hardware)


def trainer_stand_ins(spec: Spec, world_size: int) -> dict[str, Any]:
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


def read_config(
    config: dict[str, Any],
    spec: Spec,
    world: int,
    trainer_args: Mapping[str, Any] | None,
    assumptions: Mapping[str, Any],
) -> ConfigReading:
    """Fill "auto" as the HF Trainer would (its arguments, or stand-ins from the spec), then
    derive the parallel layout and DeepSpeed's batch triple. Used for the user's config and for
    every fixed config the doctor offers, so a fix is read as any config is."""
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
    return ConfigReading(resolved, parallel, derive(resolved.config, parallel), tuple(findings))


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


def run_validator(config: dict[str, Any], reading: ConfigReading, spec: Spec) -> Report:
    """The validator with the parser profile of the spec's release (``training.deepspeed_version``)
    and the spec's training method (the fine-tuning rules: ``docs/validation.md``)."""
    profile = profile_of(spec.training.deepspeed_version)
    method = TrainingMethod.from_spec(spec)
    world = reading.parallel.batch_world
    world_size = int(world) if float(world).is_integer() and world >= 1 else None
    if reading.resolved.unresolved:
        return validate_config(
            config, world_size=world_size, target="hf-trainer", deepspeed_version=profile, method=method
        )
    return validate_config(reading.resolved.config, world_size=world_size, deepspeed_version=profile, method=method)


def _validate(
    config: dict[str, Any], spec: Spec, reading: ConfigReading
) -> tuple[Report, Batch, dict[str, Any], list[DoctorFinding]]:
    """The validator's report, DeepSpeed's batch assertion quoted, the batch to price and the
    keys that reach it."""
    report = run_validator(config, reading, spec)
    batch = reading.batch
    findings = [
        DoctorFinding(f.severity, f.rule_id, f.message, f.hint)
        for f in report.findings
        # the batch-assertion finding below quotes DeepSpeed's own message, and the objective's batch
        # notes (objective_batch.py) judge GRPO's generation batch with the Trainer's steps_per_generation
        if not (f.rule_id == "batch-mismatch" and not batch.ok) and f.rule_id not in DOCTOR_OWN_RULES
    ]
    base_changes: dict[str, Any] = {}
    priced_batch = batch
    if not batch.ok:
        consistent = ", ".join(" / ".join(f"{k}={v}" for k, v in option.items()) for option in batch.consistent)
        sp = reading.parallel.sequence_parallel
        findings.append(
            DoctorFinding(
                "error",
                "batch-assertion",
                f"DeepSpeedConfig raises: {batch.error} (world size {reading.parallel.world_size}"
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
    for violation in model_parallel_violations(reading.resolved.config, spec, reading.parallel.world_size):
        findings.append(
            DoctorFinding(
                "error" if violation.raises else "warning",
                violation.rule,
                f"{violation.message} [{violation.source}]",
                f"DeepSpeed >= {violation.since} supports it" if violation.since else None,
            )
        )
    global_batch = priced_batch.train_batch_size
    spec_batch = spec.training.global_batch_size
    tp = reading.parallel.tensor_parallel
    sp = reading.parallel.sequence_parallel
    micro, accumulation = priced_batch.micro_batch_size, priced_batch.gradient_accumulation_steps
    world = reading.parallel.world_size
    if global_batch is not None and micro and accumulation and tp > 1 and world % (tp * sp) == 0:
        consumed = tp_batch(micro, accumulation, world, tp=tp, sp=sp).samples_per_step
        findings.append(_tp_batch_finding(global_batch, tp, consumed, spec_batch))
        global_batch = consumed
    if global_batch is not None and spec_batch is not None and spec_batch != global_batch:
        findings.append(
            DoctorFinding(
                "info",
                "spec-batch",
                f"the spec asks for a global batch of {spec_batch}; the config runs {global_batch}",
            )
        )
    return report, priced_batch, base_changes, findings


def _tp_batch_finding(train_batch_size: int, tp: int, distinct: int, spec_batch: int | None) -> DoctorFinding:
    """AutoTP's batch over-count: DeepSpeed asserts ``train_batch_size`` over every rank
    (``deepspeed.initialize`` builds ``DeepSpeedConfig(config, mpu=None)``, so ``runtime/config.py``
    takes ``dist.get_world_size()``), while the ranks of a TP group must train the same micro-batch
    (``runtime/engine.py`` ``check_dataloader_inputs_same_across_ranks`` asserts it): a step trains
    ``train_batch_size / TP`` distinct samples (``distinct``: :func:`dsgen.facts.model_parallel.tp_batch`;
    docs/model-parallel-measurements.md)."""
    message = (
        f"AutoTP (autotp_size {tp}): the {tp} ranks of each tensor-parallel group train the same micro-batch, "
        f"so train_batch_size {train_batch_size} (which DeepSpeed asserts over every rank) counts each sample "
        f"{tp} times: a step trains {distinct} distinct samples"
    )
    if spec_batch is not None and spec_batch == train_batch_size:
        return DoctorFinding(
            "warning",
            "tp-batch-overcount",
            message + f", not the spec's global batch of {spec_batch}",
            f"multiply gradient_accumulation_steps (or the micro-batch) by {tp} to train {spec_batch} samples a step",
        )
    return DoctorFinding("info", "tp-batch-overcount", message)


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
