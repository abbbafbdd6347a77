"""``dsgen init``: write a commented starter spec, the first step before ``dsgen new``."""

from enum import Enum
from pathlib import Path
from typing import Annotated, get_args

import typer

from dsgen.intake.starter import DEFAULT_PATH, StarterOptions
from dsgen.vocabulary import FineTuningMethod, Objective

DEFAULT = StarterOptions()
# the choices typer offers (and completes), from the vocabulary's one list of each
Method = Enum("Method", {value: value for value in get_args(FineTuningMethod)}, type=str)  # type: ignore[misc]
Goal = Enum("Goal", {value: value for value in get_args(Objective)}, type=str)  # type: ignore[misc]
DEFAULT_METHOD, DEFAULT_GOAL = Method(DEFAULT.finetuning), Goal(DEFAULT.objective)


def _choices(enum: type[Enum]) -> str:
    return ", ".join(member.value for member in enum)


def init(
    path: Annotated[Path, typer.Argument(help="Where to write the spec.", show_default=True, metavar="PATH")] = Path(
        DEFAULT_PATH
    ),
    gpu: Annotated[str, typer.Option("--gpu", help="GPU preset (dsgen presets gpus).", metavar="NAME")] = DEFAULT.gpu,
    model: Annotated[
        str, typer.Option("--model", help="Model preset (dsgen presets models).", metavar="NAME")
    ] = DEFAULT.model,
    gpus_per_node: Annotated[
        int, typer.Option("--gpus-per-node", min=1, help="GPUs per node.", metavar="N")
    ] = DEFAULT.gpus_per_node,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Number of nodes.", metavar="N")] = DEFAULT.nodes,
    finetuning: Annotated[
        Method,
        typer.Option("--finetuning", help=f"Which parameters train: {_choices(Method)}.", metavar="METHOD"),
    ] = DEFAULT_METHOD,
    objective: Annotated[
        Goal,
        typer.Option(
            "--objective",
            help=f"The training objective: {_choices(Goal)}.",
            metavar="OBJECTIVE",
        ),
    ] = DEFAULT_GOAL,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter spec that loads and solves as it is; edit it, then run dsgen new."""
    from dsgen.api import write_starter_spec

    options = StarterOptions(
        gpu=gpu,
        model=model,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        finetuning=finetuning.value,
        objective=objective.value,
    )
    write_starter_spec(path, options, force=force)
    typer.echo(f"wrote {path}; next: dsgen new {path}")


# The commands this module provides, by the name users type (dsgen.cli registers them lazily).
COMMANDS = {"init": init}
