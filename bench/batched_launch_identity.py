"""Proof that measuring several cases in one torchrun launch measures what one launch per case does.

tests/ds_oracle.measure_cases runs a harness's cases in turn in the same rank processes (issue 49:
one launch per worker file). A case must not see what an earlier case in the same processes left
behind (engines, hooks, global state, random state). This runs every case of
tests/test_finetuning_measured.py both ways and compares each rank's record, key by key, leaving out
only the wall-clock timings:

    DS_ACCELERATOR=cpu .venv/bin/python bench/batched_launch_identity.py

Prints the launch wall times both ways and every key that differs (none, when it holds).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the harness, and the conftest the test file imports
from tests.finetune_oracle import measure_finetunes  # noqa: E402
from tests.test_finetuning_measured import CASES, MICRO, RANKS, SEQUENCE  # noqa: E402

TIMING_KEYS = {"timings", "run_wall_s", "prebuild_s"}


def _comparable(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in TIMING_KEYS}


def main() -> None:
    names = sorted(CASES)
    cases = [{"micro_batch": MICRO, "seq_len": SEQUENCE, **CASES[name]} for name in names]
    measure_finetunes(cases[:1], ranks=RANKS)  # builds the ops, warms the page cache
    start = time.perf_counter()
    alone = [measure_finetunes([case], ranks=RANKS)[0] for case in cases]
    alone_s = time.perf_counter() - start
    start = time.perf_counter()
    together = measure_finetunes(cases, ranks=RANKS)
    together_s = time.perf_counter() - start
    differing = 0
    for name, one, batched in zip(names, alone, together, strict=True):
        for rank_one, rank_batched in zip(one, batched, strict=True):
            a, b = _comparable(rank_one), _comparable(rank_batched)
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    differing += 1
                    print(f"{name} rank {rank_one['rank']}: {key}: alone {a.get(key)!r} != together {b.get(key)!r}")
    print(
        f"{len(cases)} cases on {RANKS} ranks: one launch per case {alone_s:.1f} s, one launch for all "
        f"{together_s:.1f} s; {differing} record keys differ"
    )


if __name__ == "__main__":
    main()
