"""Tests of the DeepSpeed oracle harness itself (tests/ds_oracle.py, tests/ds_train_worker.py).

Every config test in the suite trusts these helpers to report DeepSpeed's real verdict, so they
are checked here against hand-written configs whose outcome is known: the in-process parse must
accept/reject exactly as DeepSpeed does at a given data-parallel size, and the torchrun worker
must really train under each ZeRO stage / precision / offload combination CI relies on, and must
surface DeepSpeed's own error text when a run fails.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_module
from tests.ds_oracle import TrainCase, TrainResult, deepspeed_verdict, parse_with_deepspeed, train_cases, train_steps
from tests.train_cases import ACCUMULATION, MICRO, RANKS, STEPS, hand_written_config, trained

pytestmark = pytest.mark.deepspeed


@pytest.fixture(scope="module")
def deepspeed() -> Any:
    """DeepSpeed, imported once for the module (skip, or fail under DSGEN_REQUIRE_ALL=1)."""
    return require_module("deepspeed")


@pytest.fixture(scope="module")
def trainer_deps(deepspeed: Any) -> None:
    """The training worker also needs transformers (imported in the ranks, checked here)."""
    require_module("transformers")


# --- in-process parse ------------------------------------------------------------------------


def test_parse_accepts_consistent_config_at_dp8(deepspeed: Any) -> None:
    cfg = parse_with_deepspeed(
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4},
        dp_size=8,
    )
    assert cfg.world_size == 8
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (
        64,
        2,
        4,
    )


def test_parse_derives_batch_from_simulated_dp(deepspeed: Any) -> None:
    # Only micro + accumulation given: DeepSpeed multiplies by its world size, so this proves the
    # simulated dp size is what DeepSpeed actually used.
    cfg = parse_with_deepspeed({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 8)
    assert cfg.train_batch_size == 48


def test_parse_rejects_inconsistent_batch_with_deepspeeds_message(deepspeed: Any) -> None:
    bad = {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}
    with pytest.raises(AssertionError, match=r"train_batch_size is not equal to .* 10 != 4 \* 2 \* 1"):
        parse_with_deepspeed(bad, dp_size=1)


def test_parse_world_size_matters(deepspeed: Any) -> None:
    # Consistent for dp 8, inconsistent for dp 4: an unpatched parse (world size 1) could not tell.
    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}
    assert deepspeed_verdict(cfg, 8) == (True, "")
    accepted, error = deepspeed_verdict(cfg, 4)
    assert not accepted
    assert error.startswith("AssertionError:") and "64 != 2 * 4 * 4" in error


def test_parse_sequence_parallel_divides_world(deepspeed: Any) -> None:
    # DeepSpeed's dp size is world / sequence_parallel_size without an mpu (reference §5.3).
    cfg = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 2}
    assert parse_with_deepspeed(cfg, dp_size=8).world_size == 8
    assert parse_with_deepspeed(cfg, dp_size=4, world_size=16).world_size == 8


def test_verdict_reports_pydantic_and_removed_key_errors(deepspeed: Any) -> None:
    base = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1}
    accepted, error = deepspeed_verdict({**base, "zero_optimization": {"stage": 2, "typo_key": 1}}, 8)
    assert not accepted
    assert error.startswith("ValidationError:") and "typo_key" in error and "extra_forbidden" in error
    accepted, error = deepspeed_verdict({**base, "elasticity": {"enabled": False}}, 8)
    assert not accepted and "Elastic training has been removed" in error


def test_parse_restores_comm_and_leaves_caller_config_alone(deepspeed: Any) -> None:
    import torch.distributed

    comm = deepspeed.comm
    before = (comm.get_world_size, comm.get_rank)
    config = {"train_batch_size": 8, "zero_optimization": {"stage": "auto"}}
    snapshot = repr(config)
    assert not torch.distributed.is_initialized()  # the parse must not need a process group
    parse_with_deepspeed(config, 8)
    with pytest.raises(AssertionError):
        parse_with_deepspeed({"train_batch_size": 3}, 8)
    assert (comm.get_world_size, comm.get_rank) == before
    assert repr(config) == snapshot


# --- real training under torchrun --------------------------------------------------------------


def _assert_trained(result: TrainResult, *, stage: int) -> None:
    assert result.returncode == 0, result.describe()
    assert len(result.losses) == STEPS, result.describe()
    assert all(math.isfinite(x) for x in result.losses), result.describe()
    # DeepSpeed ran the code path the config asked for, not a silently different one.
    assert result.info.get("zero_stage") == str(stage), result.describe()
    assert result.info.get("param_dtype") == "bfloat16", result.describe()
    assert result.info.get("dp_world_size") == str(RANKS), result.describe()
    assert result.info.get("global_steps") == str(STEPS), result.describe()


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3], ids=lambda s: f"zero{s}-bf16")
def test_train_zero_bf16(stage: int, trainer_deps: None) -> None:
    _assert_trained(trained()[f"zero{stage}-bf16"], stage=stage)


@pytest.mark.slow
def test_train_zero2_cpu_optimizer_offload(trainer_deps: None) -> None:
    result = trained()["zero2-cpu-optimizer-offload"]
    _assert_trained(result, stage=2)
    # With offload_optimizer.device=cpu DeepSpeed must swap the config's AdamW for its CPU Adam.
    assert result.info.get("optimizer") == "DeepSpeedCPUAdam", result.describe()


@pytest.mark.slow
def test_train_activation_checkpointing(trainer_deps: None) -> None:
    result = trained()["zero3-activation-checkpointing"]
    _assert_trained(result, stage=3)
    assert result.info.get("activation_checkpointing") == "True", result.describe()


@pytest.mark.slow
def test_train_failure_surfaces_deepspeed_error_and_ends_only_its_own_case(tmp_path: Path, trainer_deps: None) -> None:
    # Batch keys for 4 ranks launched on 2: the config parses, engine construction must refuse it,
    # and the result must carry DeepSpeed's message so a failing oracle test is self-explanatory.
    # A good case before it in the same launch still counts as trained; the failing one does not.
    config = hand_written_config(1)
    config["train_batch_size"] = MICRO * ACCUMULATION * 4
    good, bad = train_cases([TrainCase(hand_written_config(1), STEPS), TrainCase(config, STEPS)], tmp_path=tmp_path)
    _assert_trained(good, stage=1)
    assert bad.returncode != 0 and not bad.timed_out, bad.describe()
    assert "train_batch_size is not equal to micro_batch_per_gpu" in bad.log, bad.describe()
    assert bad.losses == [] and bad.info == {}


@pytest.mark.slow
def test_train_fp16_is_refused_clearly(tmp_path: Path, trainer_deps: None) -> None:
    config = hand_written_config(1)
    del config["bf16"]
    config["fp16"] = {"enabled": True}
    result = train_steps(config, tmp_path=tmp_path, ranks=RANKS, steps=STEPS)
    assert result.returncode != 0, result.describe()
    assert "cannot train in fp16" in result.log, result.describe()
