"""Every launch file sets the CUDA allocator's expandable segments on NVIDIA GPUs (dsgen.targets.allocator_env).

Checked by running what reads it: each launch.sh under bash with stub launchers on PATH (the value
reaches the launcher's environment, and a value the user exported wins), DeepSpeed's own
multi-node runner on the bundle's ``.deepspeed_env`` (it forwards the value to the other nodes),
and the Kubernetes manifests' container env.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dsgen.intake.loader import load_spec_text
from dsgen.search.solver import solve
from dsgen.targets.bundle import render_bundle, write_bundle
from tests.conftest import EXAMPLES_DIR, require_module

SETTING = "expandable_segments:True"
SPEC = """model: {{preset: llama-3.1-8b}}
hardware: {{gpu: {gpu}, gpus_per_node: 8, nodes: 2, cpu_memory_gib: 1024}}
training: {{sequence_length: 4096, global_batch_size: 64}}
"""

# a launcher stand-in: records the allocator setting it was started with
STUB = """#!/usr/bin/env bash
printf '%s\\n' "${PYTORCH_CUDA_ALLOC_CONF-<unset>}" >> "$STUB_LOG"
"""


def _bundle(tmp_path: Path, gpu: str, target: str, launcher: str) -> Path:
    spec = load_spec_text(SPEC.format(gpu=gpu), file="spec.yaml", base_dir=EXAMPLES_DIR)
    best = solve(spec).best
    assert best is not None
    dest = tmp_path / f"{gpu}-{target}-{launcher}"
    write_bundle(render_bundle(spec, best.plan, target, launcher), dest, force=False)
    return dest


def _run_launch(dest: Path, tmp_path: Path, launcher: str, **env: str) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / launcher).write_text(STUB)
    (bin_dir / launcher).chmod(0o755)
    (tmp_path / "train.py").write_text("")
    log = tmp_path / f"{dest.name}.log"
    base = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    proc = subprocess.run(
        [str(dest / "launch.sh")],
        env={
            **base,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "STUB_LOG": str(log),
            "TRAIN_SCRIPT": str(tmp_path / "train.py"),
            "MASTER_ADDR": "127.0.0.1",
            **env,
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return log.read_text().splitlines()


@pytest.mark.parametrize(
    ("target", "launcher"), [("hf-trainer", "torchrun"), ("hf-trainer", "deepspeed"), ("accelerate", "accelerate")]
)
def test_launch_sh_starts_the_launcher_with_expandable_segments(tmp_path: Path, target: str, launcher: str) -> None:
    dest = _bundle(tmp_path, "h100-80gb", target, launcher)
    assert _run_launch(dest, tmp_path, launcher) == [SETTING]
    # the user's own setting is kept
    assert _run_launch(dest, tmp_path, launcher, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:512") == [
        SETTING,
        "max_split_size_mb:512",
    ]


def test_sbatch_script_exports_it_for_srun(tmp_path: Path) -> None:
    text = (_bundle(tmp_path, "h100-80gb", "hf-trainer", "slurm") / "launch.sh").read_text()
    export = f'export PYTORCH_CUDA_ALLOC_CONF="${{PYTORCH_CUDA_ALLOC_CONF:-{SETTING}}}"\n'
    assert text.count(export) == 1 and text.index(export) < text.index("srun ")


def test_deepspeed_multi_node_runner_forwards_it_to_every_node(tmp_path: Path) -> None:
    """DeepSpeed's runner (``deepspeed.launcher.runner.main``), started in the bundle as launch.sh
    starts it, reads ``.deepspeed_env`` and puts the export in the pdsh command every node runs.
    pdsh itself and the process start are stubbed: only the command is built."""
    require_module("deepspeed")
    dest = _bundle(tmp_path, "h100-80gb", "hf-trainer", "deepspeed")
    assert (dest / ".deepspeed_env").read_text() == f"PYTORCH_CUDA_ALLOC_CONF={SETTING}\n"
    probe = """
import json, sys
from deepspeed.launcher import multinode_runner, runner
seen = {}
class Done:
    returncode = 0
    def wait(self):
        return 0
def popen(cmd, env=None, **kwargs):
    seen["cmd"] = cmd
    return Done()
multinode_runner.PDSHRunner.backend_exists = lambda self: True
runner.subprocess.Popen = popen
try:
    runner.main(["--hostfile", "hostfile", "--no_ssh_check", "--master_addr", "10.0.0.1",
                 "--num_nodes", "2", "--num_gpus", "8", "train.py"])
except SystemExit:
    pass
print(json.dumps(seen["cmd"]))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=dest,
        env={**env, "DS_ACCELERATOR": "cpu"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    cmd = json.loads(proc.stdout.splitlines()[-1])
    assert cmd[0] == "pdsh" and f"export PYTORCH_CUDA_ALLOC_CONF={SETTING};" in " ".join(cmd)


@pytest.mark.parametrize(("launcher", "job"), [("kubernetes", "trainjob.yaml"), ("pytorchjob", "pytorchjob.yaml")])
def test_kubernetes_containers_get_it(tmp_path: Path, launcher: str, job: str) -> None:
    manifest = yaml.safe_load((_bundle(tmp_path, "h100-80gb", "hf-trainer", launcher) / job).read_text())
    if launcher == "kubernetes":
        envs = [manifest["spec"]["trainer"]["env"]]
    else:
        envs = [r["template"]["spec"]["containers"][0]["env"] for r in manifest["spec"]["pytorchReplicaSpecs"].values()]
    assert len(envs) == (1 if launcher == "kubernetes" else 2)
    for env in envs:
        assert {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": SETTING} in env


def test_amd_gpus_get_no_cuda_allocator_setting(tmp_path: Path) -> None:
    dest = _bundle(tmp_path, "mi300x", "hf-trainer", "deepspeed")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in (dest / "launch.sh").read_text()
    assert not (dest / ".deepspeed_env").exists()
    assert _run_launch(dest, tmp_path, "deepspeed") == ["<unset>"]
