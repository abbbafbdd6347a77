"""How long ``dsgen frontier`` takes for five GPU counts (issue 21: under 2 s).

Three figures, each the median of several runs: the in-process search (``dsgen.api.frontier_of``,
Llama-3.1-8B on H100 80 GB, GPU counts 1, 8, 16, 32, 64) and the whole command in a fresh
process (``dsgen frontier SPEC --gpus 1,8,16,32,64 --json``), start-up included; and one full
solve at 2**24 tokens (issue 21: the search stays fast up to that length).

Run: .venv/bin/python bench/frontier_speed.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dsgen.api import frontier_of, load_spec, solve_spec  # noqa: E402

GPUS = [1, 8, 16, 32, 64]
GOAL_S = 2.0
RUNS = 5
SPEC = """\
model: {preset: llama-3.1-8b}
hardware: {gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 2048}
training: {sequence_length: 131072, global_batch_size: 8}
"""


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(SPEC)
        spec = load_spec(path)
        inside = []
        for _ in range(RUNS):
            start = time.perf_counter()
            points = frontier_of(spec, "sequence_length", GPUS)
            inside.append(time.perf_counter() - start)
        cold = []
        dsgen = [sys.executable, "-m", "dsgen", "frontier", str(path), "--gpus", ",".join(map(str, GPUS)), "--json"]
        for _ in range(RUNS):
            start = time.perf_counter()
            subprocess.run(dsgen, check=True, capture_output=True)
            cold.append(time.perf_counter() - start)
        longest = load_spec(path, overrides=[f"training.sequence_length={1 << 24}"])
        solves = []
        for _ in range(RUNS):
            start = time.perf_counter()
            solve_spec(longest)
            solves.append(time.perf_counter() - start)
    for point in points:
        print(f"  {point.gpus:>3} GPUs: {point.value:,} tokens")

    median_in, median_cold = statistics.median(inside), statistics.median(cold)
    print(
        f"in-process frontier, {len(GPUS)} GPU counts: median {median_in:.2f} s (runs: {', '.join(f'{t:.2f}' for t in inside)})"
    )
    print(
        f"dsgen frontier command, fresh process:  median {median_cold:.2f} s (runs: {', '.join(f'{t:.2f}' for t in cold)})"
    )
    print(f"one full solve at 2**24 tokens on 8 GPUs: median {statistics.median(solves) * 1000:.0f} ms")
    ok = median_cold < GOAL_S
    print(f"goal: under {GOAL_S:.0f} s for the command: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
