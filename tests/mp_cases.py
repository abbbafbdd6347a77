"""The AutoTP / AutoEP cases measured on CPU ranks, run once per test session.

``tests/test_mp_oracle_harness.py`` checks the records against the unsharded model and
``tests/test_mp_predictions.py`` checks dsgen's predictions against them; both read :func:`measured`,
so each ``torchrun`` happens once, and the cases of one launch (:func:`launch_of`) share it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from tests.conftest import require_module
from tests.mp_oracle import measure_mp_cases

TP_CASES: dict[str, tuple[dict[str, Any], int]] = {
    # the ZeRO-1 run also calls deepspeed.initialize once with train_batch_size over world // TP ranks
    "llama-tp2-z1": ({"autotp_size": 2, "zero_stage": 1, "probe_batch_world_dp": True}, 2),
    "llama-tp2-z2": ({"autotp_size": 2, "zero_stage": 2}, 2),
    # Trainer's path: tp_model_init before initialize; from_pretrained refused, built under zero.Init
    "llama-tp2-z3": ({"autotp_size": 2, "zero_stage": 3, "tp_model_init": True, "zero_init_fallback": True}, 2),
    "llama-tp2xdp2-z2-bf16": ({"autotp_size": 2, "zero_stage": 2, "dtype": "bf16"}, 4),
    # TP 2 x DP 2 at the other two stages, in fp32
    "llama-tp2xdp2-z1": ({"autotp_size": 2, "zero_stage": 1}, 4),
    "llama-tp2xdp2-z3": ({"autotp_size": 2, "zero_stage": 3, "tp_model_init": True, "zero_init_fallback": True}, 4),
}
#: the ZeRO-3 cases (built under zero.Init, as Trainer's loading path does)
TP_ZERO3_CASES = [name for name, (case, _) in TP_CASES.items() if case["zero_stage"] == 3]
EP_CASES: dict[str, tuple[dict[str, Any], int]] = {
    "qwen3moe-ep2-z2": (
        {"model": "qwen3_moe", "autoep_size": 2, "zero_stage": 2, "can_record_registry_shim": "retry"},
        2,
    ),
    "mixtral-ep2-z2": ({"model": "mixtral", "autoep_size": 2, "zero_stage": 2, "can_record_registry_shim": "retry"}, 2),
}
CASES = {**TP_CASES, **EP_CASES}
TP, EP = 2, 2


def launch_of(name: str) -> tuple[int, bool]:
    """The launch a case shares: its rank count, and whether it runs AutoTP. DeepSpeed builds the
    tensor-parallel groups once per process (``deepspeed.utils.groups._init_tp_mesh_device``), so a
    case without AutoTP after one with it would see them (tests/mp_worker.py ``_reset_process_state``)."""
    case, ranks = CASES[name]
    return ranks, "autotp_size" in case


@cache
def _measured_in(launch: tuple[int, bool]) -> dict[str, tuple[dict[str, Any], ...]]:
    """Every case of one launch, measured together (``bench/batched_launch_identity.py`` shows each
    record is what a launch of its own reports)."""
    for module in ("deepspeed", "transformers", "safetensors"):
        require_module(module)
    names = [name for name in CASES if launch_of(name) == launch]
    measured_cases = measure_mp_cases([CASES[name][0] for name in names], ranks=launch[0])
    return {name: tuple(records) for name, records in zip(names, measured_cases, strict=True)}


def measured(name: str) -> tuple[dict[str, Any], ...]:
    """Case ``name``'s record per rank."""
    return _measured_in(launch_of(name))[name]
