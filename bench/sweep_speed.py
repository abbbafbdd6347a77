"""Time a 1,000-run sweep end to end: expand, solve, render, validate and write every run.

Target: under 10 s on the 2-core reference machine. Run it with the Python of the environment dsgen
is installed in: .venv/bin/python bench/sweep_speed.py
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import installed_dsgen  # bench/installed_dsgen.py

BASE = """\
model: {preset: llama-3.1-8b}
hardware: {gpu: h100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}
training: {sequence_length: 4096, global_batch_size: 256}
"""

SWEEP = """\
base: base.yaml
name: "{{ model.preset }}-s{{ training.sequence_length }}-n{{ hardware.nodes }}-{{ hardware.gpu }}"
grid:
  model.preset: [gpt2, gpt2-xl, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, mistral-7b, qwen2.5-7b, qwen2.5-14b, gemma-2-9b, phi-3-mini]
  training.sequence_length: [1024, 2048, 4096, 8192, 16384]
  hardware.nodes: [1, 2, 4, 8]
  hardware.gpu: [h100-80gb, a100-80gb, a100-40gb, l40s, h200]
"""


def main() -> None:
    installed_dsgen.warm()
    command = installed_dsgen.command()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "base.yaml").write_text(BASE)
        (root / "sweep.yaml").write_text(SWEEP)
        start = time.perf_counter()
        done = subprocess.run(
            [*command, "sweep", str(root / "sweep.yaml"), "-o", str(root / "runs")], capture_output=True, text=True
        )
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"sweep failed ({done.returncode}):\n{done.stderr[-2000:]}")
        rows = [json.loads(line) for line in (root / "runs" / "manifest.jsonl").read_text().splitlines()]
        feasible = sum(r["status"] == "ok" for r in rows)
        configs = sum(len(r["files"]) for r in rows)
    print(
        f"1000-run sweep: {len(rows)} runs ({feasible} feasible, {configs} configs rendered, validated and written) "
        f"in {elapsed:.2f} s wall, cold process (target < 10 s)"
    )


if __name__ == "__main__":
    main()
