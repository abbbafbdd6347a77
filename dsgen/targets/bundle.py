"""One plan rendered as every file a target and launcher need, checked, then written at once.

The DeepSpeed JSON, the framework's own file and the launch script come from one plan and one
context (:mod:`dsgen.targets.context`), so the batch numbers in them cannot disagree. The
``deepspeed`` target without a launcher stays one JSON file; everything else is a directory,
published all or nothing by :func:`dsgen.output.publish_directory`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError
from dsgen.plan import Plan
from dsgen.spec.types import Spec
from dsgen.targets import (
    ALLOWED_LAUNCHERS,
    CONFIG_FILE,
    DEEPSPEED_ENV_FILE,
    DEFAULT_LAUNCHER,
    FRAMEWORK_FILE,
    HOSTFILE,
    LAUNCH_FILE,
    LAUNCHERS,
    TARGETS,
)
from dsgen.targets.context import target_context
from dsgen.targets.finetuning_files import FINETUNING_FILES, finetuning_files
from dsgen.targets.kubernetes import KUBERNETES_LAUNCHERS, kubernetes_files
from dsgen.targets.llamafactory import llamafactory_sections
from dsgen.targets.own_script import PLACEHOLDER
from dsgen.targets.render import TARGET_TEMPLATES, Rendered, check_rendered, render_template, template_context
from dsgen.targets.requests import ResourceRequest, resource_request
from dsgen.targets.trl_cli import trl_command, trl_sections


@dataclass(frozen=True)
class Bundle:
    """Every file of one target and launcher (name -> text), the parsed DeepSpeed JSON, and
    what the user must be told: script requirements and the defaults dsgen applied."""

    target: str
    launcher: str
    files: dict[str, str]
    config: dict[str, Any]
    notes: tuple[str, ...]
    defaults: tuple[str, ...]
    request: ResourceRequest | None = None  # what the launch files ask a scheduler for

    @property
    def launch_files(self) -> tuple[str, ...]:
        """The files that start the run (launch.sh, hostfile, the Kubernetes manifests)."""
        own = {CONFIG_FILE, FRAMEWORK_FILE.get(self.target), *FINETUNING_FILES}
        return tuple(name for name in self.files if name not in own)

    @property
    def single_file(self) -> bool:
        """Written as one JSON file (the deepspeed target without a launcher), not a directory."""
        return list(self.files) == [CONFIG_FILE]

    @property
    def rendered(self) -> Rendered:
        return Rendered(target=self.target, text=self.files[CONFIG_FILE], config=self.config)


def resolve(spec: Spec, target: str | None, launcher: str | None) -> tuple[str, str]:
    """The target and launcher to use: the command line's, else the spec's, else the default."""
    chosen = target or spec.output.target
    if chosen not in TARGETS:
        raise DsgenError(f"unknown target {chosen!r}; choose one of {', '.join(TARGETS)}", path="output.target")
    how = launcher or spec.output.launcher or DEFAULT_LAUNCHER[chosen]
    if how not in LAUNCHERS:
        raise DsgenError(f"unknown launcher {how!r}; choose one of {', '.join(LAUNCHERS)}", path="output.launcher")
    if how not in ALLOWED_LAUNCHERS[chosen]:
        raise DsgenError(
            f"launcher {how} cannot start the {chosen} target",
            path="output.launcher",
            hint=f"use one of {', '.join(ALLOWED_LAUNCHERS[chosen])}",
        )
    return chosen, how


def render_bundle(
    spec: Spec,
    plan: Plan,
    target: str,
    launcher: str,
    template_dir: Path | None = None,
    *,
    request: ResourceRequest | None = None,
    job_name: str | None = None,
) -> Bundle:
    """Render and check every file of ``target`` + ``launcher`` for ``plan``.

    ``request`` is what the launch files ask a scheduler for (:func:`plan_request`; priced from the
    plan when not given); ``job_name`` names the Kubernetes objects (default: the model's name).
    """
    if request is None:
        request = plan_request(spec, plan, target)
    ctx = target_context(spec, plan, target, launcher)
    context = template_context(spec, plan, ctx, resources=request)
    files: dict[str, str] = {}
    raw = render_template(TARGET_TEMPLATES[target], context, template_dir)
    config = _parse_json(raw, TARGET_TEMPLATES[target])
    check_rendered(config, plan, target, spec.training.deepspeed_version)
    files[CONFIG_FILE] = json.dumps(config, indent=2) + "\n"
    if target in ("trl", "llamafactory"):  # their YAML carries the HF Trainer's arguments, and more
        name = "hf-trainer/training_args.json.j2"
        trainer_args = _parse_json(render_template(name, context, template_dir), name)
        if target == "trl":
            sections = trl_sections(spec, plan, trainer_args)
            context["trl"] = {"command": trl_command(spec), "placeholder": PLACEHOLDER}
        else:
            sections = llamafactory_sections(spec, plan, trainer_args)
        context["sections"] = sections
    framework = FRAMEWORK_FILE.get(target)
    if framework is not None:
        name = f"{target}/{framework}.j2"
        text = render_template(name, context, template_dir)
        if framework.endswith(".json"):
            files[framework] = json.dumps(_parse_json(text, name), indent=2) + "\n"
        else:
            _parse_yaml(text, name)
            files[framework] = text
    if target == "hf-trainer":  # PEFT's, bitsandbytes' and TRL's arguments for a fine-tuning run
        files.update({name: json.dumps(value, indent=2) + "\n" for name, value in finetuning_files(spec, plan).items()})
    if launcher != "none" and launcher not in KUBERNETES_LAUNCHERS:
        files[LAUNCH_FILE] = render_template(f"launch/{launcher}.sh.j2", context, template_dir)
    if context["files"]["hostfile"]:
        files[HOSTFILE] = render_template("launch/hostfile.j2", context, template_dir)
    if context["files"]["deepspeed_env"]:
        files[DEEPSPEED_ENV_FILE] = render_template("launch/deepspeed_env.j2", context, template_dir)
    if launcher in KUBERNETES_LAUNCHERS:
        offloads_to_nvme = "nvme" in (plan.offload_optimizer, plan.offload_param)
        nvme = spec.hardware.nvme.path if offloads_to_nvme and spec.hardware.nvme is not None else None
        name = job_name or spec.model.name or "dsgen"
        files.update(kubernetes_files(launcher, name, files, request, nvme, context["allocator_env"]))
    return Bundle(target, launcher, files, config, ctx.notes, ctx.defaults, request)


def plan_request(spec: Spec, plan: Plan, target: str) -> ResourceRequest:
    """The scheduler request for ``plan``, from its own predictions (dsgen's accounting)."""
    from dsgen.search.evaluation import evaluate

    evaluation = evaluate(spec, plan)
    return resource_request(spec, target, evaluation.memory.cpu.total, evaluation.step.total_s)


def write_bundle(bundle: Bundle, dest: Path, *, force: bool) -> list[Path]:
    """Write ``bundle`` to ``dest`` (a file for a single JSON, else a directory); returns the paths."""
    from dsgen.output import publish_directory, write_atomic

    if bundle.single_file:
        write_atomic(dest, bundle.files[CONFIG_FILE], force=force)
        return [dest]
    publish_directory(dest, bundle.files, force=force, executable=frozenset({LAUNCH_FILE}))
    return [dest / name for name in bundle.files]


def default_destination(spec: Spec, bundle: Bundle) -> str:
    """``output.path`` when there is no ``-o``: a file for one JSON, a directory the user named
    for several files (never a directory called ``ds_config.json`` by default)."""

    path = spec.output.path
    if not bundle.single_file and (not spec.names("output.path") or path.endswith(".json")):
        raise DsgenError(
            "this target writes several files: name their directory with -o DIR (or output.path: DIR)",
            path="output.path",
        )
    return path


def _parse_json(text: str, name: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DsgenError(f"template {name} produced invalid JSON: line {exc.lineno}: {exc.msg}") from None
    if not isinstance(value, dict):
        raise DsgenError(f"template {name} produced JSON that is not an object")
    return value


def _parse_yaml(text: str, name: str) -> None:
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DsgenError(f"template {name} produced invalid YAML: {exc}") from None
    if not isinstance(value, dict):
        raise DsgenError(f"template {name} produced YAML that is not a mapping")
