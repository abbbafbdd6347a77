"""Render a solved plan through a Jinja2 template, then prove the result is a valid config.

One sandboxed environment with StrictUndefined is built per template directory: a template that
names a value dsgen does not provide fails loudly, naming the template, line and variable,
instead of emitting an empty string. A team's own ``--template-dir`` is searched first and
dsgen's shipped templates after it, so it may replace just one file. The rendered DeepSpeed JSON
is parsed back and checked (schema, DeepSpeed's cross-field rules, the batch invariant) before
anyone can write it to disk; the other files of a target are rendered by :mod:`dsgen.targets`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError, ExitCode
from dsgen.estimate.swap_buffers import nvme_buffers
from dsgen.facts.release import profile_of
from dsgen.plan import Plan
from dsgen.resources import template_dir
from dsgen.spec.types import Spec
from dsgen.targets import CONFIG_FILE, DEEPSPEED_ENV_FILE, FRAMEWORK_FILE, HOSTFILE, LAUNCH_FILE, allocator_env
from dsgen.targets.context import ACCELERATE_PRECISION, LIGHTNING_PRECISION, TargetContext, target_context
from dsgen.targets.long_context import long_context_templates
from dsgen.targets.requests import ResourceRequest

#: The DeepSpeed JSON's template for each target (under the template directory).
TARGET_TEMPLATES = {
    "deepspeed": "deepspeed/ds_config.json.j2",
    "hf-trainer": "hf-trainer/ds_config.json.j2",
    "accelerate": "accelerate/ds_config.json.j2",
    "lightning": "lightning/ds_config.json.j2",
    "trl": "hf-trainer/ds_config.json.j2",  # TRL's trainers are the HF Trainer's (config_reader)
    "llamafactory": "hf-trainer/ds_config.json.j2",  # and so are LLaMA-Factory's
}


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
def _environment(user_dir: Path | None = None) -> Any:
    from jinja2 import ChoiceLoader, FileSystemLoader, StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    loaders = [FileSystemLoader(str(user_dir))] if user_dir is not None else []
    env = SandboxedEnvironment(
        loader=ChoiceLoader([*loaders, FileSystemLoader(str(template_dir()))]),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        bytecode_cache=_bytecode_cache(),
    )
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    return env


def environment(user_dir: Path | None = None) -> Any:
    """The Jinja2 environment for ``user_dir`` (a team's templates) over dsgen's own."""
    if user_dir is not None and not user_dir.is_dir():
        raise DsgenError(f"template directory {user_dir} does not exist or is not a directory", path="--template-dir")
    return _environment(user_dir.resolve() if user_dir is not None else None)


def render_template(name: str, context: dict[str, Any], user_dir: Path | None = None) -> str:
    """Render template ``name``; a missing template, a syntax error or an undefined variable
    becomes one :class:`DsgenError` naming the template, its line and the variable."""
    from jinja2 import TemplateError, TemplateNotFound, TemplateSyntaxError

    env = environment(user_dir)
    try:
        return str(env.get_template(name).render(**context))
    except TemplateNotFound as exc:
        raise DsgenError(f"template {exc.name} not found in {_searched(user_dir)}") from None
    except TemplateSyntaxError as exc:
        where = exc.filename or exc.name or name
        raise DsgenError(f"template {where}, line {exc.lineno}: {exc.message}") from None
    except TemplateError as exc:
        where, line = _template_frame(exc, name)
        raise DsgenError(f"template {where}, line {line}: {exc.message or exc}") from None


def _searched(user_dir: Path | None) -> str:
    return f"{user_dir} or {template_dir()}" if user_dir is not None else str(template_dir())


def _template_frame(exc: BaseException, name: str) -> tuple[str, int | str]:
    """The innermost template file and line of ``exc``'s traceback (Jinja2 rewrites its frames
    so that they carry the template's file name and line)."""
    where: tuple[str, int | str] = (name, "?")
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.endswith(".j2"):
            where = (_template_name(filename), tb.tb_lineno)
        tb = tb.tb_next
    return where


def _template_name(filename: str) -> str:
    path = Path(filename)
    return f"{path.parent.name}/{path.name}"


def render(spec: Spec, plan: Plan, target: str = "deepspeed", template_dir: Path | None = None) -> Rendered:
    """Render the DeepSpeed JSON of ``plan`` for ``target`` and validate it; raises :class:`DsgenError` if invalid."""
    if target not in TARGET_TEMPLATES:
        raise DsgenError(
            f"unknown output target {target!r}; available: {', '.join(TARGET_TEMPLATES)}", path="output.target"
        )
    ctx = target_context(spec, plan, target, "none")
    name = TARGET_TEMPLATES[target]
    raw = render_template(name, template_context(spec, plan, ctx), template_dir)
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DsgenError(f"template {name} produced invalid JSON: {exc}") from exc
    text = json.dumps(config, indent=2) + "\n"
    check_rendered(config, plan, target, spec.training.deepspeed_version)
    return Rendered(target=target, text=text, config=config)


def template_context(
    spec: Spec, plan: Plan, ctx: TargetContext, resources: ResourceRequest | None = None
) -> dict[str, Any]:
    """The variables every template sees (documented in docs/templates.md); ``resources``: the
    scheduler request of a bundle's launch files (dsgen.targets.requests), None for the JSON alone."""
    from dsgen.targets.model_parallel import model_parallel_templates

    needs_hostfile = ctx.launcher == "deepspeed" and spec.hardware.nodes > 1
    allocator = allocator_env(spec.hardware.gpu)
    return {
        "plan": plan,
        "knobs": plan.knobs,
        "training": spec.training,
        "model": spec.model,
        "hardware": spec.hardware,
        "target": ctx.target,
        "launcher": ctx.launcher,
        "optimizer": ctx.optimizer,
        "scheduler": ctx.scheduler,
        "nvme_path": spec.hardware.nvme.path if spec.hardware.nvme else None,
        "nvme_buffers": nvme_buffers(spec.training.optimizer.type),  # the swap buffers the memory estimate priced
        "auto": ctx.auto(),
        "emits": ctx.emits(),
        "named": lambda prefix: spec.names(prefix),
        "hf_optim": ctx.hf_optim,
        "hf_scheduler": ctx.hf_scheduler,
        "accelerate_precision": ACCELERATE_PRECISION[plan.precision],
        "lightning_precision": LIGHTNING_PRECISION[plan.precision],
        "notes": list(ctx.notes),
        "resources": resources,
        "long_context": long_context_templates(spec, plan),  # Ulysses SP keys (dsgen.targets.long_context)
        "model_parallel": model_parallel_templates(spec, plan),  # AutoTP / AutoEP keys (dsgen.targets.model_parallel)
        "allocator_env": allocator,  # what launch files export (dsgen.targets.allocator_env)
        "files": {
            "ds_config": CONFIG_FILE,
            "framework": FRAMEWORK_FILE.get(ctx.target),
            "launch": LAUNCH_FILE if ctx.launcher != "none" else None,
            "hostfile": HOSTFILE if needs_hostfile else None,
            "deepspeed_env": DEEPSPEED_ENV_FILE if needs_hostfile and allocator else None,
        },
    }


def check_rendered(config: dict[str, Any], plan: Plan, target: str, deepspeed_version: str) -> None:
    """Refuse to hand out a config whose batch keys are not the plan's or that breaks the rules of
    DeepSpeed ``deepspeed_version`` (the spec's ``training.deepspeed_version``).

    A key may be absent or ``"auto"`` where the target's framework sets it; a concrete one must be
    the plan's number, whoever's template wrote it.
    """
    hint = "this is a dsgen bug (or one in your --template-dir templates); please report it with your spec"
    planned = {
        "train_batch_size": plan.deepspeed_train_batch_size,  # TP peers counted each (dsgen.plan)
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
    }
    wrong = [f"{k} {config[k]!r} (plan: {v})" for k, v in planned.items() if config.get(k, "auto") not in ("auto", v)]
    if wrong:
        raise DsgenError(
            f"the rendered config's batch keys are not the plan's: {', '.join(wrong)}",
            exit_code=ExitCode.FINDINGS,
            hint=hint,
        )
    from dsgen.validate import validate_config

    report = validate_config(  # W = world / SP, TP peers counted each
        config, world_size=plan.deepspeed_batch_world, target=target, deepspeed_version=profile_of(deepspeed_version)
    )
    if not report.ok:
        details = "; ".join(f"{f.rule_id} at {f.pointer or '/'}: {f.message}" for f in report.errors)
        raise DsgenError(f"the rendered config failed validation: {details}", exit_code=ExitCode.FINDINGS, hint=hint)
