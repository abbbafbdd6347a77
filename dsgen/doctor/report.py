"""Present a :class:`Diagnosis`: the ``dsgen doctor --json`` contract and the human summary."""

from __future__ import annotations

import json
from typing import Any

from dsgen.doctor.diagnose import Diagnosis
from dsgen.doctor.fixes import current_value
from dsgen.doctor.nearest import NearMiss
from dsgen.estimate.memory import HELD_BESIDE_TERMS
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND
from dsgen.plan import plan_dict
from dsgen.reporting.method_summary import method_line
from dsgen.reporting.report import GPU_TERMS, PHASE_LABELS, host_lines, memory_dict
from dsgen.units import gib


def diagnosis_dict(d: Diagnosis) -> dict[str, Any]:
    """The JSON contract: verdict, memory (as ``solve --json``), step_time_s, findings, fixes."""
    e = d.evaluation
    body: dict[str, Any] = {
        **d.fit.as_dict(),  # verdict, fill, band, safe_line, evidence (dsgen.search.verdict)
        "headroom_met": d.headroom_met,
        "memory": memory_dict(e) if e is not None else None,
        "step_time_s": round(e.step.total_s, 6) if e is not None else None,
        "dominant": (
            {
                "phase": d.dominant.phase,
                "term": d.dominant.term,
                "bytes": d.dominant.bytes,
                "share": round(d.dominant.share, 4),
            }
            if d.dominant is not None
            else None
        ),
        "plan": plan_dict(e.plan) if e is not None else None,
        "world_size": d.world_size,
        "deepspeed_version": d.spec.training.deepspeed_version,  # the release priced, checked with its profile
        "parallel": {
            "data_parallel": d.parallel.data_parallel,
            "sequence_parallel": d.parallel.sequence_parallel,
            "tensor_parallel": d.parallel.tensor_parallel,
            "pipeline_parallel": d.parallel.pipeline_parallel,
        },
        "batch": {
            "train_batch_size": d.batch.train_batch_size,
            "train_micro_batch_size_per_gpu": d.batch.micro_batch_size,
            "gradient_accumulation_steps": d.batch.gradient_accumulation_steps,
            "world_size": d.batch.world,
            "error": d.batch.error,
            "consistent": list(d.batch.consistent),
        },
        "settings": [
            {"key": s.key, "value": s.value, "source": s.source, "note": s.note}
            for s in (d.config_plan.settings if d.config_plan is not None else ())
        ],
        "auto": {
            "filled": [
                {"key": f.key, "value": f.value, "source": f.source, "assumed": f.assumed} for f in d.resolved.fills
            ],
            "assumed_training_args": list(d.resolved.assumed_args),
            "unresolved": list(d.resolved.unresolved),
            "mismatches": list(d.resolved.mismatches),
        },
        "findings": [
            {"severity": f.severity, "code": f.code, "message": f.message, "hint": f.hint} for f in d.findings
        ],
        "fixes": [
            {
                "label": fix.label,
                "changes": dict(fix.changes),
                "script_changes": list(fix.script_changes),
                "memory_gpu_total": fix.evaluation.memory.gpu.total,
                "memory_cpu_total": fix.evaluation.memory.cpu.total,
                "step_time_s": round(fix.evaluation.step.total_s, 6),
                "plan": plan_dict(fix.evaluation.plan),
                "config": fix.config,
            }
            for fix in d.fixes
        ],
        # changes to what the run trains, apart from the config fixes (dsgen.doctor.method_fixes)
        # each priced at its own best plan: the doctor's search solved with that method
        "method_fixes": [
            {
                "label": fix.label,
                "changes": dict(fix.changes),
                "memory_gpu_total": fix.evaluation.memory.gpu.total,
                "memory_cpu_total": fix.evaluation.memory.cpu.total,
                "fill": round(fix.evaluation.fit.fill, 4),
                "step_time_s": round(fix.evaluation.step.total_s, 6),
                "plan": plan_dict(fix.evaluation.plan),
                "config_changes": dict(fix.config_changes),
                "script_changes": list(fix.script_changes),
            }
            for fix in d.method_fixes
        ],
        # when no fix fits: the plans that miss by least, and what each lacks (dsgen.doctor.nearest)
        "nearest_plans": [_near_miss_dict(miss) for miss in d.nearest],
        "more_gpus": _more_gpus_dict(d),
    }
    if d.oom is not None:
        m = d.oom.message
        body["error_message"] = {
            "format": m.format,
            "tried": m.tried,
            "gpu": m.gpu_index,
            "capacity": m.capacity,
            "free": m.free,
            "allocated": m.allocated,
            "reserved_unallocated": m.reserved_unallocated,
            "process_in_use": m.process_in_use,
            "likely_phase": d.oom.match.phase if d.oom.match else None,
            "likely_term": d.oom.match.term if d.oom.match else None,
            "likely_allocation": d.oom.match.what if d.oom.match else None,
            "fragmentation": d.oom.fragmentation,
            "notes": list(d.oom.notes),
        }
    return body


def _near_miss_dict(miss: NearMiss) -> dict[str, Any]:
    """One near miss: its plan, its memory against each limit, and the bytes short of each."""
    e = miss.evaluation
    return {
        "label": e.plan.describe(),
        "plan": plan_dict(e.plan),
        "memory_gpu_total": e.memory.gpu.total,
        "gpu_limit": e.usable_gpu_bytes,
        "fill": round(e.fit.fill, 4),
        "memory_cpu_total": e.memory.cpu.total,
        "host_limit": e.usable_cpu_bytes,
        "step_time_s": round(e.step.total_s, 6),
        "short": {"gpu_bytes": miss.gpu_short, "host_bytes": miss.host_short, "nvme_bytes": miss.nvme_short},
        "kernel_limit": miss.kernel_limit,
    }


def _more_gpus_dict(d: Diagnosis) -> dict[str, Any] | None:
    more = d.more_gpus
    if more is None:
        return None
    e = more.evaluation
    return {
        "nodes": more.nodes,
        "gpus_per_node": more.world_size // more.nodes,
        "world_size": more.world_size,
        "label": e.plan.describe(),
        "plan": plan_dict(e.plan),
        "memory_gpu_total": e.memory.gpu.total,
        "fill": round(e.fit.fill, 4),
        "memory_cpu_total": e.memory.cpu.total,
        "step_time_s": round(e.step.total_s, 6),
    }


VERDICT_TEXT = {
    "fits": "FITS",
    "tight": "TIGHT (below capacity, above the safe line)",
    "oom": "OUT OF GPU MEMORY (predicted)",
    "host-oom": "OUT OF HOST MEMORY / NVMe (predicted)",
    "invalid": "INVALID CONFIG",
}


def human(d: Diagnosis) -> str:
    spec = d.spec
    lines = [
        f"verdict   {VERDICT_TEXT[d.verdict]}"
        + (f": {d.fit.fill:.0%} of GPU memory" if d.evaluation is not None and d.verdict != "host-oom" else "")
        + ("; host RAM not judged (see findings)" if d.evaluation is not None and d.evaluation.host_unjudged else "")
    ]
    if d.fit.evidence:
        lines.append(f"          {d.fit.evidence}")
    lines.append(
        f"model     {spec.model.name} on {spec.hardware.nodes} x {spec.hardware.gpus_per_node} x {spec.hardware.gpu.name}, sequence {spec.training.sequence_length}, {spec.training.attention} attention"
        f", DeepSpeed {spec.training.deepspeed_version}"
    )
    e = d.evaluation
    if e is not None:
        p = e.plan
        lines.extend(filter(None, [method_line(spec, e)]))
        lines.append(f"config    {p.describe()}")
        lines.append(
            f"batch     {p.global_batch_size} = micro {p.micro_batch_size} x accumulation {p.gradient_accumulation_steps} x data-parallel {p.batch_parallel_size}"
        )
        gpu = e.memory.gpu
        lines.append("")
        lines.append(f"GPU memory per rank (capacity {gib(gpu.capacity)}, limit {gib(e.usable_gpu_bytes)}):")
        lines.append(f"  {'term':<17} {'fwd/bwd':>10} {'opt step':>10}")
        fb_values, step_values = (gpu.phase_terms(phase) for phase in ("forward_backward", "optimizer_step"))
        shown = (*GPU_TERMS, *(t for t in HELD_BESIDE_TERMS if fb_values.get(t) or step_values.get(t)))
        for term in shown:
            lines.append(f"  {term:<17} {gib(fb_values.get(term, 0)):>10} {gib(step_values.get(term, 0)):>10}")
        lines.append(f"  {'total':<17} {gib(gpu.forward_backward):>10} {gib(gpu.optimizer_step):>10}")
        if d.dominant is not None:
            lines.append(
                f"  peak {gib(gpu.total)} in {PHASE_LABELS[d.dominant.phase]}; largest term {d.dominant.term} "
                f"({gib(d.dominant.bytes)}, {d.dominant.share:.0%})"
            )
        lines.extend(host_lines(e))
        if e.memory.nvme.total:
            lines.append(f"NVMe per node      {gib(e.memory.nvme.total)} of {gib(e.memory.nvme.capacity)}")
        lines.append(
            f"step time {e.step.total_s:.3f} s (compute {e.step.compute_s:.3f}, exposed comm {e.step.exposed_comm_s:.3f}, offload {e.step.offload_s:.3f})"
        )
    if d.config_plan is not None:
        defaults = [s for s in d.config_plan.settings if s.source == "default" and _relevant(s.key, d)]
        if defaults:
            lines.append("")
            lines.append("DeepSpeed 0.19.8 defaults used for keys the config leaves out:")
            for s in defaults:
                lines.append(f"  {s.key} = {s.value}")
    if d.resolved.fills:
        lines.append("")
        lines.append('"auto" values:')
        for fill in d.resolved.fills:
            lines.append(f"  {fill.key} = {fill.value}  ({fill.source}{', assumed' if fill.assumed else ''})")
    if d.findings:
        lines.append("")
        lines.append("findings:")
        for f in d.findings:
            lines.append(f"  {f.severity:<7} [{f.code}] {f.message}")
            if f.hint:
                lines.append(f"          hint: {f.hint}")
    if d.oom is not None:
        lines.append("")
        lines.append(f"the error message ({d.oom.message.format} format):")
        for note in d.oom.notes:
            lines.append(f"  {note}")
    if d.fixes:
        lines.append("")
        lines.append(
            f"fixes, in the order dsgen solve ranks plans (step times within the model's {STEP_TIME_TIE_BAND:.0%} "
            "error are ties, settled by the solver's tie rule):"
        )
        for index, fix in enumerate(d.fixes, start=1):
            lines.append(
                f"  {index}. {fix.label}: GPU {gib(fix.evaluation.memory.gpu.total)} "
                f"({fix.evaluation.fit.fill:.0%} of GPU memory), host {gib(fix.evaluation.memory.cpu.total)}, "
                f"{fix.evaluation.step.total_s:.3f} s/step"
            )
            lines.extend(_change_lines(d, fix.changes, fix.script_changes))
        lines.append("  (write the first with --fix -o fixed.json)")
    elif d.verdict in ("tight", "oom", "host-oom"):
        lines.append("")
        lines.extend(_nothing_fits_lines(d))
    if d.method_fixes:
        lines.append("")
        lines.append(
            "changing the training instead (not config fixes: each changes what the run learns; "
            "each at its own best plan):"
        )
        for method in d.method_fixes:
            e = method.evaluation
            keys = ", ".join(f"{key}: {value}" for key, value in method.changes)
            lines.append(
                f"  - {method.label} ({keys} in the spec): {e.plan.describe()}; GPU {gib(e.memory.gpu.total)} "
                f"({e.fit.fill:.0%} of GPU memory), host {gib(e.memory.cpu.total)}, {e.step.total_s:.3f} s/step"
            )
            lines.extend(_change_lines(d, method.config_changes, method.script_changes))
    return "\n".join(lines)


def _change_lines(d: Diagnosis, changes: tuple[tuple[str, Any], ...], script: tuple[str, ...]) -> list[str]:
    """Each config key a change sets, as old -> new, then what the training script must change."""
    lines = [
        f"       {key}: {_json_value(current_value(d.config, key))} -> {_json_value(value)}" for key, value in changes
    ]
    return lines + [f"       script: {change}" for change in script]


def _lacks(miss: NearMiss) -> str:
    """What one near miss lacks, in the units the user can add."""
    e = miss.evaluation
    parts = []
    if miss.gpu_short:
        parts.append(
            f"GPU {gib(e.memory.gpu.total)} ({e.fit.fill:.0%} of GPU memory) against the "
            f"{gib(e.usable_gpu_bytes)} limit: {gib(miss.gpu_short)} short"
        )
    else:
        parts.append(f"GPU {gib(e.memory.gpu.total)} ({e.fit.fill:.0%} of GPU memory) fits")
    if miss.host_short:
        parts.append(
            f"host RAM {gib(e.memory.cpu.total)} of {gib(e.usable_cpu_bytes)} usable per node: "
            f"{gib(miss.host_short)} short{e.host_capacity_note}"
        )
    else:
        parts.append(f"host RAM {gib(e.memory.cpu.total)} of {gib(e.usable_cpu_bytes)} usable fits")
    if miss.nvme_short:
        parts.append(f"NVMe {gib(miss.nvme_short)} short")
    if miss.kernel_limit is not None:
        parts.append(miss.kernel_limit)
    return "; ".join(parts)


def _nothing_fits_lines(d: Diagnosis) -> list[str]:
    """No fix fits: the nearest plans and what each lacks, the GPUs that would do, and the other ways on."""
    lines = ["no plan dsgen solve finds for this spec fits"]
    if d.nearest:
        lines[0] += "; the nearest, and what each lacks:"
        for index, miss in enumerate(d.nearest, start=1):
            lines.append(f"  {index}. {miss.evaluation.plan.describe()}: {_lacks(miss)}")
    hardware = d.spec.hardware
    more = d.more_gpus
    if more is not None:
        e = more.evaluation
        lines.append(
            f"  with {more.nodes} nodes like this one ({more.world_size} x {hardware.gpu.name}, "
            f"{hardware.cpu_memory_gib:g} GiB host RAM each) it fits: {e.plan.describe()} at "
            f"{gib(e.memory.gpu.total)} ({e.fit.fill:.0%} of GPU memory), {e.step.total_s:.3f} s/step "
            f"(run the doctor again with hardware.nodes: {more.nodes})"
        )
    if d.verdict == "host-oom" or any(miss.host_short for miss in d.nearest):
        lines.append(
            "  other ways on: add host RAM (hardware.cpu_memory_gib), declare NVMe (hardware.nvme) for "
            "ZeRO-Infinity offload, or shorten the sequence"
        )
    else:
        lines.append(
            "  other ways on: shorten the sequence" + (", or change the training (below)" if d.method_fixes else "")
        )
    return lines


def _json_value(value: Any) -> str:
    """A config value as the JSON file spells it; a key the config leaves out reads "(unset)"."""
    return "(unset)" if value is None else json.dumps(value)


def _relevant(key: str, d: Diagnosis) -> bool:
    """Whether a default matters for this plan (stage-3 knobs at stage 3, offload buffers with offload)."""
    assert d.evaluation is not None
    plan = d.evaluation.plan
    if "stage3_" in key or "hpz" in key or "quantized" in key or "sub_group_size" in key:
        return plan.zero_stage == 3
    if ".offload_param." in key and not key.endswith(".device"):
        return plan.offload_param != "none"
    if ".offload_optimizer." in key and not key.endswith(".device"):
        return plan.offload_optimizer != "none"
    return True
