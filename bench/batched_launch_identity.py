"""Proof that measuring several cases in one torchrun launch measures what one launch per case does.

tests/ds_oracle.measure_cases and tests/ds_oracle.train_cases run a harness's cases in turn in the
same rank processes (issue 49: one launch per worker file). A case must not see what an earlier case
in the same processes left behind (engines, hooks, global state, random state). This runs every
case of tests/test_finetuning_measured.py, and every training run of tests/train_cases.py, both ways
and compares each rank's record (for a training run: its losses, to the bit, and its final report),
key by key, leaving out only the wall-clock timings:

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
from tests.ds_oracle import TrainCase, train_cases  # noqa: E402
from tests.finetune_oracle import measure_finetunes  # noqa: E402
from tests.test_finetuning_measured import CASES, MICRO, RANKS, SEQUENCE  # noqa: E402
from tests.train_cases import HAND_WRITTEN, STEPS, TRAINING_PLANS, rendered_case  # noqa: E402

TIMING_KEYS = {"timings", "run_wall_s", "prebuild_s", "import_s", "init_s", "train_s"}


def _comparable(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in TIMING_KEYS}


def _differences(name: str, one: dict[str, Any], batched: dict[str, Any]) -> int:
    """Print and count the keys of two records that differ, timings left out."""
    a, b = _comparable(one), _comparable(batched)
    differing = [key for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    for key in differing:
        print(f"{name}: {key}: alone {a.get(key)!r} != together {b.get(key)!r}")
    return len(differing)


def _rank_differences(names: list[str], alone: list[list[dict[str, Any]]], together: list[list[dict[str, Any]]]) -> int:
    """:func:`_differences` of each case's rank records, one launch each against a shared launch."""
    differing = 0
    for name, one, batched in zip(names, alone, together, strict=True):
        for rank_one, rank_batched in zip(one, batched, strict=True):
            differing += _differences(f"{name} rank {rank_one['rank']}", rank_one, rank_batched)
    return differing


def training_runs() -> None:
    """tests/train_cases.py's runs (tests/ds_oracle.train_cases), one launch each and all in one."""
    import tempfile

    cases = {name: TrainCase(config, STEPS, checkpointing=ckpt) for name, (config, ckpt) in HAND_WRITTEN.items()}
    cases.update({f"rendered-{name}": rendered_case(name) for name in TRAINING_PLANS})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        alone = [train_cases([case], tmp_path=root / name)[0] for name, case in cases.items()]
        alone_s = time.perf_counter() - start
        start = time.perf_counter()
        together = train_cases(list(cases.values()), tmp_path=root / "together")
        together_s = time.perf_counter() - start
    differing = 0
    for name, one, batched in zip(cases, alone, together, strict=True):
        assert one.ok and batched.ok, f"{name}: {one.describe()[-2000:]}\n{batched.describe()[-2000:]}"
        differing += _differences(name, {"losses": one.losses, **one.info}, {"losses": batched.losses, **batched.info})
    print(
        f"{len(cases)} training runs on 2 ranks: one launch per run {alone_s:.1f} s, one launch for all "
        f"{together_s:.1f} s; {differing} keys differ (losses compared to the bit)"
    )


def model_parallel_runs() -> None:
    """tests/mp_cases.py's AutoTP and AutoEP cases, one launch each and one per shared launch."""
    from tests.mp_cases import CASES as MP_CASES
    from tests.mp_cases import launch_of
    from tests.mp_oracle import measure_mp_cases

    differing, alone_s, together_s = 0, 0.0, 0.0
    for launch in sorted({launch_of(name) for name in MP_CASES}):
        ranks = launch[0]
        names = [name for name in MP_CASES if launch_of(name) == launch]
        start = time.perf_counter()
        alone = [measure_mp_cases([MP_CASES[name][0]], ranks=ranks)[0] for name in names]
        alone_s += time.perf_counter() - start
        start = time.perf_counter()
        together = measure_mp_cases([MP_CASES[name][0] for name in names], ranks=ranks)
        together_s += time.perf_counter() - start
        differing += _rank_differences(names, alone, together)
    print(
        f"{len(MP_CASES)} AutoTP/AutoEP cases: one launch per case {alone_s:.1f} s, shared launches "
        f"{together_s:.1f} s; {differing} record keys differ"
    )


def finetune_runs() -> None:
    """tests/test_finetuning_measured.py's fine-tuning cases, one launch each and all in one."""
    names = sorted(CASES)
    cases = [{"micro_batch": MICRO, "seq_len": SEQUENCE, **CASES[name]} for name in names]
    measure_finetunes(cases[:1], ranks=RANKS)  # builds the ops, warms the page cache
    start = time.perf_counter()
    alone = [measure_finetunes([case], ranks=RANKS)[0] for case in cases]
    alone_s = time.perf_counter() - start
    start = time.perf_counter()
    together = measure_finetunes(cases, ranks=RANKS)
    together_s = time.perf_counter() - start
    differing = _rank_differences(names, alone, together)
    print(
        f"{len(cases)} cases on {RANKS} ranks: one launch per case {alone_s:.1f} s, one launch for all "
        f"{together_s:.1f} s; {differing} record keys differ"
    )


def main() -> None:
    model_parallel_runs()
    training_runs()
    finetune_runs()


if __name__ == "__main__":
    main()
