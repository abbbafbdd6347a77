"""Accuracy of dsgen's long-context memory terms against a real 2-rank DeepSpeed run (Ulysses SP = 2).

For a tiny Llama (4 query heads, 2 kv heads) and a tiny Qwen3 (4 query heads, 1 kv head: the
kv heads are replicated to the SP degree), at two sequence lengths, with Ulysses alone and with
TiledMLP, the tiled loss and checkpoint offload, ``bench/long_context_worker.py`` runs on 2 CPU
ranks (torchrun, gloo, DeepSpeed's CPU accelerator, ZeRO-2, fp32) and reports per rank the bytes
autograd holds at the end of forward (device), the bytes checkpoint offload moves to the host
and, under checkpointing, the most one checkpointed layer's forward holds (its input and working
set, parameters excluded).

Predicted: :func:`dsgen.estimate.sequence_parallel.long_context_memory` for the
:class:`ModelShape` :func:`dsgen.catalog.hf_config.shape_from_hf_config` reads from the same
``config.json`` (``activations.total``; ``host_per_rank`` for the offloaded checkpoints;
``layer_forward`` for the checkpointed layer's forward).

What cannot run on CPU: FlashAttention-2 (CUDA only). sdpa runs PyTorch's fused CPU kernel, which
saves what the CUDA flash kernel saves (q, k, v, output, fp32 log-sum-exp), so the measured
inventory is the one dsgen prices for both. The host copy of checkpoint offload is a no-op on a
CPU (``.cpu()`` returns the tensor), so its bytes are counted where the offload would put them.

Targets: median absolute error <= 3 %, worst <= 8 %. Run: .venv/bin/python bench/long_context_accuracy.py
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import transformers  # noqa: E402

from dsgen.catalog.hf_config import shape_from_hf_config  # noqa: E402
from dsgen.estimate.sequence_parallel import long_context_memory  # noqa: E402
from dsgen.plan import LongContext, Plan  # noqa: E402
from dsgen.spec.types import Training  # noqa: E402

MEDIAN_TARGET, WORST_TARGET = 3.0, 8.0
SP = 2
MODELS: dict[str, dict[str, Any]] = {
    "llama": dict(
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        attention_dropout=0.0,
        use_cache=False,
    ),
    "qwen3": dict(
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=1000,
        attention_dropout=0.0,
        use_cache=False,
    ),
}
VARIANTS = {
    "sp2": dict(tiled_mlp=False, tiled_loss=False, checkpoint_offload=False),
    "sp2+tiled-mlp": dict(tiled_mlp=True, tiled_loss=False, checkpoint_offload=False),
    "sp2+tiled-loss": dict(tiled_mlp=False, tiled_loss=True, checkpoint_offload=False),
    "sp2+offload": dict(tiled_mlp=False, tiled_loss=False, checkpoint_offload=True),
    "sp2+all+offload": dict(tiled_mlp=True, tiled_loss=True, checkpoint_offload=True),
}
SEQUENCES = (512, 1024)


def cases_for(family: str) -> list[dict[str, Any]]:
    return [
        {
            "name": f"{family} s={seq} {variant}",
            "family": family,
            "config": MODELS[family],
            "sequence_length": seq,
            **flags,
        }
        for seq in SEQUENCES
        for variant, flags in VARIANTS.items()
    ]


def predict(config_dir: Path, case: dict[str, Any]) -> tuple[int, int, int]:
    """Per-rank activation bytes, offloaded checkpoint bytes and one checkpointed layer's forward."""
    shape = shape_from_hf_config(config_dir / "config.json")
    lc = LongContext(SP, case["tiled_mlp"], case["tiled_loss"], case["checkpoint_offload"])
    plan = Plan(
        precision="fp32",
        zero_stage=2,
        offload_optimizer="none",
        offload_param="none",
        checkpointing="full" if case["checkpoint_offload"] else "none",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=SP,
        long_context=lc,
    )
    memory = long_context_memory(
        shape, plan, Training(sequence_length=case["sequence_length"], global_batch_size=1, attention="sdpa")
    )
    return memory.activations.total, memory.host_per_rank, memory.layer_forward


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = dict(
        os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error"
    )
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    command = [
        str(Path(sys.executable).parent / "torchrun"),
        "--nproc_per_node=2",
        f"--master_port={_port()}",
        str(REPO / "bench" / "long_context_worker.py"),
        json.dumps(cases),
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3000, check=False)
    log = proc.stdout + proc.stderr
    rows = [json.loads(m) for m in re.findall(r"DSGEN_LC (\{[^{}]*\})", log)]
    if proc.returncode or len(rows) != 2 * len(cases):
        raise SystemExit(f"worker failed (exit {proc.returncode}):\n{log[-5000:]}")
    return rows


def main() -> int:
    errors: list[float] = []
    print(
        f"{'case':<32} {'rank':>4} {'measured':>10} {'predicted':>10} {'error':>7}"
        "   host measured / predicted   layer forward measured / predicted"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for family in MODELS:
            config_dir = Path(tmp) / family
            config_dir.mkdir()
            transformers.AutoConfig.for_model(family, **MODELS[family]).to_json_file(str(config_dir / "config.json"))
            cases = {c["name"]: c for c in cases_for(family)}
            for row in measure(list(cases.values())):
                case = cases[row["name"]]
                device, host, forward = predict(config_dir, case)
                error = 100 * (device - row["device_bytes"]) / row["device_bytes"]
                errors.append(abs(error))
                host_text = ""
                if case["checkpoint_offload"]:
                    host_error = 100 * (host - row["host_bytes"]) / row["host_bytes"]
                    errors.append(abs(host_error))
                    forward_error = 100 * (forward - row["layer_forward_bytes"]) / row["layer_forward_bytes"]
                    errors.append(abs(forward_error))
                    host_text = (
                        f"{row['host_bytes']:>8} / {host:>8} ({host_error:+.1f}%)"
                        f"   {row['layer_forward_bytes']:>8} / {forward:>8} ({forward_error:+.1f}%)"
                    )
                print(
                    f"{row['name']:<32} {row['rank']:>4} {row['device_bytes']:>10} {device:>10} {error:>+6.1f}%   {host_text}"
                )
    median, worst = statistics.median(errors), max(errors)
    ok = median <= MEDIAN_TARGET and worst <= WORST_TARGET
    print(
        f"\n{len(errors)} figures: median |error| {median:.2f} % (target {MEDIAN_TARGET} %), worst {worst:.2f} % (target {WORST_TARGET} %): {'met' if ok else 'NOT met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
