"""Real DeepSpeed as a measurement oracle for AutoTP and AutoEP (model parallelism on CPU ranks).

:func:`measure_mp` runs ``tests/mp_worker.py`` under ``torchrun`` on DeepSpeed's CPU accelerator
(gloo, ``OMP_NUM_THREADS=1``) and returns one record per rank: what the rank holds after a few
optimizer steps (parameter elements by kind and their TP/EP-local shapes, ZeRO's partitions per
optimizer group, gradient and Adam state elements, the bytes autograd saves in one forward), the
process groups DeepSpeed built, the per-step losses and the unsharded reference model's loss on
the rank's first micro-batch. It measures only; nothing here predicts.

A ``case`` is a plain dict::

    {
        "model": "llama" | "qwen3_moe" | "mixtral",   # tiny configs in tests/tiny_models.py
        "dtype": "fp32" | "bf16",                      # bf16 through DeepSpeed's bf16 block
        "zero_stage": 1 | 2 | 3,
        "autotp_size": 2,                              # 0/1: no AutoTP block
        "autoep_size": 2,                              # 0/1: no expert_parallel block
        "batch_world": "all" | "dp",                   # train_batch_size over all ranks or world // TP
        "tp_model_init": False,                        # also call deepspeed.tp_model_init, as Trainer does
        "can_record_registry_shim": False,             # see mp_worker's docstring (AutoEP + transformers 5.24)
        "micro_batch": 2, "seq_len": 32, "gradient_accumulation_steps": 1, "steps": 2,
        "ds_config_overrides": {...},                  # deep-merged into the composed DeepSpeed config
    }

Like ``tests/finetune_oracle.py`` this is a support module: torch, DeepSpeed and transformers are
only imported by the worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.ds_oracle import measure_cases, merge_config

WORKER = Path(__file__).resolve().parent / "mp_worker.py"
RECORD_KIND = "DSGEN_MP"  # keep in sync with mp_worker.RECORD_KIND

#: Keys every record carries (the harness test checks them).
RECORD_KEYS = (
    "rank",
    "world_size",
    "versions",
    "groups",
    "param_elements",
    "params_by_kind",
    "param_shapes",
    "reference_params_by_kind",
    "reference_loss",
    "zero_groups",
    "optimizer_state_elements",
    "gradient_partition_elements",
    "saved_activation_bytes",
    "losses",
)

DEFAULT_CASE: dict[str, Any] = {
    "model": "llama",
    "dtype": "fp32",
    "zero_stage": 1,
    "autotp_size": 0,
    "autoep_size": 0,
    "batch_world": "all",
    "tp_model_init": False,
    "can_record_registry_shim": False,
    "micro_batch": 2,
    "seq_len": 32,
    "gradient_accumulation_steps": 1,
    "steps": 2,
    "seed": 1234,
    "learning_rate": 1e-3,
    "weight_decay": 0.0,
}


def ds_config_for(case: dict[str, Any], ranks: int) -> dict[str, Any]:
    """The DeepSpeed config a run of ``case`` on ``ranks`` processes uses.

    AdamW from DeepSpeed's ``optimizer`` block, the ZeRO stage with DeepSpeed's defaults otherwise,
    bf16 through the ``bf16`` block, no clipping, no scheduler; ``tensor_parallel.autotp_size`` and
    the ``expert_parallel`` block when the case asks for them. ``train_batch_size`` is
    ``micro * accumulation * W`` with W = ``ranks`` (``batch_world="all"``, what DeepSpeedConfig
    asserts when ``deepspeed.initialize`` gets no mpu) or ``ranks // autotp_size`` (``"dp"``, the
    data-parallel width). ``ds_config_overrides`` is deep-merged last.
    """
    if case["dtype"] not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be fp32 or bf16, got {case['dtype']!r}")
    micro = int(case["micro_batch"])
    accumulation = int(case["gradient_accumulation_steps"])
    tp = int(case.get("autotp_size") or 0)
    ep = int(case.get("autoep_size") or 0)
    if case["batch_world"] == "all":
        width = ranks
    elif case["batch_world"] == "dp":
        width = ranks // max(tp, 1)
    else:
        raise ValueError(f"batch_world must be 'all' or 'dp', got {case['batch_world']!r}")
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": micro * accumulation * width,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": float(case["learning_rate"]), "weight_decay": float(case["weight_decay"])},
        },
        "zero_optimization": {"stage": int(case["zero_stage"])},
        "bf16": {"enabled": case["dtype"] == "bf16"},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    if tp > 1:
        config["tensor_parallel"] = {"autotp_size": tp}
    if ep > 1:
        config["expert_parallel"] = {"enabled": True, "autoep_size": ep}
    return merge_config(config, case.get("ds_config_overrides", {}))


def measure_mp(case: dict[str, Any], ranks: int = 2, timeout: float = 600) -> list[dict[str, Any]]:
    """Run ``case`` on ``ranks`` CPU ranks with real DeepSpeed; one measured record per rank:
    :func:`measure_mp_cases` with one case."""
    return measure_mp_cases([case], ranks=ranks, timeout=timeout)[0]


def measure_mp_cases(cases: list[dict[str, Any]], ranks: int = 2, timeout: float = 600) -> list[list[dict[str, Any]]]:
    """Run every case in one launch on ``ranks`` CPU ranks with real DeepSpeed; per case, one
    measured record per rank. Missing case keys take :data:`DEFAULT_CASE`'s values. Launched and
    read by :func:`tests.ds_oracle.measure_cases` (which raises ``OracleRunError`` with the log tail)."""
    full_cases = []
    for case in cases:
        full_case = {**DEFAULT_CASE, **case}
        full_case["ds_config"] = ds_config_for(full_case, ranks)
        full_cases.append(full_case)
    return measure_cases(WORKER, RECORD_KIND, full_cases, ranks=ranks, timeout=timeout, what="model-parallel")
