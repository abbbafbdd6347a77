"""``dsgen new`` (solve, render, validate, write) and ``dsgen solve`` (report only).

No ``from __future__ import annotations`` here: typer reads these signatures on every start, and
annotations that are already objects save it compiling each string again.
"""

import json
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal

import typer

from dsgen.errors import ExitCode

SpecArg = Annotated[Path, typer.Argument(help="The spec YAML file.", show_default=False, metavar="SPEC")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Override a spec key, e.g. training.sequence_length=8192 (repeatable).",
        metavar="KEY=VALUE",
    ),
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="Price the plan for this target's training loop, as `dsgen new --target` does: deepspeed, "
        "hf-trainer, accelerate, lightning, trl or llamafactory (default: output.target).",
        metavar="TARGET",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (the output contract) instead of text.")]
FromOpt = Annotated[
    str | None,
    typer.Option(
        "--from",
        help="SPEC is this framework's own training YAML (llamafactory): model, method, lengths and batch come "
        "from it, the hardware from --spec.",
        metavar="FRAMEWORK",
    ),
]
ClusterOpt = Annotated[
    Path | None,
    typer.Option(
        "--spec",
        help="With --from: the spec with the hardware (it may hold only hardware; anything else it states wins).",
        metavar="FILE",
    ),
]


def _framework_spec_file(from_framework: str | None, cluster: Path | None) -> Path | None:
    """The --spec file of a --from run; one clear error when only one of the two is given."""
    from dsgen.errors import DsgenError

    if (from_framework is None) != (cluster is None):
        given, missing = ("--from", "--spec") if cluster is None else ("--spec", "--from")
        raise DsgenError(
            f"{given} needs {missing}", path=missing, hint="dsgen new FILE --from llamafactory --spec cluster.yaml"
        )
    return cluster


class Accounting(str, Enum):
    dsgen = "dsgen"
    deepspeed_estimator = "deepspeed-estimator"


AccountingOpt = Annotated[
    Accounting,
    typer.Option(
        "--accounting",
        help="Model-state accounting: dsgen (default) or deepspeed-estimator (DeepSpeed's own estimate_zero2/3).",
        metavar="ACCOUNTING",
    ),
]


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    for name, command in COMMANDS.items():
        app.command(name)(command)


def new(
    spec_file: SpecArg,
    overrides: SetOpt = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Where to write the config, or the directory of a multi-file target.",
            metavar="PATH",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")] = False,
    as_json: JsonOpt = False,
    accounting: AccountingOpt = Accounting.dsgen,
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="deepspeed, hf-trainer, accelerate, lightning, trl or llamafactory (default: output.target).",
            metavar="TARGET",
        ),
    ] = None,
    launcher: Annotated[
        str | None,
        typer.Option(
            "--launcher",
            help="torchrun, deepspeed, accelerate, slurm, kubernetes, pytorchjob or none (default: per target).",
            metavar="LAUNCHER",
        ),
    ] = None,
    template_dir: Annotated[
        Path | None, typer.Option("--template-dir", help="Your own templates, searched before dsgen's.", metavar="DIR")
    ] = None,
    allow_tight: Annotated[
        bool,
        typer.Option(
            "--allow-tight",
            help="Write a plan above the calibrated safe line (but below GPU capacity) when none fits below it.",
        ),
    ] = False,
    from_framework: FromOpt = None,
    cluster: ClusterOpt = None,
) -> None:
    """Solve the spec, render and validate the DeepSpeed config (and the target's files), and write them."""
    from dsgen.api import build_bundle, build_framework_bundle
    from dsgen.reporting.report import human_summary, result_dict, script_requirements
    from dsgen.targets.bundle import default_destination, write_bundle

    scope: Literal["full", "choice"] = "full" if as_json else "choice"  # the JSON carries the alternatives
    hardware = _framework_spec_file(from_framework, cluster)
    if from_framework is not None and hardware is not None:  # the user's YAML, written back with the plan
        result, bundle = build_framework_bundle(
            spec_file, from_framework, hardware, overrides or [], accounting.value, scope=scope
        )
    else:
        result, bundle = build_bundle(
            spec_file,
            overrides or [],
            accounting.value,
            target=target,
            launcher=launcher,
            template_dir=template_dir,
            allow_tight=allow_tight,
            scope=scope,
        )
    spec = result.spec
    dest = output if output is not None else _resolve_output(spec_file, default_destination(spec, bundle))
    written = write_bundle(bundle, dest, force=force)
    if as_json:
        body = result_dict(result)
        body["written"] = [str(path) for path in written]
        typer.echo(json.dumps(body, indent=2))
        return
    assert result.best is not None
    typer.echo(human_summary(result))
    typer.echo("")
    if bundle.target == "deepspeed":
        typer.echo(script_requirements(spec, result.best.plan))
    # trl and llamafactory run their frameworks' scripts, none of yours
    heading = "before launching" if bundle.target in ("trl", "llamafactory") else "script must"
    for note in bundle.notes if bundle.target != "deepspeed" else ():
        typer.echo(f"{heading}: {note}")
    for default in bundle.defaults:
        typer.echo(f"default applied: {default}")
    if bundle.request is not None and bundle.launcher in ("slurm", "kubernetes", "pytorchjob"):
        request = bundle.request
        typer.echo(
            f"requests per node: {request.gpus_per_node} GPU(s), {request.memory_text} host RAM "
            f"(predicted {request.predicted_host_bytes / 2**30:.1f} GiB + margin)"
            + (f", time {request.slurm_time}" if request.slurm_time and bundle.launcher == "slurm" else "")
        )
    typer.echo(f"wrote {dest}" if bundle.single_file else f"wrote {dest}/: {', '.join(bundle.files)}")


def _resolve_output(spec_file: Path, path: str) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else Path.cwd() / candidate


def solve(
    spec_file: SpecArg,
    overrides: SetOpt = None,
    as_json: JsonOpt = False,
    top: Annotated[int, typer.Option("--top", min=0, help="Also list the N fastest feasible plans.", metavar="N")] = 0,
    accounting: AccountingOpt = Accounting.dsgen,
    target: TargetOpt = None,
    from_framework: FromOpt = None,
    cluster: ClusterOpt = None,
) -> None:
    """Solve the spec and report the plan; nothing is written. Exit 3 when nothing fits."""
    from dsgen.api import framework_spec, load_spec, solve_for_target, solve_json
    from dsgen.estimate.throughput import STEP_TIME_TIE_BAND
    from dsgen.reporting.report import evaluation_dict, human_summary, ranked_table

    hardware = _framework_spec_file(from_framework, cluster)
    if from_framework is not None and hardware is not None:
        spec = framework_spec(spec_file, from_framework, hardware, overrides or [])
    else:
        spec = load_spec(spec_file, overrides or [])
    result, difference = solve_for_target(spec, target, accounting.value)
    if as_json:
        body = solve_json(result, difference, target_given=target is not None)
        if top:
            body["ranked"] = [evaluation_dict(e, result.spec) for e in result.ranked[:top]]
            body["tie_band"] = STEP_TIME_TIE_BAND  # relative step-time difference ranked as a tie
        typer.echo(json.dumps(body, indent=2))
    else:
        typer.echo(human_summary(result))
        if difference is not None:
            typer.echo(f"target    {difference.sentence()}")
        for alt in result.alternatives:
            typer.echo(f"  ZeRO-{alt.zero_stage}: {alt.reason}")
        if top:
            typer.echo("")
            typer.echo(ranked_table(result, top))
    if not result.feasible:
        raise typer.Exit(int(ExitCode.INFEASIBLE))


def explain(
    spec_file: SpecArg,
    overrides: SetOpt = None,
    accounting: AccountingOpt = Accounting.dsgen,
    target: TargetOpt = None,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Also write the explanation as one self-contained HTML page (charts inline, no network).",
            metavar="FILE",
        ),
    ] = None,
) -> None:
    """Explain the chosen plan: memory per term, step-time split, and why other choices lost."""
    from dsgen.api import explain_report, load_spec, solve_for_target
    from dsgen.reporting.report import explanation

    result, difference = solve_for_target(load_spec(spec_file, overrides or []), target, accounting.value)
    text = explanation(result)
    if difference is not None:
        text += f"\n\ntarget: {difference.sentence()}"
    if html is not None:
        explain_report(result, difference, text, spec_file.name, html, target_given=target is not None)
    typer.echo(text)
    if html is not None:
        typer.echo(f"wrote {html}")
    if not result.feasible:
        raise typer.Exit(int(ExitCode.INFEASIBLE))


# The commands this module provides, by the name users type (dsgen.cli registers them lazily).
COMMANDS: dict[str, Callable[..., None]] = {"new": new, "solve": solve, "explain": explain}
