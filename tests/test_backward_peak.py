"""The rebuilt layer's backward working set against the bytes a real backward holds.

Runs bench/backward_peak_accuracy.py's measurement (every storage an operator creates in forward
and backward, counted while it lives) on a tiny Llama and Qwen3 with transformers' reentrant
gradient checkpointing, DeepSpeed's TiledMLP and checkpoint offload, in fp32 and bf16, and
compares it with dsgen's ``transient`` for the same plan. A change to transformers, DeepSpeed's
TiledMLP or torch's checkpoint that moves these bytes fails here.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.conftest import single_threaded_bench


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    yield from single_threaded_bench("backward_peak_accuracy", "torch", "transformers", "deepspeed")


# (family, precision, sequence, tiled MLP, checkpoint offload): each backward phase that peaks
CASES = [
    ("llama", "bf16", 512, False, False),  # the MLP phase
    ("llama", "fp32", 512, False, True),  # the MLP phase, one checkpoint brought back
    ("qwen3", "bf16", 1024, True, False),  # the post-attention norm's phase
    ("llama", "fp32", 512, True, True),  # a TiledMLP shard's phase
]


@pytest.mark.parametrize(("family", "precision", "sequence", "tiled_mlp", "offload"), CASES)
def test_rebuilt_layer_working_set_matches_a_real_backward(
    bench: ModuleType, family: str, precision: str, sequence: int, tiled_mlp: bool, offload: bool
) -> None:
    measured = bench.measure(family, sequence, tiled_mlp, offload, precision=precision)
    predicted, loss_term = bench.predict(family, sequence, tiled_mlp, offload, precision=precision)
    assert loss_term < predicted  # the transient is the rebuilt layer, not the loss
    assert predicted == pytest.approx(measured, rel=0.01)


# (family, precision, sequence, tiled MLP, config overrides): the stage that peaks differs by case
FORWARD_CASES = [
    ("llama", "bf16", 512, False, {}),  # the untiled MLP
    ("qwen3", "bf16", 1024, True, {}),  # the q norm's fp32 upcast (the MLP is tiled)
    ("llama", "fp32", 1024, True, {}),  # rotary embedding beside q, k, v
    # a shape the bench does not run: wide attention, 2 kv heads, a narrow MLP, tiled
    ("llama", "bf16", 2048, True, {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32}),
]


@pytest.mark.parametrize(("family", "precision", "sequence", "tiled_mlp", "overrides"), FORWARD_CASES)
def test_checkpointed_layer_forward_matches_a_real_forward(
    bench: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    family: str,
    precision: str,
    sequence: int,
    tiled_mlp: bool,
    overrides: dict[str, int],
) -> None:
    monkeypatch.setitem(bench.MODELS, family, {**bench.MODELS[family], **overrides})
    measured = bench.measure_forward(family, sequence, tiled_mlp, precision)
    predicted = bench.predict_forward(family, sequence, tiled_mlp, precision)
    assert predicted == pytest.approx(measured, rel=0.01)
