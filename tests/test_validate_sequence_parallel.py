"""``dsgen validate`` on Ulysses sequence parallelism, each verdict checked against DeepSpeed 0.19.8 itself.

``sequence_parallel_size`` enters ``DeepSpeedConfig.__init__`` (``runtime/config.py``) as a divisor of the
world size (``dist.get_world_size() / config["sequence_parallel_size"]``, the no-mpu case);
``seq_parallel_communication_data_type`` goes through ``get_communication_data_type``. The AutoEP rules
are the ones ``module_inject/auto_ep_folding.py`` ``validate_folding_global`` and ``runtime/engine.py``
``DeepSpeedEngine._validate_zero3_moe_compatibility`` raise; the tests call those functions.
"""

from __future__ import annotations

import re
import types
from typing import Any

import pytest

from dsgen.validate import validate_config
from tests.conftest import require_module

BATCH = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2}


@pytest.fixture(scope="module")
def oracle() -> Any:
    require_module("deepspeed")
    from tests import ds_oracle

    return ds_oracle


def _errors(config: dict[str, Any], **kwargs: Any) -> list[tuple[str, str, str]]:
    report = validate_config(config, **kwargs)
    return [(f.rule_id, f.pointer, f.phase) for f in report.findings if f.severity == "error"]


# value -> does DeepSpeedConfig (dist initialised, 4 ranks) raise on it?
SP_VALUES: list[tuple[Any, bool]] = [
    ("2", True),  # TypeError: int / str
    (None, True),  # TypeError: int / NoneType
    (0, True),  # ZeroDivisionError
    (-2, True),  # negative batch: 'Train batch size: ... has to be greater than 0'
    (2, False),
    (4, False),
    (2.5, False),  # a float divisor: DeepSpeedConfig goes on (dsgen still reports the non-integer)
    (True, False),  # True divides like 1
]


@pytest.mark.parametrize(("value", "rejected"), SP_VALUES, ids=[repr(v) for v, _ in SP_VALUES])
def test_sequence_parallel_size_values_agree_with_deepspeed(oracle: Any, value: Any, rejected: bool) -> None:
    config = {**BATCH, "sequence_parallel_size": value}
    accepted, error = oracle.deepspeed_verdict(config, 1, world_size=4)
    assert accepted is not rejected, error  # the table above is DeepSpeed's own verdict
    report = validate_config(config)
    assert report.rejected_by_deepspeed() is rejected, report.findings
    if value != 2 and value != 4:
        # every value that is not a positive integer is an error, config phase only where DeepSpeedConfig raises
        assert any(f.pointer == "/sequence_parallel_size" and f.severity == "error" for f in report.findings)
    else:
        assert report.ok, report.findings


COMM_VALUES: list[tuple[Any, bool]] = [
    ("fp8", True),  # ValueError: Invalid communication_data_type
    ("", True),
    (16, True),  # AttributeError: 'int' object has no attribute 'lower'
    ("fp32", False),
    ("FP16", False),  # lower-cased first
    ("bf16", False),
    (None, False),  # None: the engine falls back to its default
]


@pytest.mark.parametrize(("value", "rejected"), COMM_VALUES, ids=[repr(v) for v, _ in COMM_VALUES])
def test_seq_parallel_communication_data_type_agrees_with_deepspeed(oracle: Any, value: Any, rejected: bool) -> None:
    config = {**BATCH, "sequence_parallel_size": 2, "seq_parallel_communication_data_type": value}
    accepted, error = oracle.deepspeed_verdict(config, 2)
    assert accepted is not rejected, error
    report = validate_config(config, world_size=2)
    assert report.rejected_by_deepspeed() is rejected, report.findings
    assert (not report.ok) is rejected


def test_batch_checked_against_world_divided_by_sp(oracle: Any) -> None:
    """8 ranks, SP 4: DeepSpeed's data-parallel size is 2. A train_batch_size computed without the SP
    division (1 x 2 x 8) is refused, the one with it (1 x 2 x 2) accepted, by both."""
    sp = {"sequence_parallel_size": 4}
    without_division = {**BATCH, **sp, "train_batch_size": 16}
    with_division = {**BATCH, **sp, "train_batch_size": 4}
    accepted, error = oracle.deepspeed_verdict(without_division, 2, world_size=8)
    assert not accepted and "16 != 1 * 2 * 2.0" in error
    assert oracle.deepspeed_verdict(with_division, 2, world_size=8) == (True, "")
    report = validate_config(without_division, world_size=2)
    (finding,) = [f for f in report.findings if f.rule_id == "batch-mismatch"]
    assert finding.phase == "config" and report.rejected_by_deepspeed()
    assert "8 ranks / sequence_parallel_size 4" in finding.message
    # the hint's numbers are ones DeepSpeed accepts on these 8 ranks
    match = re.search(r"e\.g\. (\d+) = (\d+) x (\d+) x (\d+)", finding.hint or "")
    assert match, finding.hint
    tb, mb, ga, dp = (int(g) for g in match.groups())
    suggested = {**sp, "train_batch_size": tb, "train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": ga}
    assert dp == 2 and oracle.deepspeed_verdict(suggested, 2, world_size=8) == (True, "")
    assert validate_config(with_division, world_size=2).ok
    # and the other way round: the SP-divided batch is wrong once the config drops sequence_parallel_size
    no_sp = {**BATCH, "train_batch_size": 4}
    assert not oracle.deepspeed_verdict(no_sp, 8)[0]
    assert "batch-mismatch" in {f.rule_id for f in validate_config(no_sp, world_size=8).findings}


def test_train_batch_derived_with_sp_division(oracle: Any) -> None:
    """Without train_batch_size DeepSpeed derives it as micro x accumulation x world / sp."""
    config = {**BATCH, "sequence_parallel_size": 2}
    assert oracle.parse_with_deepspeed(config, 3).train_batch_size == 6
    assert validate_config(config, world_size=3).ok


AUTOEP = {"expert_parallel": {"enabled": True, "autoep_size": 2}}


def test_autoep_zero3_with_sp_is_refused_as_the_engine_does(oracle: Any) -> None:
    from deepspeed.module_inject.auto_ep_layer import AutoEPMoELayer
    from deepspeed.runtime.engine import DeepSpeedEngine

    def engine(sp: int) -> Any:
        layer = AutoEPMoELayer.__new__(AutoEPMoELayer)
        return types.SimpleNamespace(
            has_moe_layers=True,
            module=types.SimpleNamespace(named_modules=lambda: [("mlp", layer)]),
            sequence_parallel_size=sp,
            zero_quantized_gradients=lambda: False,
            _config=types.SimpleNamespace(zero_config=types.SimpleNamespace(zero_hpz_partition_size=1)),
        )

    with pytest.raises(AssertionError, match="does not support sequence parallelism"):
        DeepSpeedEngine._validate_zero3_moe_compatibility(engine(2))
    config = {**BATCH, **AUTOEP, "zero_optimization": {"stage": 3}, "sequence_parallel_size": 2}
    assert ("autoep-conflict", "/sequence_parallel_size", "engine") in _errors(config)
    for near in ({**config, "sequence_parallel_size": 1}, {**config, "zero_optimization": {"stage": 2}}):
        assert "autoep-conflict" not in {rule for rule, _, _ in _errors(near)}


def test_autoep_folding_with_sp_is_refused_as_deepspeed_does(oracle: Any) -> None:
    from deepspeed.module_inject.auto_ep_folding import build_folding_spec, validate_folding_global

    spec = build_folding_spec(world_size=4, pp_size=1, tp_size=2, ep_size=2)
    with pytest.raises(ValueError, match="mutually exclusive"):
        validate_folding_global(spec, sp_size=2)
    validate_folding_global(spec, sp_size=1)
    config = {**BATCH, **AUTOEP, "tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 2}
    assert ("autoep-conflict", "/sequence_parallel_size", "engine") in _errors(config)
    assert "autoep-conflict" not in {rule for rule, _, _ in _errors({**config, "sequence_parallel_size": 1})}
