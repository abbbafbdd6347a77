"""Present a solve result: the JSON output contract and the human-readable summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsgen.estimate.memory import HELD_BESIDE_TERMS
from dsgen.estimate.optimizers import client_optimizer_call, is_client_optimizer
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND
from dsgen.plan import LongContext, Plan, plan_dict
from dsgen.reporting.method_summary import method_line, method_summary
from dsgen.reporting.text_table import text_table
from dsgen.search.evaluation import Evaluation
from dsgen.search.ranking import decided_by, ties_fastest
from dsgen.search.solver import SolveResult, pinned_constraints
from dsgen.search.verdict import ROOM_LINE
from dsgen.spec.defaults import spec_default
from dsgen.spec.types import Spec
from dsgen.targets.long_context import attention_note, liger_note, long_context_notes
from dsgen.units import GIB, format_count, gib
from dsgen.vocabulary import StepPhase

PHASE_LABELS: dict[StepPhase, str] = {
    "forward_backward": "forward/backward",
    "optimizer_step": "the optimizer step",
    "generation": "generation",
}
# What each --accounting value prices model states with (the text output names the one used).
ACCOUNTING_LABELS = {
    "dsgen": "model states by dsgen's accounting",
    "deepspeed-estimator": "model states by DeepSpeed's own estimator",
}
GPU_TERMS = ("parameters", "gradients", "optimizer_states", "activations", "buffers", "transient", "overhead")
# what fine-tuning and the objectives add (dsgen.estimate.memory.GpuMemory); printed when not zero
METHOD_GPU_TERMS = (*HELD_BESIDE_TERMS, "generation", "generation_gather")


def memory_dict(e: Evaluation) -> dict[str, Any]:
    gpu = e.memory.gpu
    gpu_terms: dict[str, int] = {term: int(getattr(gpu, term)) for term in GPU_TERMS}
    return {
        "gpu": {
            **gpu_terms,
            "total": gpu.total,
            "capacity": gpu.capacity,
            "usable": e.usable_gpu_bytes,
            "peak_phase": gpu.peak_phase,
            "phases": {"forward_backward": gpu.forward_backward, "optimizer_step": gpu.optimizer_step},
            "first_layer_forward": gpu.first_layer_forward,
            "gradients_by_phase": {"forward_backward": gpu.backward_gradients, "optimizer_step": gpu.step_gradients},
            **{term: int(getattr(gpu, term)) for term in METHOD_GPU_TERMS},
            "generation_phase": gpu.generation_phase,
            "phase_terms": {phase: gpu.phase_terms(phase) for phase in gpu.phases},
        },
        "cpu": {
            "total": e.memory.cpu.total,
            "capacity": e.memory.cpu.capacity,
            "usable": e.usable_cpu_bytes,
            "capacity_assumed": e.memory.cpu.capacity_assumed,
            "model_states": e.memory.cpu.offloaded_states,
            "checkpoints": e.memory.cpu.checkpoints,
            "phases": {
                "startup": e.memory.cpu.startup,
                "training": e.memory.cpu.training,
                "checkpoint_save": e.memory.cpu.saving,
            },
            "checkpoint_save": {
                "engine": e.memory.cpu.checkpoint_save.engine,
                "state_dict": e.memory.cpu.checkpoint_save.state_dict,
            },
        },
        "nvme": {"total": e.memory.nvme.total, "capacity": e.memory.nvme.capacity},
    }


def host_lines(e: Evaluation) -> list[str]:
    """The host RAM line and its three phases (start-up, training, checkpoint save), with what
    fills the later two when something is offloaded."""
    cpu = e.memory.cpu
    save = cpu.checkpoint_save
    lines = [f"host RAM per node  {gib(cpu.total)} of the {gib(e.usable_cpu_bytes)} limit{e.host_capacity_note}"]
    copies = "the HF Trainer's 16-bit state dict" if save.state_dict > save.engine else "save_checkpoint's copies"
    lines.append(
        f"  phases: start-up {gib(cpu.startup)}, training {gib(cpu.training)}, "
        f"checkpoint save {gib(cpu.saving)} ({copies} {gib(save.peak)})"
    )
    if cpu.offloaded_states or cpu.checkpoints:
        parts = (
            ("offloaded model states", cpu.offloaded_states),
            ("offloaded checkpoints", cpu.checkpoints),
            ("processes", cpu.process),
        )
        lines.append("  " + ", ".join(f"{name} {gib(value)}" for name, value in parts if value))
    return lines


def _mfu(e: Evaluation, spec: Spec) -> float:
    peak = spec.hardware.gpu.peak_tflops(e.plan.precision) * 1e12 * spec.hardware.world_size
    return e.step.model_flops / (e.step.total_s * peak) if peak else 0.0


def evaluation_dict(e: Evaluation, spec: Spec) -> dict[str, Any]:
    return {
        "feasible": e.feasible,
        "plan": plan_dict(e.plan),
        "memory": memory_dict(e),
        "step_time_s": round(e.step.total_s, 6),
        "step_time": {
            "compute_s": round(e.step.compute_s, 6),
            "exposed_comm_s": round(e.step.exposed_comm_s, 6),
            "offload_s": round(e.step.offload_s, 6),
            "generation_s": round(e.step.generation_s, 6),
        },
        "tokens_per_s": round(e.tokens_per_s, 3),
        "mfu": round(_mfu(e, spec), 4),
        "reason": e.reason() or None,
        **e.fit.as_dict(),  # verdict, fill, band, safe_line, evidence (dsgen.search.verdict)
        "finetuning": method_summary(spec, e).as_dict(),
    }


def result_dict(result: SolveResult) -> dict[str, Any]:
    """The ``dsgen solve --json`` object (the stable output contract: docs/output-contract.md)."""
    spec = result.spec
    shown = result.best if result.best is not None else result.closest
    assert shown is not None
    body = evaluation_dict(shown, spec)
    body = {"verdict": body["verdict"], "summary": body["summary"], **body}  # the verdict leads
    body["feasible"] = result.feasible
    body["alternatives"] = [
        {
            "zero_stage": alt.zero_stage,
            "feasible": bool(alt.evaluation and alt.evaluation.feasible),
            "plan": plan_dict(alt.evaluation.plan) if alt.evaluation else None,
            "memory_gpu_total": alt.evaluation.memory.gpu.total if alt.evaluation else None,
            "step_time_s": round(alt.evaluation.step.total_s, 6) if alt.evaluation else None,
            "reason": alt.reason,
        }
        for alt in result.alternatives
    ]
    body["model"] = {"name": spec.model.name, "family": spec.model.family, "parameters": spec.model.parameter_count()}
    body["hardware"] = {
        "gpu": spec.hardware.gpu.name,
        "gpus_per_node": spec.hardware.gpus_per_node,
        "nodes": spec.hardware.nodes,
        "world_size": spec.hardware.world_size,
    }
    body["candidates_evaluated"] = result.candidates_evaluated
    body["accounting"] = result.accounting
    body["deepspeed_version"] = spec.training.deepspeed_version  # the release priced (training.deepspeed_version)
    body["notes"] = [*spec.notes, *([result.batch_note] if result.batch_note else [])]
    body["model_parallel_alternatives"] = [  # appended: existing keys keep their place
        {
            "layout": label,
            "feasible": evaluation.feasible,
            "plan": plan_dict(evaluation.plan),
            "memory_gpu_total": evaluation.memory.gpu.total,
            "step_time_s": round(evaluation.step.total_s, 6),
            "reason": reason,
        }
        for label, evaluation, reason in result.model_parallel_alternatives
    ]
    body["offload_alternatives"] = [
        {
            "offload": label,
            "feasible": evaluation.feasible,
            "plan": plan_dict(evaluation.plan),
            "memory_gpu_total": evaluation.memory.gpu.total,
            "step_time_s": round(evaluation.step.total_s, 6),
            "reason": reason,
        }
        for label, evaluation, reason in result.offload_alternatives
    ]
    chose = result.feasible and result.ranked and result.best is result.ranked[0]
    body["decided_by"] = decided_by(result.ranked, spec.model) if chose else None
    return body


def _release_note(release: str) -> str:
    """The DeepSpeed release, said beside the hardware when the spec names one other than the default."""
    return "" if release == spec_default("training.deepspeed_version") else f", DeepSpeed {release}"


def ranking_note() -> str:
    """How ``solve --top`` orders plans (dsgen.search.ranking), and where its band comes from."""
    return (
        f"ranked by dsgen's rule (docs/how-dsgen-chooses.md): a plan slower and larger than another never goes "
        f"first; plans within {STEP_TIME_TIE_BAND:.0%} of the fastest remaining (the step-time model's median "
        f"error on published measurements) are ties, and go first to the plan with room to spare (GPU "
        f"memory at or below {ROOM_LINE:.0%}), then fewer moving parts (offload, AutoTP/AutoEP, Ulysses), "
        "then the simpler plan, then the faster"
    )


#: ``--top`` columns shown only when some row differs from the plain value (a searched dimension
#: that varies): header, the plain value, and how a plan reads there.
_VARYING_COLUMNS: tuple[tuple[str, str, Callable[[Plan], str]], ...] = (
    ("TP", "1", lambda p: str(p.tensor_parallel_size)),
    ("EP", "1", lambda p: str(p.expert_parallel_size)),
    ("SP", "1", lambda p: str(p.long_context.sequence_parallel_size)),
    ("ALST", "-", lambda p: _tricks(p.long_context)),
    ("zero++", "none", lambda p: p.knobs.zeropp),
)


def _tricks(lc: LongContext) -> str:
    names = (("mlp", lc.tiled_mlp), ("loss", lc.tiled_loss), ("ckpt-offload", lc.checkpoint_offload))
    return "+".join(name for name, on in names if on) or "-"


def ranked_table(result: SolveResult, top: int) -> str:
    """The ``--top N`` table: the plans in the order the rule ranks them, every searched dimension
    that varies among them, the batch split (micro x accumulation x data-parallel ranks = the
    global batch, for the row's own layout), memory as a share of GPU memory, speed, MFU, the step
    time against the first plan's, and ``tie`` (yes/-): whether a plan is within the model's error
    band of the fastest plan (so the step-time model cannot tell the two apart)."""
    spec = result.spec
    shown = result.ranked[:top]
    first = shown[0].step.total_s if shown else 0.0
    fastest = min((e.step.total_s for e in result.ranked), default=0.0)
    varying = [(name, get) for name, plain, get in _VARYING_COLUMNS if any(get(e.plan) != plain for e in shown)]
    header = ["#", "stage", "offload", "ckpt", *(name for name, _ in varying), "micro", "accum", "DP", "batch"]
    header += ["GPU GiB", "GPU %", "host GiB", "step s", "tokens/s", "MFU", "vs #1", "tie"]
    rows = [
        (
            str(index),
            str(e.plan.zero_stage),
            e.plan.offload_label(),
            e.plan.checkpointing,
            *(get(e.plan) for _, get in varying),
            str(e.plan.micro_batch_size),
            str(e.plan.gradient_accumulation_steps),
            str(e.plan.batch_parallel_size),
            str(e.plan.global_batch_size),
            f"{e.memory.gpu.total / GIB:.1f}",
            f"{e.fit.fill:.0%}",
            f"{e.memory.cpu.total / GIB:.1f}",
            f"{e.step.total_s:.3f}",
            f"{e.tokens_per_s:,.0f}",
            f"{_mfu(e, spec):.1%}",
            f"{e.step.total_s / first:.2f}x",
            "yes" if ties_fastest(e.step.total_s, fastest) else "-",
        )
        for index, e in enumerate(shown, start=1)
    ]
    text_columns = {2, 3} | {4 + i for i, (name, _) in enumerate(varying) if name in ("ALST", "zero++")}
    right = set(range(len(header))) - text_columns
    table = ranking_note() + "\n\n" + text_table(header, rows, right=right)
    if not rows:
        return table + "\n    (no feasible plan)"
    return table + f"\n\n#1: {decided_by(result.ranked, spec.model)}"


def explanation(result: SolveResult) -> str:
    """``dsgen explain``: the chosen plan's memory and time, and why each road not taken was not."""
    e = result.best if result.best is not None else result.closest
    assert e is not None
    lines = [human_summary(result), ""]
    total = e.step.total_s
    lines.append("step time split:")
    for name, value in step_terms(e):
        share = value / total if total else 0.0
        lines.append(f"  {name:<36} {value:>9.3f} s  {_bar(round(share * 1000), 1000)} {share:>4.0%}")
    if result.ranked and result.best is result.ranked[0]:
        lines.append("")
        lines.append(f"why this plan: {decided_by(result.ranked, result.spec.model)}")
    lines.append("")
    lines.append("ZeRO stages not chosen:")
    for alt in result.alternatives:
        lines.append(f"  ZeRO-{alt.zero_stage}: {alt.reason}")
    lines.append("offload choices not chosen:")
    for label, _evaluation, reason in result.offload_alternatives:
        lines.append(f"  {label}: {reason}")
    if result.model_parallel_alternatives:
        lines.append("model parallelism (AutoTP / AutoEP) not chosen:")
        for label, evaluation, reason in result.model_parallel_alternatives:
            memory = f"{evaluation.memory.gpu.total / GIB:.1f} GiB per GPU"
            lines.append(f"  {label}: {reason}; {memory}")
    lines.append(f"({result.candidates_evaluated} candidate plans evaluated)")
    return "\n".join(lines)


def script_requirements(spec: Spec, plan: Plan) -> str:
    """What the training script must do that a DeepSpeed JSON cannot express."""
    needs = []
    if plan.checkpointing == "full":
        needs.append(
            "enable gradient checkpointing in the model (model.gradient_checkpointing_enable(), or --gradient_checkpointing with the HF Trainer)"
        )
    elif plan.checkpointing == "selective":
        needs.append(
            "recompute only the attention in backward (selective recomputation): run the model's attention "
            "function under torch.utils.checkpoint(..., use_reentrant=False), e.g. register a wrapped function "
            "with transformers' AttentionInterface and load the model with that attn_implementation"
        )
    attention = attention_note(spec)
    if attention:
        needs.append(attention)
    optimizer = spec.training.optimizer
    if is_client_optimizer(optimizer):
        needs.append(
            f"build the optimizer and pass it to deepspeed.initialize(optimizer="
            f"{client_optimizer_call(optimizer, 'model.parameters()')}) (the config has no optimizer block)"
        )
    if spec.training.liger_kernel:
        needs.append(liger_note(spec, plan, "deepspeed"))
    if plan.zero_stage == 3:
        needs.append(
            "build the model under deepspeed.zero.Init (the HF Trainer does this for ZeRO-3 configs) so no rank holds the full model"
        )
    if plan.zero_stage == 3 and spec.model.is_moe:  # issue 17: the memory model gathers the whole block at once
        from dsgen.catalog.model_shape import MOE_BLOCK_CLASSES

        block = MOE_BLOCK_CLASSES.get(spec.model.family, "<the model's sparse MoE block class>")
        needs.append(
            f"make each MoE block a ZeRO-3 leaf module before deepspeed.initialize: "
            f"deepspeed.utils.set_z3_leaf_modules(model, [{block}])"
        )
    needs.extend(long_context_notes(spec, plan, "deepspeed"))  # Ulysses SP and the ALST tricks
    from dsgen.targets.model_parallel import model_parallel_notes

    needs.extend(model_parallel_notes(spec, plan, "deepspeed"))  # AutoTP's shared batches, AutoEP's optimizer
    if not needs:
        return "Your training script needs nothing beyond passing this config to deepspeed.initialize."
    return "Your training script must: " + "; ".join(needs) + "."


def step_terms(e: Evaluation) -> list[tuple[str, float]]:
    """The step's terms in the order every output shows them; they add up to the step time
    (generation only where the objective generates)."""
    terms = [
        ("compute", e.step.compute_s),
        ("exposed communication", e.step.exposed_comm_s),
        ("offload (PCIe, CPU optimizer, NVMe)", e.step.offload_s),
    ]
    return [*terms, ("generation", e.step.generation_s)] if e.step.generation_s else terms


def _bar(value: int, capacity: int, width: int = 24) -> str:
    filled = round(width * min(value / capacity, 1.0)) if capacity else 0
    return "#" * filled + "." * (width - filled)


def human_summary(result: SolveResult) -> str:
    """The plan, a per-term memory table against capacity, and the step-time split."""
    spec = result.spec
    e = result.best if result.best is not None else result.closest
    assert e is not None
    p = e.plan
    lines = [f"verdict   {e.fit.summary}"]
    if e.fit.evidence:
        lines.append(f"          {e.fit.evidence}")
    for note in (*spec.notes, *([result.batch_note] if result.batch_note else [])):
        lines.append(f"note      {note}")
    lines += [
        f"model     {spec.model.name} ({format_count(spec.model.parameter_count())} parameters)"
        + (", Liger-Kernel" if spec.training.liger_kernel else ""),
        f"hardware  {spec.hardware.nodes} x {spec.hardware.gpus_per_node} x {spec.hardware.gpu.name}"
        + _release_note(spec.training.deepspeed_version),
        *filter(None, [method_line(spec, e)]),
        f"plan      {p.describe()}",
        f"batch     {p.global_batch_size} = micro {p.micro_batch_size} x accumulation "
        f"{p.gradient_accumulation_steps} x data-parallel {p.batch_parallel_size}",
        "",
        f"GPU memory per rank (capacity {gib(e.memory.gpu.capacity)}, the plan's limit {gib(e.usable_gpu_bytes)}; "
        f"{ACCOUNTING_LABELS[result.accounting]}):",
    ]
    shown_terms = (*GPU_TERMS, *(t for t in METHOD_GPU_TERMS if getattr(e.memory.gpu, t)))
    for term in shown_terms:
        value = getattr(e.memory.gpu, term)
        lines.append(f"  {term:<17} {gib(value):>11}  {_bar(value, e.memory.gpu.capacity)}")
    total = e.memory.gpu.total
    lines.append(
        f"  {'total (peak)':<17} {gib(total):>11}  {_bar(total, e.memory.gpu.capacity)}  "
        f"{e.fit.fill:.0%} of GPU memory, peak in {PHASE_LABELS[e.memory.gpu.peak_phase]}"
    )
    generation = f", generation {gib(e.memory.gpu.generation_phase)}" if e.memory.gpu.generates else ""
    lines.append(
        f"  phases: forward/backward {gib(e.memory.gpu.forward_backward)}, "
        f"optimizer step {gib(e.memory.gpu.optimizer_step)}{generation}"
    )
    lines.extend(host_lines(e))
    if e.memory.nvme.total:
        lines.append(f"NVMe per node      {gib(e.memory.nvme.total)} of {gib(e.memory.nvme.capacity)}")
    lines.append(
        f"step time {e.step.total_s:.3f} s (compute {e.step.compute_s:.3f}, exposed comm "
        f"{e.step.exposed_comm_s:.3f}, offload {e.step.offload_s:.3f}"
        + (f", generation {e.step.generation_s:.3f}" if e.step.generation_s else "")
        + f"); {e.tokens_per_s:,.0f} tokens/s"
    )
    if not e.feasible:
        pinned = pinned_constraints(spec)
        lines.append(f"DOES NOT FIT{f' with the pinned constraints ({pinned})' if pinned else ''}: {e.reason()}")
    return "\n".join(lines)
