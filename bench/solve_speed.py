"""Wall time of `dsgen solve` and `dsgen new` from a cold process, and of an in-process solve.

Targets: `dsgen new` under 0.3 s cold (issue: pipeline); a 70B model on 64 GPUs with every
dimension free solves in under 50 ms in-process. Run: python bench/solve_speed.py

It also prints where one cold `dsgen new` spends its time (a fresh interpreter that imports and
runs the steps in turn with the console script's settings, cyclic GC paused): the interpreter
itself, each third-party import, dsgen's own imports, the dataclasses they create, and the work.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "llama-3.1-8b-8xh100.yaml"
RUNS = 15  # this VM is noisy (+-40 ms run to run): more samples give a stabler median

SEVENTY_B_ON_64 = """\
model: {preset: llama-3.1-70b}
hardware: {gpu: h100-80gb, gpus_per_node: 8, nodes: 8, cpu_memory_gib: 2048,
           nvme: {path: /local_nvme, capacity_gib: 7000}}
training: {sequence_length: 4096, global_batch_size: 1024}
"""


def _dsgen() -> list[str]:
    exe = shutil.which("dsgen")
    return [exe] if exe else [sys.executable, "-m", "dsgen"]


def cold(args: list[str]) -> list[float]:
    """Median-friendly samples of one CLI invocation in a fresh process each time."""
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        done = subprocess.run([*_dsgen(), *args], capture_output=True, text=True)
        samples.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"dsgen {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return samples


BREAKDOWN = r"""
import gc, sys, time
gc.disable()  # as dsgen._console.run does
import dataclasses
created = [0, 0.0]
_process_class = dataclasses._process_class
def _timed(cls, *args, **kwargs):  # measurement only: how long dataclass creation takes
    start = time.perf_counter()
    try:
        return _process_class(cls, *args, **kwargs)
    finally:
        created[0] += 1
        created[1] += time.perf_counter() - start
dataclasses._process_class = _timed
marks = [("start", time.perf_counter())]
def mark(name): marks.append((name, time.perf_counter()))
import typer; mark("import typer")
import yaml; mark("import yaml")
import jinja2; mark("import jinja2")
before_count, before = created
import dsgen.api, dsgen.cli.plan_cmd, dsgen.output, dsgen.report, dsgen.validate; mark("import dsgen")
from pathlib import Path
spec = dsgen.api.load_spec(Path(sys.argv[1])); mark("load spec + presets")
result = dsgen.api.solve_spec(spec); mark("solve")
rendered = dsgen.api.render_plan(spec, result.best.plan); mark("render + validate")
steps = ", ".join(f"{name} {1000 * (t - prev):.0f} ms" for (name, t), (_, prev) in zip(marks[1:], marks[:-1]))
count, seconds = created[0] - before_count, created[1] - before
print(f"{steps} (dsgen's imports created {count} dataclasses: {1000 * seconds:.0f} ms)")
"""


def breakdown() -> str:
    """One cold process's time split (see module docstring); interpreter start-up measured apart."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    bare = time.perf_counter() - start
    done = subprocess.run([sys.executable, "-c", BREAKDOWN, str(EXAMPLE)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"breakdown failed:\n{done.stderr}")
    return f"where a cold dsgen new goes: interpreter start+exit {bare * 1000:.0f} ms, " + done.stdout.strip()


def main() -> None:
    subprocess.run([*_dsgen(), "presets", "gpus"], capture_output=True)  # warm the page cache and .pyc files
    solve_times = cold(["solve", str(EXAMPLE), "--json"])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ds_config.json"
        new_times = cold(["new", str(EXAMPLE), "-o", str(out), "--force"])
    print(
        f"dsgen solve (cold process): median {statistics.median(solve_times) * 1000:.0f} ms, "
        f"min {min(solve_times) * 1000:.0f} ms over {RUNS} runs"
    )
    print(
        f"dsgen new   (cold process): median {statistics.median(new_times) * 1000:.0f} ms, "
        f"min {min(new_times) * 1000:.0f} ms over {RUNS} runs  (target < 300 ms)"
    )
    print(breakdown())

    sys.path.insert(0, str(REPO))
    from dsgen.solver import solve
    from dsgen.spec.loader import load_spec_text

    spec = load_spec_text(SEVENTY_B_ON_64, file="70b-64gpu.yaml", base_dir=REPO)
    solve(spec)  # first call pays for lazy imports and caches
    samples = []
    for _ in range(20):
        start = time.perf_counter()
        result = solve(spec)
        samples.append(time.perf_counter() - start)
    print(
        f"in-process solve, llama-3.1-70b on 64 x h100-80gb, every dimension free: "
        f"median {statistics.median(samples) * 1000:.1f} ms, {result.candidates_evaluated} candidates evaluated "
        f"(target < 50 ms)"
    )


if __name__ == "__main__":
    main()
