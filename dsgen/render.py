"""Render a solved plan through a Jinja2 template, then prove the result is a valid config.

One sandboxed environment with StrictUndefined is built per process: a template that names a
value dsgen does not provide fails loudly instead of emitting an empty string. The rendered
text is parsed back as JSON and checked (schema, DeepSpeed's cross-field rules, the batch
invariant) before anyone can write it to disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from dsgen.errors import DsgenError, ExitCode
from dsgen.estimate.memory import NVME_BUFFERS
from dsgen.estimate.optimizers import is_client_optimizer
from dsgen.plan import Plan
from dsgen.resources import template_dir
from dsgen.spec.types import Spec

TARGET_TEMPLATES = {"deepspeed": "deepspeed.json.j2"}


@dataclass(frozen=True)
class Rendered:
    """A rendered, validated config: its text (what is written) and parsed form."""

    target: str
    text: str
    config: dict[str, Any]


def _bytecode_cache() -> Any:
    """Jinja2's compiled-template cache in the user's cache directory.

    Compiling the templates is a large share of a cold ``dsgen new``; Jinja2 re-checks each
    template's source checksum, so a stale cache is never used. Where no cache directory is
    writable (read-only home, sandbox), templates are simply compiled every time. That includes
    having no home at all: with HOME unset and a uid that has no passwd entry (containers run as
    an arbitrary uid), ``Path.home()`` raises RuntimeError, which must not stop a render.
    """
    import os
    from pathlib import Path

    from jinja2 import FileSystemBytecodeCache

    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dsgen" / "jinja2"
        base.mkdir(parents=True, exist_ok=True)
        probe = base / ".writable"
        probe.touch()
    except (OSError, RuntimeError):
        return None
    return FileSystemBytecodeCache(str(base))


@cache
def _environment() -> Any:
    from jinja2 import FileSystemLoader, StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    env = SandboxedEnvironment(
        loader=FileSystemLoader(str(template_dir())),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        bytecode_cache=_bytecode_cache(),
    )
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    return env


def optimizer_block(spec: Spec) -> dict[str, Any]:
    """DeepSpeed's optimizer section for the spec's optimizer (names as DeepSpeed resolves them)."""
    o = spec.training.optimizer
    betas = list(o.betas)
    if is_client_optimizer(o.type):
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
                "cos_min_ratio": 0.1,
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


def render(spec: Spec, plan: Plan, target: str = "deepspeed") -> Rendered:
    """Render ``plan`` for ``target`` and validate it; raises :class:`DsgenError` if invalid."""
    if target not in TARGET_TEMPLATES:
        raise DsgenError(
            f"unknown output target {target!r}; available: {', '.join(TARGET_TEMPLATES)}", path="output.target"
        )
    template = _environment().get_template(TARGET_TEMPLATES[target])
    context = {
        "plan": plan,
        "knobs": plan.knobs,
        "training": spec.training,
        "optimizer": optimizer_block(spec),
        "scheduler": scheduler_block(spec),
        "nvme_path": spec.hardware.nvme.path if spec.hardware.nvme else None,
        "nvme_buffers": NVME_BUFFERS,  # the swap buffers the memory estimate priced
    }
    raw = template.render(**context)
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:  # a template bug, not a user error
        raise RuntimeError(f"template {TARGET_TEMPLATES[target]} produced invalid JSON: {exc}") from exc
    text = json.dumps(config, indent=2) + "\n"
    check_rendered(config, plan, target)
    return Rendered(target=target, text=text, config=config)


def check_rendered(config: dict[str, Any], plan: Plan, target: str) -> None:
    """Refuse to hand out a config that breaks the batch invariant or DeepSpeed's rules."""
    tb = config["train_batch_size"]
    mb = config["train_micro_batch_size_per_gpu"]
    ga = config["gradient_accumulation_steps"]
    dp = plan.data_parallel_size
    if tb != mb * ga * dp:
        raise RuntimeError(f"rendered batch keys break the invariant: {tb} != {mb} * {ga} * {dp}")
    from dsgen.validate import validate_config

    report = validate_config(config, world_size=dp, target=target)
    if not report.ok:
        details = "; ".join(f"{f.rule_id} at {f.pointer or '/'}: {f.message}" for f in report.errors)
        raise DsgenError(
            f"the rendered config failed validation: {details}",
            exit_code=ExitCode.FINDINGS,
            hint="this is a dsgen bug; please report it with your spec",
        )
