"""Process state a DeepSpeed case leaves behind, undone so that the next case a worker runs in the
same rank processes starts as a fresh launch would (``tests/ds_oracle.measure_cases`` and
``train_cases`` run several cases per launch; ``bench/batched_launch_identity.py`` checks the
records are the same either way). Imported by the torchrun workers, before or after torch."""

from __future__ import annotations


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
