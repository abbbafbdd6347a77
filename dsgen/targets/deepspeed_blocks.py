"""DeepSpeed's optimizer and scheduler sections for a spec, as DeepSpeed resolves their names.

The DeepSpeed JSON's template (:mod:`dsgen.targets.render`) and each framework target's context
(:mod:`dsgen.targets.context`) read them from here: the framework targets hand on DeepSpeed's
block, with the values a framework fills itself turned into ``"auto"``.
"""

from __future__ import annotations

from typing import Any

from dsgen.estimate.optimizers import is_client_optimizer
from dsgen.spec.types import Spec

#: WarmupCosineLR's floor as a fraction of the peak lr; the HF Trainer's ``cosine_with_min_lr``
#: (``min_lr_rate``) is given the same, so both targets decay to the same lr.
COSINE_MIN_RATIO = 0.1


def optimizer_block(spec: Spec) -> dict[str, Any]:
    """DeepSpeed's optimizer section for the spec's optimizer (names as DeepSpeed resolves them)."""
    o = spec.training.optimizer
    betas = list(o.betas)
    if is_client_optimizer(o):
        # built by the training script and passed to deepspeed.initialize(optimizer=...): the
        # config names no optimizer, and ZeRO must be told to accept one it has not tested
        return {"type": None, "params": None, "untested": True}
    if o.type == "adamw":
        return {
            "type": "AdamW",
            "params": {"lr": o.lr, "betas": betas, "eps": o.eps, "weight_decay": o.weight_decay},
            "untested": False,
        }
    if o.type == "adam":
        params = {"lr": o.lr, "betas": betas, "eps": o.eps, "weight_decay": o.weight_decay, "adam_w_mode": False}
        return {"type": "Adam", "params": params, "untested": False}
    if o.type == "lion":
        return {
            "type": "Lion",
            "params": {"lr": o.lr, "betas": betas, "weight_decay": o.weight_decay},
            "untested": False,
        }
    if o.type == "adagrad":
        return {
            "type": "Adagrad",
            "params": {"lr": o.lr, "eps": o.eps, "weight_decay": o.weight_decay},
            "untested": False,
        }
    # torch.optim.SGD is outside DeepSpeed's list of ZeRO-tested optimizers
    return {
        "type": "SGD",
        "params": {"lr": o.lr, "momentum": o.momentum, "weight_decay": o.weight_decay},
        "untested": True,
    }


def scheduler_block(spec: Spec) -> dict[str, Any] | None:
    sched = spec.training.scheduler
    lr = spec.training.optimizer.lr
    warmup = sched.warmup_steps
    total = max(sched.total_steps, warmup)
    if sched.type == "none":
        return None
    if sched.type == "warmup":
        return {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr, "warmup_num_steps": warmup, "warmup_type": "linear"},
        }
    if sched.type == "warmup_cosine":
        return {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": total,
                "warmup_num_steps": warmup,
                "warmup_min_ratio": 0.0,
                "cos_min_ratio": COSINE_MIN_RATIO,
            },
        }
    return {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": 0.0,
            "warmup_max_lr": lr,
            "warmup_num_steps": warmup,
            "total_num_steps": total,
            "warmup_type": "linear",
        },
    }
