"""LLaMA-Factory's own argument parser, in a virtual environment of its own.

LLaMA-Factory 0.9.5 pins transformers <= 5.6, ours is 5.24, so it cannot share the test venv. The
venv is built once per machine (PyPI, about 3 minutes, 2.2 GB) under ``$DSGEN_ORACLE_CACHE`` (default
``~/.cache/dsgen/oracles``), outside any checkout, so every clone and CI run reuses it. Beside it:
DeepSpeed 0.19.8 (``get_train_args`` loads the JSON a YAML points to) and no torchvision or
torchaudio (PyPI's builds do not load beside torch 2.13's CPU wheel, and LLaMA-Factory needs them
only for images and audio).

:func:`parse` runs ``llamafactory.hparams.get_train_args`` on YAML files, all in one process, as
rank 0 of a one-rank torchrun (LLaMA-Factory refuses a DeepSpeed run outside a distributed launch,
``hparams/parser.py``), with ``use_cpu`` (bf16 on a CPU), and returns what each parsed to, or
LLaMA-Factory's error. One process parses them all: its imports take most of the time.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

LLAMAFACTORY = "llamafactory==0.9.5"
PACKAGES = ("torch==2.13.0", LLAMAFACTORY, "deepspeed==0.19.8")


def venv_dir() -> Path:
    cache = Path(os.environ.get("DSGEN_ORACLE_CACHE") or Path.home() / ".cache" / "dsgen" / "oracles")
    return cache / LLAMAFACTORY.replace("==", "-")


def python() -> Path:
    """The venv's interpreter, building the venv first when no complete one is there."""
    venv = venv_dir()
    done = venv / ".complete"
    if done.is_file():
        return venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait and reuse its venv
        if not done.is_file():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
            subprocess.run([*pip, *PACKAGES], check=True, timeout=1800)
            subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio"],
                check=True,
            )
            done.write_text(" ".join(PACKAGES) + "\n")
    return venv / "bin" / "python"


PARSE = r"""
import json, os, sys
import yaml
from llamafactory.hparams import get_train_args

out = []
for path in sys.argv[1:]:
    os.chdir(os.path.dirname(os.path.abspath(path)))  # where the JSON it names is, as llamafactory-cli runs
    args = yaml.safe_load(open(path))
    args["use_cpu"] = True  # bf16 on a CPU rank
    try:
        model, data, training, finetuning, _ = get_train_args(args)
    except Exception as exc:  # the answer is LLaMA-Factory's own error
        out.append({"error": f"{type(exc).__name__}: {exc}"})
        continue
    out.append({
        "stage": finetuning.stage, "finetuning_type": finetuning.finetuning_type, "pref_loss": finetuning.pref_loss,
        "lora_rank": finetuning.lora_rank, "lora_alpha": finetuning.lora_alpha,
        "lora_dropout": finetuning.lora_dropout, "lora_target": finetuning.lora_target,
        "freeze_trainable_layers": finetuning.freeze_trainable_layers,
        "quantization_bit": model.quantization_bit, "quantization_type": model.quantization_type,
        "double_quantization": model.double_quantization, "flash_attn": str(model.flash_attn),
        "disable_gradient_checkpointing": model.disable_gradient_checkpointing,
        "cutoff_len": data.cutoff_len, "deepspeed": training.deepspeed,
        "per_device_train_batch_size": training.per_device_train_batch_size,
        "gradient_accumulation_steps": training.gradient_accumulation_steps,
        "bf16": training.bf16, "fp16": training.fp16, "learning_rate": training.learning_rate,
        "max_grad_norm": training.max_grad_norm,
    })
print("DSGEN_LF " + json.dumps(out))
"""


def parse(files: list[Path]) -> list[dict[str, Any]]:
    """What ``get_train_args`` makes of each file, each parsed in its own folder."""
    from tests.conftest import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(
        LOCAL_RANK="0",
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        DS_ACCELERATOR="cpu",
        HF_HUB_OFFLINE="1",
        DISABLE_VERSION_CHECK="1",
    )
    done = subprocess.run(
        [str(python()), "-c", PARSE, *map(str, files)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    line = next((line for line in done.stdout.splitlines() if line.startswith("DSGEN_LF ")), None)
    assert line is not None, (done.stdout + done.stderr)[-6000:]
    return list(json.loads(line[len("DSGEN_LF ") :]))
