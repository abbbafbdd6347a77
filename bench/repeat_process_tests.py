"""Run the tests that start processes again and again, and count the runs that pass (issue 20).

A test that launches torchrun or DeepSpeed can pass once and fail on the next run for a reason
that has nothing to do with what it checks (the gloo teardown abort after training was one: the
run trained, then rank 0 died at exit). Such a flake turns CI red at random, and the same ending
marks a user's job failed although it trained. So a fix is shown by repetition, not by one green
run:

1. ``tests/test_targets.py`` (it launches the HF Trainer bundle through its launch script),
   ``--targets-runs`` times in a row (default 30);
2. every test marked ``slow`` (the marker's meaning: it starts processes that run DeepSpeed or
   torchrun), ``--slow-runs`` times (default 5).

Each run is a fresh ``pytest`` process. Every run is made, whatever the one before did, and the
script prints, per selection, how many passed and, for each failing run, the tail of its output.
It exits 1 when any run failed.

Run it from the checkout, in the environment the README's test command builds, with the variables
CI sets (``DSGEN_CORPUS``, ``DSGEN_REQUIRE_ALL=1``, ``TORCH_EXTENSIONS_DIR``)::

    .venv/bin/python bench/repeat_process_tests.py
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def repeat(label: str, selection: list[str], runs: int) -> bool:
    """Run ``pytest <selection>`` ``runs`` times; print the count that passed. True when all did."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection]
    passed = 0
    started = time.perf_counter()
    for run in range(1, runs + 1):
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "(no output)"
        if done.returncode == 0:
            passed += 1
        else:
            tail = (done.stdout + done.stderr)[-3000:]
            print(f"{label}: run {run} FAILED (exit {done.returncode}): {summary}\n{tail}\n", flush=True)
        print(f"  {label}: run {run}/{runs}: {summary}", flush=True)
    minutes = (time.perf_counter() - started) / 60
    print(f"{label}: {passed} of {runs} runs passed ({minutes:.1f} min)", flush=True)
    return passed == runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets-runs", type=int, default=30)
    parser.add_argument("--slow-runs", type=int, default=5)
    args = parser.parse_args()
    results = [
        repeat("tests/test_targets.py", ["tests/test_targets.py"], args.targets_runs),
        repeat("every test that starts processes (-m slow)", ["-m", "slow"], args.slow_runs),
    ]
    raise SystemExit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
