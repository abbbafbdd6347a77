"""Wall time of `dsgen solve` and `dsgen new` from a cold process, and of an in-process solve.

Targets: `dsgen new` under 0.3 s cold (issue: pipeline); a 70B model on 64 GPUs with every
dimension free solves in under 50 ms in-process. Run it with the Python of the environment dsgen
is installed in: .venv/bin/python bench/solve_speed.py

It also prints where one cold `dsgen new` spends its time (a fresh interpreter that imports and
runs the steps in turn with the console script's collector settings): the interpreter
itself, each third-party import, dsgen's own imports, the dataclasses they create, and the work.

The VM this was built on runs the same process anywhere from 190 to 330 ms depending on what its
neighbours do, in phases that last minutes. So the cold samples are taken in rounds that also time
the fixed floor (a bare interpreter importing typer, PyYAML and Jinja2 as the console script does):
a slow floor says the machine, not dsgen, was slow. Where valgrind is installed the script also
counts the instructions of one cold `dsgen new` and of the floor, figures that do not move with the
machine's load and so show what a change to dsgen bought.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import installed_dsgen  # bench/installed_dsgen.py

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "llama-3.1-8b-8xh100.yaml"
RUNS = 15  # this VM is noisy (+-40 ms run to run): more samples give a stabler median

SEVENTY_B_ON_64 = """\
model: {preset: llama-3.1-70b}
hardware: {gpu: h100-80gb, gpus_per_node: 8, nodes: 8, cpu_memory_gib: 2048,
           nvme: {path: /local_nvme, capacity_gib: 7000}}
training: {sequence_length: 4096, global_batch_size: 1024}
"""


# What every cold dsgen start pays before dsgen's own code runs: the interpreter and the three
# fixed dependencies, imported with dsgen._console.run's settings (its collector threshold, os._exit).
FLOOR = (
    "import gc, os; gc.set_threshold({threshold}, *gc.get_threshold()[1:]); "
    "import typer, yaml, jinja2, jinja2.sandbox; os._exit(0)"
)


def cold_rounds(commands: dict[str, list[str]]) -> dict[str, list[float]]:
    """Wall seconds of each command in a fresh process, ``RUNS`` rounds of one run each.

    Interleaving the commands puts their samples in the same machine state, so their medians
    can be compared with each other even when the machine's speed drifts.
    """
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(RUNS):
        for name, argv in commands.items():
            start = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True)
            samples[name].append(time.perf_counter() - start)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return samples


def instructions(argv: list[str]) -> int | None:
    """Instructions one run of ``argv`` executes, counted by callgrind; None without valgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    done = subprocess.run(
        [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv], capture_output=True, text=True
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"callgrind on {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def _ms(samples: list[float]) -> str:
    return f"median {statistics.median(samples) * 1000:.0f} ms, min {min(samples) * 1000:.0f} ms"


BREAKDOWN = r"""
import gc, sys, time
from dsgen._console import GEN0_THRESHOLD  # imports nothing else of dsgen's
gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])  # as dsgen._console.run does
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
    from dsgen._console import GEN0_THRESHOLD

    installed_dsgen.warm()
    with tempfile.TemporaryDirectory() as tmp:
        new = [*installed_dsgen.command(), "new", str(EXAMPLE), "-o", str(Path(tmp) / "ds_config.json"), "--force"]
        commands = {
            "floor": [sys.executable, "-c", FLOOR.format(threshold=GEN0_THRESHOLD)],
            "solve": [*installed_dsgen.command(), "solve", str(EXAMPLE), "--json"],
            "new": new,
        }
        samples = cold_rounds(commands)
        counts = {"floor": instructions(commands["floor"]), "new": instructions(new)}
    print(f"dsgen solve (cold process): {_ms(samples['solve'])} over {RUNS} runs")
    print(f"dsgen new   (cold process): {_ms(samples['new'])} over {RUNS} runs  (target < 300 ms)")
    print(
        f"  the same rounds' floor (python importing typer, PyYAML, Jinja2; nothing of dsgen): {_ms(samples['floor'])}"
    )
    print(breakdown())
    if counts["new"] is not None and counts["floor"] is not None:
        print(
            f"instructions (callgrind; independent of machine load): one dsgen new {counts['new'] / 1e6:.0f} M, "
            f"the floor {counts['floor'] / 1e6:.0f} M, dsgen's own share {(counts['new'] - counts['floor']) / 1e6:.0f} M"
        )
    else:
        print("instructions: not counted (valgrind is not installed)")

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
