"""Measure DeepSpeed 0.19.8's fixed host-side cost per ZeRO-3 module fetch and per ZeRO-2 gradient hook.

Why: ZeRO-3's step time has a part that does not scale with bytes (bench/throughput_accuracy.py, BELLE:
a ~270 ms floor per step that neither sequence length nor model size moves), and ZeRO-2's backward
runs a per-parameter hook (``stage_1_and_2.py``: ``process_gradients`` ->
``reduce_independent_p_g_buckets_and_remove_grads``) that ZeRO-1 without ``overlap_comm`` does not.
Both are Python/launch overhead per module or per tensor, so a model of many *tiny* modules isolates
them: compute and communicated bytes are negligible and the difference between stages is the
per-fetch / per-tensor cost.

Model: ``MODULES`` ``torch.nn.Linear(8, 8)`` in sequence (2 tensors each), fp32, micro-batch 1, two
ranks, gloo, DeepSpeed's CPU accelerator, DeepSpeed's defaults for every ZeRO knob except ZeRO-3's
``stage3_param_persistence_threshold`` 0 (so every module is fetched, as large modules are) and
``stage3_prefetch_bucket_size`` 0 (no prefetch: each fetch is on the critical path). Per stage, the
median over ``STEPS`` of forward+backward+step CPU time of the
rank's process (``time.process_time``, one torch thread: the host cost itself, not the wait for
a core on a shared machine). Then:

* per ZeRO-3 fetch  = (t3 - t1) / (2 x MODULES)   (each module fetched in forward and again in backward)
* per ZeRO-2 tensor = (t2 - t1) / (2 x MODULES)   (one hook per parameter tensor)

This is the host-side floor on a CPU (the GPU path adds a CUDA all-gather launch and event sync per
fetch). Run: python bench/zero_hook_latency.py [--modules 200] [--steps 20]   (about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def config(stage: int) -> dict[str, object]:
    zero: dict[str, object] = {"stage": stage}
    if stage == 3:
        zero |= {"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": zero,
    }


def worker(job: dict[str, object]) -> None:
    import deepspeed
    import torch
    from deepspeed import comm as dist

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    modules = int(job["modules"])  # type: ignore[call-overload]
    steps = int(job["steps"])  # type: ignore[call-overload]
    results = {}
    for stage in (1, 2, 3):
        cfg = config(stage)

        def build() -> torch.nn.Module:
            return torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(modules)])

        if stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=cfg):
                model = build()
        else:
            model = build()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
        x = torch.randn(1, 8)
        times = []
        for _ in range(steps + 2):
            dist.barrier()
            t0 = time.process_time()
            loss = engine(x).square().sum()
            engine.backward(loss)
            engine.step()
            times.append(time.process_time() - t0)
        results[stage] = statistics.median(times[2:])
        destroy = getattr(engine, "destroy", None)
        if callable(destroy):
            destroy()
    if rank == 0:
        Path(str(job["out"])).write_text(json.dumps(results))
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=2, help="1 isolates the hook path from gloo's all-gather")
    args = parser.parse_args(argv)
    from tests.ds_oracle import run_torchrun

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"modules": args.modules, "steps": args.steps, "out": str(out)}))
        rc, log, _, _ = run_torchrun([__file__, "--worker", str(job)], ranks=args.ranks, cwd=REPO, timeout=600)
        if rc != 0 or not out.exists():
            print(log[-4000:])
            return 1
        times = {int(k): v for k, v in json.loads(out.read_text()).items()}
    m = args.modules
    print(
        f"{m} x Linear(8, 8), {args.ranks} rank(s), gloo, DeepSpeed CPU accelerator; median CPU time of a step (forward+backward+step):"
    )
    for stage, t in sorted(times.items()):
        print(f"  ZeRO-{stage}: {t * 1e3:8.2f} ms")
    print(f"per ZeRO-3 fetch:  {(times[3] - times[1]) / (2 * m) * 1e6:7.1f} us  ((t3 - t1) / (2 x {m}))")
    print(f"per ZeRO-2 tensor: {(times[2] - times[1]) / (2 * m) * 1e6:7.1f} us  ((t2 - t1) / (2 x {m}))")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(Path(sys.argv[2]).read_text()))
    sys.exit(main())
