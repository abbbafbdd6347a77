"""What ZeRO-3 holds around an MoE block's gather, measured on CPU ranks (docs/zero3-leaf-measurements.md).

``tests/z3_leaf_worker.py`` trains a tiny Mixtral with the published run's proportions (8 layers,
8 experts top-2, intermediate 3.5 x hidden, GQA 4:1, lm_head 9.3 % of a block) under ZeRO-3 with the
default knobs scaled by ``tiny block / real block``, on 2 CPU ranks in bf16, and records per micro-step
the peaks of what ZeRO-3 has gathered, of the gathered storages it has released but autograd still
references, and of the full-size gradients. The checks are facts of DeepSpeed 0.19.8 + transformers
5.24 + torch 2.13; none involves dsgen:

* with the leaf module (``MixtralSparseMoeBlock``, which 0.19.8 makes a leaf by default), once the
  trace is complete: the forward copy of every MoE block but the last stays alive after ZeRO-3
  releases it (``(L-1) x experts`` elements: autograd's ``GroupedMmBackward0`` saved the transposed
  view of the gathered 3-D expert tensor); the last block, all attention projections and the
  embedding stay gathered from forward into backward (reuse distance); the block's full-size
  gradient (router included) is alive with them: ``L x experts + block + attention + embedding``;
* without a leaf module the released-but-referenced copies are the same; only the reuse-distance
  retention of attention and embedding, and the router's gradient, go away;
* gradient accumulation 2 does not change any of it; the record-mode micro-step (no trace yet)
  gathers one block at a time, but all ``L`` forward copies stay alive.

Two torchruns (tests/z3_leaf_cases.py, shared with tests/test_zero3_moe_prediction.py), 4-5 minutes on 2 cores (the worker samples after every aten op), plus a one-off
build of DeepSpeed's CPU ops outside the timeout.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from tests.z3_leaf_cases import CASES, measured
from tests.z3_leaf_worker import REAL_MIXTRAL, TINY_MIXTRAL, scaled_zero_knobs, shape_counts

L = TINY_MIXTRAL["num_hidden_layers"]
S = shape_counts(TINY_MIXTRAL)
E = S["gate_up_proj"] + S["down_proj"]  # one block's experts: what is gathered, pinned, released
B = S["block"]  # experts + router (the router is persistent, but its gradient is full-size)
A = S["attention"]
VH = S["lm_head"]  # = embedding
H = TINY_MIXTRAL["hidden_size"]


def _peak(micro: dict[str, Any], phase: str, metric: str) -> dict[str, Any]:
    return micro["peaks"][phase][metric]


def _complete(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The micro-steps that ran with a complete trace (every one after the first)."""
    micros = [m for m in record["micro_steps"] if m["index"] >= 1]
    assert micros and all(m["trace_after"] == "complete" for m in micros)
    return micros


# ---- quick: the premises ---------------------------------------------------------------------------


def test_tiny_model_has_the_real_runs_proportions() -> None:
    real = shape_counts(REAL_MIXTRAL)
    assert real["block"] == 1_409_318_912  # 8 x 3 x 4096 x 14336 + router 8 x 4096
    assert S["block"] == 5_507_072
    for part in ("attention", "lm_head", "gate_up_proj", "down_proj"):
        assert S[part] / S["block"] == pytest.approx(real[part] / real["block"], rel=0.01), part
    knobs = scaled_zero_knobs()
    scale = S["block"] / real["block"]
    assert knobs["stage3_max_live_parameters"] == round(1e9 * scale)
    assert knobs["stage3_prefetch_bucket_size"] == round(5e7 * scale)
    assert knobs["reduce_bucket_size"] == round(5e8 * scale)
    # the persistence threshold keeps the same parameters persistent: norms and routers, not k/v_proj
    kv = H * H // 4
    assert H < 8 * H <= knobs["stage3_param_persistence_threshold"] < kv
    assert 4096 < 8 * 4096 <= 1e5 < 4096 * 1024
    # the reuse-distance walk from layer 0's q_proj back to its backward use stays under the limit in both
    for shape, limit in ((S, knobs["stage3_max_reuse_distance"]), (real, 1e9)):
        q = shape["attention"] * 2 // 5  # q_proj: 2h^2 of the 5h^2/2
        walk = 16 * shape["attention"] - 2 * q + 2 * shape["lm_head"]
        assert walk < limit


@pytest.mark.deepspeed
def test_mixtral_moe_block_is_a_zero3_leaf_by_default() -> None:
    from tests.conftest import require_module

    require_module("deepspeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    classes = DeepSpeedZeroConfig(stage=3).leaf_module.classes
    assert "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock" in classes


@pytest.mark.deepspeed
def test_a_saved_view_keeps_a_released_parameters_storage() -> None:
    """ZeRO-3 releases a parameter by ``param.data = torch.empty(0)`` (partition_parameters.py
    ``free_param``). An op that saved a view of the parameter keeps the old storage; DeepSpeed's own
    linear (``LinearFunctionForZeroStage3``) saves the Parameter itself, which follows ``.data``."""
    from tests.conftest import require_module

    torch = require_module("torch")
    require_module("deepspeed")
    from deepspeed.runtime.zero.linear import zero3_linear_wrap
    from torch.multiprocessing.reductions import StorageWeakRef

    def pinned(use: Any, shape: tuple[int, ...]) -> bool:
        param = torch.nn.Parameter(torch.randn(*shape))
        x = torch.randn(6, 8, requires_grad=True)
        out = use(x, param)
        ref = StorageWeakRef(param.data.untyped_storage())
        param.data = torch.empty(0, dtype=param.dtype)
        gc.collect()
        alive = not ref.expired()
        del out
        return alive

    offs = torch.tensor([2, 3, 5, 6], dtype=torch.int32)
    grouped_mm = getattr(torch.nn.functional, "grouped_mm", None) or torch._grouped_mm
    # transformers' grouped_mm experts path: _grouped_mm(input, weight.transpose(-2, -1), offs)
    assert pinned(lambda x, w: grouped_mm(x, w.transpose(-2, -1), offs=offs), (4, 16, 8))
    # the eager experts path indexes one expert: a view too, even through DeepSpeed's linear
    assert pinned(lambda x, w: zero3_linear_wrap(x, w[0]), (4, 16, 8))
    assert pinned(lambda x, w: torch.nn.functional.linear(x, w), (16, 8))  # aten saves weight.t()
    assert not pinned(lambda x, w: zero3_linear_wrap(x, w), (16, 8))


# ---- slow: the torchrun measurements ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.deepspeed
def test_leaf_run_setup_is_the_published_one() -> None:
    for record in measured("leaf-gas2"):
        assert record["versions"]["deepspeed"] == "0.19.8"
        assert record["leaf_modules"] == [f"model.layers.{i}.mlp" for i in range(L)]
        assert record["experts_implementation"] == "grouped_mm"
        assert record["functional_linear"] == "zero3_linear_wrap"
        assert record["persistent_elements"] == L * (2 * H + 8 * H) + H  # norms and routers
        assert record["shape"]["block"] == B
        assert [m["trace_before"] for m in record["micro_steps"]] == ["invalid", "record", "complete", "complete"]
    for record in measured("noleaf-gas1"):
        assert record["leaf_modules"] == []


@pytest.mark.slow
@pytest.mark.deepspeed
def test_every_blocks_forward_copy_outlives_its_release() -> None:
    """Record mode (no trace, no prefetch): ZeRO-3 gathers one block at a time and releases each
    after its forward, yet all L forward copies are alive when the forward ends."""
    for record in measured("leaf-gas2"):
        first = record["micro_steps"][0]
        assert _peak(first, "fwd", "gathered")["value"] == E
        stale = _peak(first, "fwd", "stale")
        assert stale["value"] == L * E
        assert stale["stale_by"] == {f"layers.{i}.mlp": E for i in range(L)}


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.parametrize("name", list(CASES))
def test_complete_trace_pins_all_blocks_but_the_last(name: str) -> None:
    for record in measured(name):
        for micro in _complete(record):
            for phase in ("fwd", "bwd"):
                stale = _peak(micro, phase, "stale")
                assert stale["value"] == (L - 1) * E, (micro["index"], phase, stale)
                assert stale["stale_by"] == {f"layers.{i}.mlp": E for i in range(L - 1)}


@pytest.mark.slow
@pytest.mark.deepspeed
def test_leaf_keeps_attention_embedding_and_last_block_gathered() -> None:
    """The reuse-distance walk of a non-leaf module counts a leaf block as 0 elements (no direct
    parameters), so every attention projection and the embedding stay gathered into backward."""
    expected = {f"layers.{i}.self_attn": A for i in range(L)}
    expected |= {"embed_tokens": VH, f"layers.{L - 1}.mlp": E, "lm_head (inflight)": VH}
    for record in measured("leaf-gas2"):
        for micro in _complete(record):
            gathered = _peak(micro, "fwd", "gathered")
            assert gathered["gathered_by"] == expected
            assert gathered["value"] == E + L * A + 2 * VH > record["one_block_model_gathered"]


@pytest.mark.slow
@pytest.mark.deepspeed
def test_noleaf_releases_attention_but_keeps_the_last_block() -> None:
    for record in measured("noleaf-gas1"):
        for micro in _complete(record):
            gathered = _peak(micro, "fwd", "gathered")
            assert gathered["gathered_by"] == {f"layers.{L - 1}.mlp": E, "lm_head (inflight)": VH}
            grads = _peak(micro, "bwd", "grads")
            assert grads["value"] == E
            last = f"layers.{L - 1}.mlp"
            assert grads["grads_by"] == {last: S["gate_up_proj"], f"{last} (in bucket)": S["down_proj"]}


@pytest.mark.slow
@pytest.mark.deepspeed
def test_leaf_backward_peak_holds_l_blocks_plus_one_blocks_gradient() -> None:
    for record in measured("leaf-gas2"):
        for micro in _complete(record):
            grads = _peak(micro, "bwd", "grads")
            assert grads["grads_by"] == {f"layers.{L - 1}.mlp": B, "lm_head (in bucket)": VH, "norm (in bucket)": H}
            assert grads["grads_outside_bucket"] == B
            peak = _peak(micro, "bwd", "held_grads")
            assert peak["value"] == (L - 1) * E + E + L * A + VH + B + VH + H
            assert peak["stale"] == (L - 1) * E and peak["grads"] == B + VH + H
            # (a) + (b) alone, what ZeRO-3's own bookkeeping sees: the pinned copies are not in it
            assert _peak(micro, "bwd", "both")["value"] == E + L * A + VH + B + VH + H


@pytest.mark.slow
@pytest.mark.deepspeed
def test_gradient_accumulation_changes_nothing() -> None:
    for record in measured("leaf-gas2"):
        micros = _complete(record)
        keys = ("gathered", "stale", "grads", "both", "held_grads")
        first = {(p, k): _peak(micros[0], p, k)["value"] for p in ("fwd", "bwd") for k in keys}
        for micro in micros[1:]:
            assert {(p, k): _peak(micro, p, k)["value"] for p in ("fwd", "bwd") for k in keys} == first


@pytest.mark.slow
@pytest.mark.deepspeed
def test_allocator_view_sees_the_pinned_copies() -> None:
    """Storages allocated during the micro-step and still alive: the released-but-referenced expert
    copies are (L-1) blocks of bf16 at the backward peak, and the live total covers every element
    counted above outside the preallocated IPG bucket."""
    for record in measured("leaf-gas2"):
        for micro in _complete(record):
            live = _peak(micro, "bwd", "live_bytes")
            assert live["composition"]["released parameters' storages still referenced"] == 2 * (L - 1) * E
            held = _peak(micro, "bwd", "held_grads")
            assert live["value"] >= 2 * (held["value"] - held["grads_in_bucket"])
