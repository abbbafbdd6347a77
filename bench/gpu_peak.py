r"""Measure real peak memory and step time of rendered plans on one GPU, beside dsgen's prediction.

For each case (a Hugging Face ``config.json`` + a fully pinned plan) this solves the pinned dsgen
spec, renders the plan's DeepSpeed config with dsgen itself (dsgen.api.render_plan), builds the
model from its config with random weights (``AutoModelForCausalLM.from_config``: nothing is
downloaded; inside ``deepspeed.zero.Init`` for ZeRO-3, as the HF Trainer does), and trains a few
optimizer steps under ``deepspeed.initialize`` in one process. It records the accelerator's
``max_memory_allocated`` and ``max_memory_reserved`` (``torch.cuda.*`` on a GPU, through
DeepSpeed's accelerator API, so the CPU path is the same code) and the median step time, beside
dsgen's predicted GPU total (and the total without its ``overhead`` term, which the allocator's
counters do not see) and step time, and writes them to ``bench/data/gpu_peak.json`` (:data:`GPU_OUT`).

A GPU machine with PyTorch (CUDA), transformers, numpy, jinja2, PyYAML, setuptools and DeepSpeed's
light requirements (einops, msgpack, ninja, psutil, py-cpuinfo, tqdm) but no internet and no DeepSpeed:
fetch what it lacks where there is an index, for its Python (3.12 here) - DeepSpeed is published as
a source archive only, so it travels as one, and it is installed without build isolation (its
setup.py imports the machine's torch; no op is compiled ahead, the plans below need no custom
kernel: the optimizer is torch's AdamW, built by this script):

    pip download --no-deps --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d wheels/ deepspeed==0.19.8 hjson==3.1.0 pydantic==2.14.4 \
        pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 jsonschema-rs==0.61.2
    # there, in the checkout:
    pip install --no-index --no-deps --no-build-isolation --target /tmp/site wheels/*
    PYTHONPATH=/tmp/site python bench/gpu_peak.py

(11 MB; the install takes seconds. Checked on CPU in a fresh environment holding only the packages
named above, with ``--cpu-smoke``.) Budget: the default cases take a few minutes on one H200
(``--max-seconds`` stops starting new cases after 7 minutes).

Run:  python bench/gpu_peak.py                       # the GPU cases, on cuda
      DS_ACCELERATOR=cpu python bench/gpu_peak.py --cpu-smoke   # examples/tiny-llama on CPU (the test);
                                                                # its rows are printed, written only with --out
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

GIB = 1 << 30
GPU_OUT = REPO / "bench" / "data" / "gpu_peak.json"  # the measured figures docs/prediction-accuracy.md cites


@dataclass(frozen=True)
class Case:
    """One measurement: a model config and the plan's pins (constraints of a dsgen spec)."""

    name: str
    hf_config: str  # a config.json path, relative to the repository
    sequence_length: int
    micro_batch: int
    zero_stage: int
    checkpointing: bool


#: Qwen2.5-0.5B's published config (bench/data/hf_configs), sized for one 141 GB H200 and a few minutes.
GPU_CASES = (
    Case("qwen2.5-0.5b-z0-s2048-mb4", "bench/data/hf_configs/qwen2.5-0.5b.json", 2048, 4, 0, False),
    Case("qwen2.5-0.5b-z1-s4096-mb4", "bench/data/hf_configs/qwen2.5-0.5b.json", 4096, 4, 1, False),
    Case("qwen2.5-0.5b-z2-s4096-mb8-ckpt", "bench/data/hf_configs/qwen2.5-0.5b.json", 4096, 8, 2, True),
    Case("qwen2.5-0.5b-z3-s8192-mb2", "bench/data/hf_configs/qwen2.5-0.5b.json", 8192, 2, 3, False),
)
CPU_CASES = (Case("tiny-llama-z2-s128-mb2", "examples/tiny-llama/config.json", 128, 2, 2, False),)


def spec_text(case: Case, gpu: str) -> str:
    """The fully pinned dsgen spec of one case on one GPU (headroom 0: the bare prediction)."""
    return (
        f"model: {{hf_config: {REPO / case.hf_config}}}\n"
        f"hardware: {{gpu: {gpu}, gpus_per_node: 1, nodes: 1, cpu_memory_gib: 64}}\n"
        f"training: {{sequence_length: {case.sequence_length}, global_batch_size: {case.micro_batch}, "
        "precision: bf16, attention: sdpa, optimizer: {type: adamw, lr: 1.0e-4, implementation: torch}}\n"
        f"constraints: {{zero_stage: {case.zero_stage}, offload_optimizer: none, offload_param: none, "
        f"activation_checkpointing: {str(case.checkpointing).lower()}, micro_batch_size: {case.micro_batch}, "
        "gradient_accumulation_steps: 1, memory_headroom: 0}\n"
    )


def measure(case: Case, gpu: str, steps: int) -> dict[str, Any]:
    """Train ``steps`` optimizer steps of ``case`` and return measured beside predicted."""
    import deepspeed  # type: ignore[import-untyped]
    import torch
    from deepspeed.accelerator import get_accelerator  # type: ignore[import-untyped]
    from transformers import AutoConfig, AutoModelForCausalLM

    from dsgen.api import render_plan, solve_spec
    from dsgen.intake.loader import load_spec_text

    spec = load_spec_text(spec_text(case, gpu), file="gpu_peak.yaml", base_dir=REPO)
    result = solve_spec(spec)
    assert result.best is not None
    predicted = result.best
    config = render_plan(spec, predicted.plan, "deepspeed").config
    accel = get_accelerator()
    hf = AutoConfig.from_pretrained(REPO / case.hf_config)
    hf._attn_implementation = "sdpa"
    if case.zero_stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = AutoModelForCausalLM.from_config(hf, torch_dtype=torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_config(hf)
    if case.checkpointing:
        model.gradient_checkpointing_enable()
    # torch.optim.AdamW built here, as the spec says (implementation: torch; dsgen prices its step
    # temporary): no DeepSpeed op has to be compiled on the GPU machine
    assert "optimizer" not in config, "the rendered config leaves the optimizer to the script"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    accel.empty_cache()
    accel.reset_peak_memory_stats()
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        ids = torch.randint(0, hf.vocab_size, (case.micro_batch, case.sequence_length), generator=gen)
        ids = ids.to(engine.device)
        accel.synchronize()
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        accel.synchronize()
        times.append(time.perf_counter() - start)
    allocated, reserved = accel.max_memory_allocated(), accel.max_memory_reserved()
    mem = predicted.memory.gpu
    row = {
        "case": case.name,
        "device": accel.device_name(),
        "device_model": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "plan": predicted.plan.describe(),
        "max_memory_allocated_gib": round(allocated / GIB, 3),
        "max_memory_reserved_gib": round(reserved / GIB, 3),
        "predicted_gpu_gib": round(mem.total / GIB, 3),
        "predicted_without_overhead_gib": round((mem.total - mem.overhead) / GIB, 3),
        "measured_step_s": round(statistics.median(times[1:] or times), 4),  # the first step warms up
        "predicted_step_s": round(predicted.step.total_s, 4),
    }
    if allocated:
        row["allocated_over_predicted_without_overhead"] = round(allocated / (mem.total - mem.overhead), 3)
    del engine, model
    accel.empty_cache()
    return row


def output_path(out: Path | None, cpu_smoke: bool) -> Path | None:
    """Where the rows are written: ``out`` when given, else :data:`GPU_OUT` for a GPU run and nowhere
    for the CPU smoke, whose counters are the process's and must never stand in the GPU figures' file."""
    if out is not None:
        return out
    return None if cpu_smoke else GPU_OUT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="the tiny CPU case (DS_ACCELERATOR=cpu)")
    parser.add_argument("--gpu", default="h200", help="dsgen GPU preset the prediction is made for")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--out",
        type=Path,
        help=f"where the rows go (default {GPU_OUT.relative_to(REPO)} on a GPU; --cpu-smoke writes only where told)",
    )
    parser.add_argument("--max-seconds", type=float, default=420.0, help="start no new case after this")
    args = parser.parse_args(argv)

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if args.cpu_smoke else "nccl")
    started = time.monotonic()
    rows = []
    try:
        for case in CPU_CASES if args.cpu_smoke else GPU_CASES:
            if time.monotonic() - started > args.max_seconds:
                print(f"skipped {case.name}: past --max-seconds")
                continue
            row = measure(case, args.gpu, args.steps)
            rows.append(row)
            print(json.dumps(row))
    finally:
        # an alive process group can abort the process in interpreter shutdown (docs/targets.md, "How your
        # script ends"); tear it down while Python is whole
        deepspeed.comm.destroy_process_group()
    out = output_path(args.out, args.cpu_smoke)
    if out is None:
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False, suffix=".tmp") as handle:
        json.dump(rows, handle, indent=1)
        handle.write("\n")
    os.replace(handle.name, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
