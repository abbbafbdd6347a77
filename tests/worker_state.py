"""Process state a DeepSpeed case leaves behind, undone so that the next case a worker runs in the
same rank processes starts as a fresh launch would (``tests/ds_oracle.measure_cases`` and
``train_cases`` run several cases per launch; ``bench/batched_launch_identity.py`` checks the
records are the same either way). Imported by the torchrun workers, before or after torch."""

from __future__ import annotations

import gc
from collections.abc import Callable


def reset_process_state() -> None:
    """ZeRO-3's ``zero.Init`` replaces ``torch.nn.functional.linear`` with its memory-efficient
    ``zero3_linear_wrap`` for the rest of the process ("This will persist unless manually reset",
    ``runtime/zero/partition_parameters.py`` ``_enable_mem_efficient_linear``); a later ZeRO-1/2
    case would train with it and save different activations (measured: 64 to 128 KiB more)."""
    import torch
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

    original = getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
    if original is not None:
        torch.nn.functional.linear = original


def _nothing() -> None:
    pass


def run_cases(
    count: int,
    run: Callable[[int], int],
    reset: Callable[[], None] = reset_process_state,
    prepare: Callable[[], None] = _nothing,
) -> int:
    """Run cases ``0 .. count-1`` in one gloo process group, in order, and stop at the first that
    returns a non-zero status (which is returned). ``prepare`` runs once, after DeepSpeed is
    imported and before the group starts (the workers import their model classes there). After
    each case: its engine, its ZeRO optimizer and their hooks form reference cycles, so they are
    collected before the next case builds its own, and ``reset`` undoes what the case left in the
    process."""
    import deepspeed
    from deepspeed import comm as dist

    prepare()
    deepspeed.init_distributed(dist_backend="gloo")
    try:
        for index in range(count):
            status = run(index)
            gc.collect()
            reset()
            if status:
                return status
        return 0
    finally:
        # Collect the engines while the process group they hold work on is alive; left to
        # interpreter shutdown, gloo's threads can die mid-join and abort the rank ("terminate
        # called without an active exception"). Then tear the group down while the interpreter is
        # whole, on every path (see tests/hf_trainer_script.py).
        gc.collect()
        dist.destroy_process_group()
