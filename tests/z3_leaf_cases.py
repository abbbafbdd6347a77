"""The ZeRO-3 leaf-module runs, measured once per test session.

``tests/test_z3_leaf_measured.py`` checks the records against DeepSpeed's own behaviour and
``tests/test_zero3_moe_prediction.py`` checks dsgen's backward term against them. Both import
:func:`measured` from here, under this one module name: a test file imported by another test file
is loaded twice (once by pytest under its base name, once under ``tests.``), and a cache in it would
launch the same run twice.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from tests.conftest import require_module
from tests.ds_oracle import measure_case
from tests.z3_leaf_worker import RECORD_KIND, WORKER, scaled_zero_knobs

RANKS = 2

CASES: dict[str, dict[str, Any]] = {
    # leaf (the default) with gradient accumulation 2: micro-steps 0 (trace recorded), 1, 2, 3 (trace complete)
    "leaf-gas2": {"leaf": True, "gradient_accumulation_steps": 2, "steps": 2, "track_live_bytes": True},
    # no leaf module (zero_optimization.leaf_module.classes = [])
    "noleaf-gas1": {"leaf": False, "gradient_accumulation_steps": 1, "steps": 2, "track_live_bytes": False},
}

#: The CPU ops the worker's config loads (it composes its own DeepSpeed config: AdamW, no offload).
OPS = ["ShareMemCommBuilder", "FusedAdamBuilder"]


def case_for(name: str) -> dict[str, Any]:
    return {
        "dtype": "bf16",
        "micro_batch": 1,
        "seq_len": 64,
        "zero_knobs": scaled_zero_knobs(),
        "seed": 1234,
        **CASES[name],
    }


@cache
def measured(name: str) -> tuple[dict[str, Any], ...]:
    for module in ("deepspeed", "transformers"):
        require_module(module)
    records = measure_case(WORKER, RECORD_KIND, case_for(name), ranks=RANKS, timeout=900, what="z3 leaf", ops=OPS)
    return tuple(records)
