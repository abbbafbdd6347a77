"""dsgen's model-state prediction against the tensors real DeepSpeed allocates.

For each case (AdamW, which DeepSpeed builds from the config: ZeRO 0-3 and CPU optimizer offload
at stage 2 and 3, each in bf16 and fp32, plus ZeRO-1 offload in bf16; and two client optimizers
the worker builds and passes to ``deepspeed.initialize``, ``torch.optim.Adafactor`` and
bitsandbytes' ``AdamW8bit``: ZeRO-0 in fp32 and bf16, ZeRO 1-3 in bf16; the 8-bit cases run only
where bitsandbytes is importable, ``pip install --no-deps bitsandbytes``) this builds a dsgen
spec for a Llama model read from a config.json (2 GPUs on one node, every search dimension
pinned: micro-batch 1, gradient accumulation 2, no checkpointing), solves it, renders the
DeepSpeed config and trains the model with that config for one optimizer step on DeepSpeed's CPU
accelerator (2 ranks, gloo, one torchrun launch per model running its cases in turn). Inside every
rank it sums the bytes of the tensors DeepSpeed holds, each storage once, classified by the
DeepSpeed structure that holds them (on the CPU accelerator device and host are the same memory):

* parameters: the weights the model computes with - the flat 16-bit groups of ``FP16_Optimizer``
  and ZeRO-1/2, ZeRO-3's ``ds_tensor`` partitions and its gathered persistent tensors;
* gradients: ``param.grad``, ZeRO-1/2's contiguous partition buffer (``averaged_gradients``),
  ZeRO-3's ``grad_partitions_flat_buffer``, the fp32 gradients of the master copies, and ZeRO-1/2
  offload's device staging buffer (``temp_grad_buffer_for_gpu_offload``);
* optimizer states: the fp32 master copies and the inner optimizer's ``state`` tensors;
* host (CPU offload): master copies, optimizer states and fp32 gradients ("states"), plus the
  16-bit copies DeepSpeed pins for offload ("staging": ZeRO-1/2's ``param_buffer_of_bit16_for_cpu_
  offload_groups``, ``temp_grad_buffer_for_cpu_offload`` and ``accumulated_grads_in_cpu``; ZeRO-3's
  host ``grad_partitions_flat_buffer``);
* reduce-bucket buffers and any other tensor the case created ("other") are shown, not compared.

When: each term is the largest value seen at the probes of the step: on entry to the boundary
reduction (ZeRO-1 ``reduce_gradients``, where every ``param.grad`` is still whole; ZeRO-2/3
``overlapping_partition_gradients_reduce_epilogue``); inside it, when ZeRO-1/2 build the partition
gradient list (``get_flat_partition``: with accumulation, the accumulated and the new buffer are
both alive); after backward at the accumulation boundary;
at the gradient hand-off, where the fp32 gradient has been formed and the 16-bit gradients it came
from are still held (ZeRO-1/2: the second ``free_grad_in_param_list`` call; stage 0 in 16-bit:
``FP16_Optimizer._get_norm_mask_idx``); and right after the inner optimizer's ``step`` returns,
inside DeepSpeed's step (master copies, states and fp32 gradients all exist). That peak is what
docs/memory-model.md's gradient term describes. Once DeepSpeed's ``step()`` has returned the fp32
gradients are gone again (except with offload) and ZeRO-3 has re-partitioned its persistent
tensors, so a single probe after the step would undercount both.

Measured values are the maximum over ranks (ZeRO-1/2 ranks differ by which tensors straddle their
partition) and are compared with the record ``dsgen.estimate.model_states.model_states`` and, for offload,
with dsgen's host term ``dsgen.estimate.memory.offloaded_host_bytes(...) / gpus_per_node``. Target: every
compared term within 2 %. ``ModelStates.offloaded_optimizer`` (everything offload pins on
the host) is shown beside the measured host bytes.

Run: python bench/model_state_accuracy.py [--models tiny-llama,llama-24m] [--cases zero2-bf16,...]
     [--json rows.json] [--workdir DIR]          (about 2.5 minutes on 2 CPU cores)
DeepSpeed JIT-builds its CPU ops (cpu_adam, fused_adam, shm comm) into ~/.cache/torch_extensions
once; when another Python environment shares that cache, each rebuilds them (minutes) - point
TORCH_EXTENSIONS_DIR at a directory of this environment's own to avoid that.
Exit status 1 when a compared term misses the target or a case fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from a checkout: import this dsgen
    sys.path.insert(0, str(REPO))
from tests.ds_oracle import run_torchrun  # noqa: E402  (the test oracle's torchrun launcher and environment)

TARGET = 0.02
RANKS = 2
SEQUENCE_LENGTH = 16
MICRO_BATCH = 1
ACCUMULATION = 2
STEPS = 1
TIMEOUT_S = 900

# A second, bigger Llama (~24M parameters, multi-query attention) whose sizes are odd on purpose: the
# flat ZeRO-1/2 group needs alignment padding and ZeRO-3 pads odd tensors per rank.
LLAMA_24M = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 511,
    "head_dim": 64,
    "intermediate_size": 1377,
    "num_hidden_layers": 6,
    "num_attention_heads": 7,
    "num_key_value_heads": 1,
    "vocab_size": 8001,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
}
# A tiny Qwen3-MoE (issue 17): routed experts held by transformers as one stacked module per layer,
# a dense layer (mlp_only_layers), q/k norms. Under ZeRO-3 its sparse blocks are set as leaf modules,
# as the plan's instructions say (deepspeed.utils.set_z3_leaf_modules).
QWEN3_MOE_TINY = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "head_dim": 16,
    "intermediate_size": 192,
    "moe_intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "mlp_only_layers": [0],
    "vocab_size": 257,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
MODELS: dict[str, dict[str, Any] | Path] = {
    "tiny-llama": REPO / "examples" / "tiny-llama" / "config.json",
    "llama-24m": LLAMA_24M,
    "tiny-qwen3-moe": QWEN3_MOE_TINY,
}


@dataclass(frozen=True)
class Case:
    name: str
    stage: int
    precision: str
    offload: str  # offload_optimizer: none | cpu
    optimizer: str = "adamw"  # adamw (DeepSpeed builds it) or a client optimizer the worker builds


CASES = tuple(
    Case(f"zero{stage}{'-offload' if offload == 'cpu' else ''}-{precision}", stage, precision, offload)
    for stage, offload in ((0, "none"), (1, "none"), (2, "none"), (3, "none"), (1, "cpu"), (2, "cpu"), (3, "cpu"))
    for precision in ("bf16", "fp32")
    if (stage, offload, precision) != (1, "cpu", "fp32")  # ZeRO-1 offload: bf16 only, to keep the run short
) + tuple(
    # Client optimizers (never offloaded): without ZeRO the optimizer sees the model's shapes (fp32)
    # or FP16_UnfusedOptimizer's fp32 copies (bf16); ZeRO-1/2/3 hand it flat partitions.
    Case(f"zero{stage}-{precision}-{optimizer}", stage, precision, "none", optimizer)
    for optimizer in ("adafactor", "adamw-8bit")
    for stage, precision in ((0, "fp32"), (0, "bf16"), (1, "bf16"), (2, "bf16"), (3, "bf16"))
)
# What the worker builds for each client optimizer (bitsandbytes is optional: pip install --no-deps bitsandbytes).
CLIENT_OPTIMIZERS = {"adafactor": ("torch", "optim.Adafactor"), "adamw-8bit": ("bitsandbytes", "optim.AdamW8bit")}
TERMS = ("parameters", "gradients", "optimizer_states")


# ------------------------------------------------------------------------------------------------
# Driver: dsgen spec -> plan -> rendered config -> prediction; torchrun; comparison.
# ------------------------------------------------------------------------------------------------
def spec_text(config_json: Path, case: Case) -> str:
    return f"""\
model: {{hf_config: {json.dumps(str(config_json))}, name: {config_json.parent.name}}}
hardware: {{gpu: h100-80gb, gpus_per_node: {RANKS}, nodes: 1, cpu_memory_gib: 64}}
training:
  sequence_length: {SEQUENCE_LENGTH}
  global_batch_size: {MICRO_BATCH * ACCUMULATION * RANKS}
  precision: {case.precision}
  optimizer: {{type: {case.optimizer}, lr: 1.0e-4, weight_decay: 0.0}}
constraints:
  zero_stage: {case.stage}
  offload_optimizer: {case.offload if case.stage else "none"}
  offload_param: none
  activation_checkpointing: false
  micro_batch_size: {MICRO_BATCH}
  gradient_accumulation_steps: {ACCUMULATION}
"""


def prepare(config_json: Path, case: Case) -> dict[str, Any]:
    """Solve and render the case with dsgen; return the DeepSpeed config and dsgen's prediction."""
    from dsgen.estimate.memory import buffer_bytes, offloaded_host_bytes, step_buffer_bytes
    from dsgen.estimate.model_states import model_states
    from dsgen.estimate.zero12_offload import zero12_pinned_rounding
    from dsgen.intake.loader import load_spec_text
    from dsgen.search.solver import solve
    from dsgen.targets.render import render

    spec = load_spec_text(spec_text(config_json, case), file=f"<{case.name}>", base_dir=config_json.parent)
    result = solve(spec)
    best = result.best
    if best is None:
        raise RuntimeError(f"{case.name}: dsgen found no plan")
    plan = best.plan
    assert (plan.zero_stage, plan.precision, plan.offload_optimizer) == (case.stage, case.precision, case.offload)
    note = ""
    if plan.offload_ratio < 1:
        # The solver may pick ZeRO-3 partial offload; this bench measures plain CPU offload (and with
        # a single optimizer sub-group DeepSpeed offloads everything whatever the ratio).
        note = f"solver chose offload ratio {plan.offload_ratio}; measured with 1.0"
        plan = dataclasses.replace(plan, offload_ratio=1.0)
    optimizer = spec.training.optimizer.type
    record = model_states(spec.model, plan, optimizer)
    release = spec.training.deepspeed_version
    host = offloaded_host_bytes(record, plan, spec.hardware, release) // spec.hardware.gpus_per_node
    # DeepSpeed's CPU accelerator pins nothing (cpu_accelerator.py ``pin_memory`` is a no-op), so the
    # pinned blocks' power-of-two rounding a GPU host pays is not in what this bench can measure
    host -= record.pinned_rounding + zero12_pinned_rounding(record, plan, release)
    return {
        "config": render(spec, plan).config,
        "predicted": {
            "parameters": record.parameters,
            "gradients": record.gradients,
            "optimizer_states": record.optimizer_states,
            "host": host,
            "host_full": record.offloaded_optimizer,
            "gradients_backward": record.backward_gradients,
            "gradients_step": record.step_gradients,
            "buffers_backward": buffer_bytes(spec.model, plan),
            "buffers_step": step_buffer_bytes(spec.model, plan),
        },
        "parameter_count": spec.model.parameter_count(),
        "note": note,
    }


def run_model(model: str, cases: list[Case], workdir: Path, steps: int = STEPS) -> list[dict[str, Any]]:
    """Prepare every case for one model, train them all in one torchrun launch, compare."""
    source = MODELS[model]
    if isinstance(source, Path):
        config_json = source
    else:
        config_json = workdir / model / "config.json"
        config_json.parent.mkdir(parents=True, exist_ok=True)
        config_json.write_text(json.dumps(source, indent=2))
    prepared = {case.name: prepare(config_json, case) for case in cases}
    job = {
        "steps": steps,
        "hf_config": str(config_json),
        "out": str(workdir / f"{model}-results"),
        "cases": [
            {"name": c.name, "config": prepared[c.name]["config"], "optimizer": c.optimizer, "steps": steps}
            for c in cases
        ],
    }
    job_file = workdir / f"{model}-job.json"
    job_file.write_text(json.dumps(job))
    # one torchrun launch runs every case in turn (see ``worker``)
    returncode, log, _, _ = run_torchrun(
        [str(Path(__file__).resolve()), "--worker", str(job_file)], ranks=RANKS, cwd=workdir, timeout=TIMEOUT_S
    )
    (workdir / f"{model}-train.log").write_text(log)
    rows = []
    for case in cases:
        per_rank = []
        for rank in range(RANKS):
            path = Path(job["out"]) / f"{case.name}-rank{rank}.json"
            per_rank.append(json.loads(path.read_text()) if path.exists() else None)
        for r in per_rank:
            if r is not None and "error" not in r and not all(r["probe_calls"].values()):
                # a phase whose probes never ran would read as nothing allocated: not a measurement
                r["error"] = f"probes that ran per phase {r['probe_calls']}: a phase was not observed"
        if any(r is None or "error" in r for r in per_rank):
            errors = [r.get("error") if r else "no result" for r in per_rank]
            print(f"{model}/{case.name} FAILED (torchrun rc={returncode}): {errors[0]}\n{log[-3000:]}")
            rows.append({"model": model, "case": case.name, "error": errors[0]})
            continue
        measured = {key: max(r["measured"][key] for r in per_rank) for key in per_rank[0]["measured"]}
        for phase in ("backward", "step"):
            measured[f"gradients_{phase}"] = max(r["gradients_by_phase"][phase] for r in per_rank)
            measured[f"buffers_{phase}"] = max(r["buffers_by_phase"][phase] for r in per_rank)
        rows.append(
            {
                "model": model,
                "case": case.name,
                "parameter_count": prepared[case.name]["parameter_count"],
                "predicted": prepared[case.name]["predicted"],
                "measured": measured,
                "offload": case.offload != "none",
                "note": prepared[case.name]["note"],
                "seconds": max(r["seconds"] for r in per_rank),
                "timing": per_rank[0]["timing"],
                "z3_leaf_modules": per_rank[0].get("z3_leaf_modules", []),
                "global_steps": per_rank[0].get("global_steps"),
            }
        )
    return rows


def relative_error(predicted: int, measured: int) -> float:
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return (predicted - measured) / measured


def compared_terms(row: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(predicted, measured) of every term the target applies to."""
    m, p = row["measured"], row["predicted"]
    terms = {term: (p[term], m[term]) for term in TERMS}
    if row["offload"]:
        terms["host"] = (p["host"], m["host_states"] + m["host_buffers"])
    return terms


def mib(value: int) -> str:
    return f"{value / 2**20:9.2f}"


def report(rows: list[dict[str, Any]]) -> float:
    """Print the comparison table; return the worst relative error."""
    header = f"{'model':<11} {'case':<19}" + "".join(f" {t:>31}" for t in (*TERMS, "host (offload)"))
    print("predicted / measured MiB per rank (error)")
    print(header)
    worst = 0.0
    worst_at = "every compared term exact"
    for row in rows:
        if "error" in row:
            print(f"{row['model']:<11} {row['case']:<19} FAILED")
            worst, worst_at = float("inf"), f"{row['model']}/{row['case']} (failed)"
            continue
        cells = []
        for term, (pred, meas) in compared_terms(row).items():
            err = relative_error(pred, meas)
            if abs(err) > abs(worst):
                worst, worst_at = err, f"{row['model']}/{row['case']}/{term}"
            cells.append(f" {mib(pred)} /{mib(meas)} ({err:+7.2%})")
        print(f"{row['model']:<11} {row['case']:<19}" + "".join(cells))
    print()
    print("not compared (MiB per rank): reduce-bucket buffers, other live tensors; gradients by phase")
    print("and the buffers at backward's and at the step's probes (dsgen.estimate.memory.buffer_bytes and")
    print("step_buffer_bytes: reduce buckets, ZeRO-3's gathered parameters)")
    print("(ModelStates.backward_gradients and .step_gradients, predicted / measured); for offload, host split into")
    print("states (master, moments, fp32 grads) + 16-bit staging buffers, and the full host prediction")
    print("of ModelStates.offloaded_optimizer:")
    for row in (r for r in rows if "error" not in r):
        m, p = row["measured"], row["predicted"]
        line = f"  {row['model']:<11} {row['case']:<19} buffers {mib(m['buffers'])}  other {mib(m['other'])}"
        for phase in ("backward", "step"):
            pred, meas = p[f"gradients_{phase}"], m[f"gradients_{phase}"]
            line += f"  grads {phase} {mib(pred)} /{mib(meas)} ({relative_error(pred, meas):+.2%})"
        line += (
            f"\n  {'':<31} buffers in backward {mib(p['buffers_backward'])} /{mib(m['buffers_backward'])}"
            f"  in the step (GpuMemory.step_buffers) {mib(p['buffers_step'])} /{mib(m['buffers_step'])}"
        )
        if row["offload"]:
            full = row["predicted"]["host_full"]
            host = m["host_states"] + m["host_buffers"]
            line += (
                f"\n  {'':<31} host states {mib(m['host_states'])} + staging {mib(m['host_buffers'])}"
                f"  offloaded_optimizer {mib(full)} ({relative_error(full, host):+.2%})"
            )
        if row["note"]:
            line += f"  [{row['note']}]"
        print(line)
    print()
    print(f"worst error: {worst:+.3%} ({worst_at}); target {TARGET:.0%}")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument(
        "--cases", default="all", help="comma-separated case names, or all: " + ", ".join(c.name for c in CASES)
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--workdir", type=Path, help="keep configs and torchrun logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker)

    wanted = [c for c in CASES if args.cases == "all" or c.name in args.cases.split(",")]
    unknown = set(args.cases.split(",")) - {c.name for c in CASES} if args.cases != "all" else set()
    if unknown or not wanted:
        parser.error(f"unknown cases: {', '.join(sorted(unknown)) or args.cases}")
    missing = sorted(
        {c.optimizer for c in wanted if c.optimizer in CLIENT_OPTIMIZERS}
        - {name for name, (module, _) in CLIENT_OPTIMIZERS.items() if importlib.util.find_spec(module)}
    )
    if missing:
        print(
            f"NOT RUN: the {', '.join(missing)} cases (bitsandbytes is not importable here; "
            "pip install --no-deps bitsandbytes to measure them)"
        )
        wanted = [c for c in wanted if c.optimizer not in missing]
    start = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dsgen-model-states-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for model in args.models.split(","):
            rows += run_model(model, wanted, workdir.resolve())
    worst = report(rows)
    print(f"wall time {time.monotonic() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if abs(worst) <= TARGET else 1


# ------------------------------------------------------------------------------------------------
# Worker: one process per rank under torchrun.
# ------------------------------------------------------------------------------------------------
CATEGORIES = ("parameters", "gradients", "optimizer_states", "host_states", "host_buffers", "buffers")


def _tensors(value: Any, depth: int = 4) -> list[Any]:
    """Every tensor in a (nested) list/tuple/dict, or the value itself."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if depth == 0 or value is None:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item, depth - 1)]
    return []


def classify(engine: Any, offload: bool) -> list[tuple[str, str, Any]]:
    """(category, structure, tensor) for every tensor DeepSpeed holds as a model state.

    Earlier entries win when two structures share a storage: a parameter or gradient that is a
    view of a flat buffer counts with that buffer, and a gradient parked in a reduce bucket
    (ZeRO-1/2 point ``param.grad`` into the bucket they reduce from) counts as the bucket.
    """
    opt = engine.optimizer
    basic = engine.basic_optimizer
    params = list(engine.module.parameters())

    def attr(*names: str) -> list[tuple[str, Any]]:
        return [(name, t) for name in names for t in _tensors(getattr(opt, name, None))]

    # fp32 master copies: ZeRO-1/2, ZeRO-3, FP16_Optimizer (fused), FP16_UnfusedOptimizer
    masters = attr("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat")
    if not masters and opt is not basic:
        masters = attr("fp32_groups")
    states = [t for per_param in basic.state.values() for t in _tensors(per_param) if t.dim() > 0 or t.numel() > 1]
    on_host = "host_states" if offload else "optimizer_states"
    buckets = getattr(opt, "ipg_buckets", None) or {}
    out: list[tuple[str, str, Any]] = []
    out += [("parameters", name, t) for name, t in attr("bit16_groups_flat", "fp16_groups_flat")]
    out += [("parameters", name, t) for name, t in attr("fp16_partitioned_groups_flat")]
    out += [("parameters", "ds_tensor", p.ds_tensor) for p in params if getattr(p, "ds_tensor", None) is not None]
    # ZeRO-3: a persistent tensor's whole data is a model state; any other gathered tensor is
    # transient working memory (dsgen's "buffers": gathered / prefetched parameters).
    out += [("parameters", "param.data", p.data) for p in params if getattr(p, "ds_persist", True)]
    out += [("buffers", "gathered", p.data) for p in params if not getattr(p, "ds_persist", True)]
    out += [("buffers", "ipg_bucket", t) for b in buckets.values() for t in _tensors(getattr(b, "buffer", None))]
    out += [("gradients", "param.grad", p.grad) for p in params if p.grad is not None]
    out += [("gradients", name, t) for name, t in attr("averaged_gradients", "grads_in_partition", "all_grad_tensors")]
    out += [("gradients", name, t) for name, t in attr("previous_reduced_grads")]
    out += [("gradients", name, t) for name, t in attr("temp_grad_buffer_for_gpu_offload")]
    master_grads = [(f"{name}.grad", t.grad) for name, t in masters if t.grad is not None]
    out += [("host_states" if offload else "gradients", name, g) for name, g in master_grads]
    out += [("host_buffers" if offload else "gradients", name, t) for name, t in attr("grad_partitions_flat_buffer")]
    out += [(on_host, name, t) for name, t in masters]
    out += [(on_host, "optimizer.state", t) for t in states]
    out += [("host_buffers", name, t) for name, t in attr("param_buffer_of_bit16_for_cpu_offload_groups")]
    out += [
        ("host_buffers", name, t) for name, t in attr("temp_grad_buffer_for_cpu_offload", "accumulated_grads_in_cpu")
    ]
    return out


def _storage_key(tensor: Any) -> tuple[int, int] | None:
    if tensor.device.type == "meta":
        return None
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return storage.data_ptr(), storage.nbytes()


def live_storages() -> set[int]:
    """Addresses of the storages of every tensor Python can reach now."""
    import gc

    import torch

    gc.collect()
    found = set()
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            key = _storage_key(obj)
            if key is not None:
                found.add(key[0])
    return found


def snapshot(engine: Any, offload: bool, baseline: set[int] | None) -> dict[str, int]:
    """Bytes per category now (each storage once); with a ``baseline`` (storages alive before the
    case started), also every other live tensor the case created, as ``other``."""
    import gc

    import torch

    seen: dict[int, str] = dict.fromkeys(baseline or (), "before")
    totals = dict.fromkeys((*CATEGORIES, "other"), 0)
    structures: dict[str, int] = {}
    for category, structure, tensor in classify(engine, offload):
        key = _storage_key(tensor)
        if key is None or key[0] in seen:
            continue
        seen[key[0]] = category
        totals[category] += key[1]
        structures[f"{category}:{structure}"] = structures.get(f"{category}:{structure}", 0) + key[1]
    if os.environ.get("DSGEN_BENCH_DEBUG"):
        print("SNAPSHOT", json.dumps(structures), flush=True)
    if baseline is not None:
        gc.collect()
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor):
                key = _storage_key(obj)
                if key is not None and key[0] not in seen:
                    seen[key[0]] = "other"
                    totals["other"] += key[1]
                    if os.environ.get("DSGEN_BENCH_DEBUG") and key[1] > 100_000:
                        print("OTHER", key[1], obj.dtype, tuple(obj.shape), flush=True)
    return totals


def _probe_on_entry(owner: Any, name: str, probe: Any, phase: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        probe(phase)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def run_case(case: dict[str, Any], hf_config: Path, rank: int) -> dict[str, Any]:
    import deepspeed
    import torch
    import transformers

    started = time.monotonic()
    baseline = live_storages()  # earlier cases' leftovers are not this case's "other"
    config = case["config"]
    zero = config.get("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    offload = "offload_optimizer" in zero
    torch.manual_seed(1234)
    model_config = transformers.AutoConfig.from_pretrained(str(hf_config.parent))
    model_config.use_cache = False

    def build() -> Any:
        return transformers.AutoModelForCausalLM.from_config(model_config, dtype=torch.float32).train()

    # Import the modeling module before zero.Init patches torch.Tensor.__new__ (see
    # tests/ds_train_worker._import_model_classes): only Llama's was imported by earlier cases.
    transformers.AutoModelForCausalLM._model_mapping[type(model_config)]

    if stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = build()
        # transformers fills the parameters a module creates with torch.empty (Qwen3-MoE's fused
        # experts) in _init_weights after construction; under zero.Init without its DeepSpeed
        # integration that reaches only the empty stand-ins, and the partitions keep whatever the
        # memory held: now and then not finite, and DeepSpeed then skips the step. Fill them on
        # the gathered parameters, as the integration does (rank 0's values, broadcast).
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            for module in model.modules():
                model._init_weights(module)
    else:
        model = build()
    leaves: list[str] = []
    if stage == 3 and getattr(model_config, "num_experts", 0):
        # What dsgen's plan tells the script to do for an MoE model under ZeRO-3.
        from deepspeed.utils import get_z3_leaf_modules, set_z3_leaf_modules

        from dsgen.catalog.model_shape import MOE_BLOCK_CLASSES

        modeling = sys.modules[type(model).__module__]
        set_z3_leaf_modules(model, [getattr(modeling, MOE_BLOCK_CLASSES[model_config.model_type])])
        leaves = sorted({type(m).__name__ for m in get_z3_leaf_modules(model)})
    steps = int(case.get("steps", STEPS))
    client = None
    if case.get("optimizer", "adamw") in CLIENT_OPTIMIZERS:  # the config has no optimizer block
        module_name, attribute = CLIENT_OPTIMIZERS[case["optimizer"]]
        module: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            module = getattr(module, part)
        client = module(list(model.parameters()), lr=1e-4)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=list(model.parameters()), optimizer=client, config=config
    )
    opt, basic = engine.optimizer, engine.basic_optimizer
    peak = dict.fromkeys((*CATEGORIES, "other"), 0)
    phase_gradients = {"backward": 0, "step": 0}  # end of backward (activations may live) / step
    phase_buffers = {"backward": 0, "step": 0}
    timing = {"init": time.monotonic() - started, "probes": 0.0}
    probe_calls = {"backward": 0, "step": 0}

    def probe(phase: str, sweep: bool = False) -> None:
        t0 = time.monotonic()
        probe_calls[phase] += 1
        for key, value in snapshot(engine, offload, baseline if sweep else None).items():
            peak[key] = max(peak[key], value)
            if key == "gradients":
                phase_gradients[phase] = max(phase_gradients[phase], value)
            if key == "buffers":
                phase_buffers[phase] = max(phase_buffers[phase], value)
        timing["probes"] += time.monotonic() - t0

    # Right after the inner optimizer's step returns (still inside DeepSpeed's step): the master
    # weights, the (lazily created) optimizer states and the fp32 gradients all exist.
    inner_step = basic.step

    def step_probe(*args: Any, **kwargs: Any) -> Any:
        result = inner_step(*args, **kwargs)
        probe("step", sweep=True)
        return result

    basic.step = step_probe
    # ZeRO-1/2: the second free_grad_in_param_list call of a group comes right after the fp32
    # gradient partition is formed, while the 16-bit partition buffer is still held.
    if hasattr(opt, "free_grad_in_param_list") and not offload:
        free_grads = opt.free_grad_in_param_list

        def free_probe(*args: Any, **kwargs: Any) -> Any:
            if any(getattr(t, "grad", None) is not None for t in opt.single_partition_of_fp32_groups):
                probe("step")
            return free_grads(*args, **kwargs)

        opt.free_grad_in_param_list = free_probe
    # ZeRO-1 reduces at the accumulation boundary, after backward: on entry every param.grad is
    # still whole. ZeRO-2/3's epilogue entry: the last bucket's gradients are not reduced yet.
    # ZeRO-1/2 get_flat_partition, inside the boundary epilogue: with gradient accumulation the
    # gradients accumulated so far and the new contiguous buffer are both alive.
    for name in ("reduce_gradients", "overlapping_partition_gradients_reduce_epilogue", "get_flat_partition"):
        if hasattr(opt, name):
            _probe_on_entry(opt, name, probe, "backward")
    # FP16_Optimizer (stage 0, 16-bit): on its first step, _get_norm_mask_idx runs after the flat
    # fp32 gradient is assigned and before the 16-bit gradients are dropped.
    if hasattr(opt, "_get_norm_mask_idx"):
        _probe_on_entry(opt, "_get_norm_mask_idx", probe, "step")

    vocab = model_config.vocab_size
    gen = torch.Generator().manual_seed(1000 + rank)
    accumulation = engine.gradient_accumulation_steps()
    for step in range(1, steps + 1):
        for micro in range(accumulation):
            ids = torch.randint(0, vocab, (engine.train_micro_batch_size_per_gpu(), SEQUENCE_LENGTH), generator=gen)
            t0 = time.monotonic()
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            timing["fwd_bwd"] = timing.get("fwd_bwd", 0.0) + time.monotonic() - t0
            if step == steps and micro == accumulation - 1:
                probe("backward")  # after backward at the accumulation boundary
            t0 = time.monotonic()
            engine.step()
            timing["step"] = timing.get("step", 0.0) + time.monotonic() - t0
    if engine.global_steps != steps:
        raise RuntimeError(f"engine took {engine.global_steps} optimizer steps, expected {steps}")
    if engine.skipped_steps:
        # stage3.py ``step``: a gradient norm that is not finite skips the step before the inner
        # optimizer runs, so the step's probes saw nothing (see the initialisation above).
        raise RuntimeError(
            f"DeepSpeed skipped {engine.skipped_steps} of {engine.global_steps} steps (gradient norm not finite)"
        )
    timing["total"] = time.monotonic() - started
    result = {
        "measured": peak,
        "gradients_by_phase": phase_gradients,
        "probe_calls": probe_calls,
        "buffers_by_phase": phase_buffers,
        "timing": timing,
        "optimizer": type(basic).__name__,
        "wrapper": type(opt).__name__,
        "z3_leaf_modules": leaves,
        "global_steps": engine.global_steps,
    }
    destroy = getattr(engine, "destroy", None)
    if callable(destroy):
        destroy()
    return result


def worker(job_file: Path) -> int:
    import gc
    import traceback

    import deepspeed
    from deepspeed import comm as dist

    job = json.loads(job_file.read_text())
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    for case in job["cases"]:
        start = time.monotonic()
        try:
            result = run_case(case, Path(job["hf_config"]), rank)
        except Exception:
            result = {"error": traceback.format_exc()}
        result["seconds"] = time.monotonic() - start
        (out / f"{case['name']}-rank{rank}.json").write_text(json.dumps(result))
        gc.collect()
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the slow interpreter/process-group teardown; results are on disk


if __name__ == "__main__":
    sys.exit(main())
