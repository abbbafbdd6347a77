"""DeepSpeed's AutoTP and AutoEP rules on a config the doctor reads, with what only the spec knows.

``dsgen validate`` checks the rules a config alone decides, at its parser profile's release
(:mod:`dsgen.validate.rules.model_parallel`). The doctor also knows the model (its MoE expert
counts, its ``model_type``, its key/value heads) and the exact release (``training.deepspeed_version``),
so it runs every rule of :func:`dsgen.facts.model_parallel.violations` and reports those the validator
cannot: the world and expert divisibility, AutoEP's supported model types, an MoE model under AutoTP
without a ``partition_config``, and the release boundaries between the validator's profiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsgen.doctor.keys import get
from dsgen.facts.model_parallel import Layout, Violation, violations
from dsgen.search.model_parallel_choices import model_facts
from dsgen.spec.types import Spec

#: Rules the validator already reports (its own ids, or the checks of dsgen.validate.rules.parallel
#: that these duplicate): the doctor does not repeat them.
VALIDATOR_REPORTS = frozenset(
    {
        "autotp-release",
        "autotp-zero3-release",
        "autoep-release",
        "autotp-ulysses",
        "autotp-batch-world",
        "autoep-zero3-conflict",
        "autoep-autotp-conflict",
    }
)


def _whole(value: Any, default: int) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def layout_of(config: Mapping[str, Any], spec: Spec, world: int) -> Layout | None:
    """The config's model-parallel layout with the spec's model and release; None without AutoTP or
    AutoEP (or with sizes that are not whole numbers, which the validator reports)."""
    tp = _whole(get(config, "tensor_parallel.autotp_size", None), 0)
    autoep = get(config, "expert_parallel.enabled", False) is True
    ep = _whole(get(config, "expert_parallel.autoep_size", None), 1)
    sp = _whole(config.get("sequence_parallel_size"), 1)
    if tp is None or ep is None or sp is None or (tp <= 1 and not autoep):
        return None
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, Mapping) else {}
    stage = _whole(zero.get("stage"), 0)
    hpz = _whole(zero.get("zero_hpz_partition_size"), 1)
    return Layout(
        world=world,
        tp=tp,
        ep=ep,
        autoep=autoep,
        sp=sp,
        zero_stage=stage or 0,
        offload_optimizer=zero.get("offload_optimizer") is not None,
        offload_param=zero.get("offload_param") is not None,
        quantized_gradients=zero.get("zero_quantized_gradients") is True,
        hpz=hpz or 1,
        release=spec.training.deepspeed_version,
        partition_config=get(config, "tensor_parallel.partition_config", None) is not None
        or get(config, "tensor_parallel.preset_model", None) is not None,
        ep_preset=get(config, "expert_parallel.preset_model", None),
        model=model_facts(spec.model),
    )


def model_parallel_violations(config: Mapping[str, Any], spec: Spec, world: int) -> tuple[Violation, ...]:
    """The rules the config breaks on the spec's model and release that the validator does not report."""
    layout = layout_of(config, spec, world)
    if layout is None:
        return ()
    return tuple(v for v in violations(layout) if v.rule not in VALIDATOR_REPORTS)
