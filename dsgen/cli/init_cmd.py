"""``dsgen init``: write a commented starter spec, the first step before ``dsgen new``."""

from pathlib import Path
from typing import Annotated

import typer

from dsgen.intake.starter import DEFAULT_PATH, StarterOptions

DEFAULT = StarterOptions()


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
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter spec that loads and solves as it is; edit it, then run dsgen new."""
    from dsgen.api import write_starter_spec

    options = StarterOptions(gpu=gpu, model=model, gpus_per_node=gpus_per_node, nodes=nodes)
    write_starter_spec(path, options, force=force)
    typer.echo(f"wrote {path}; next: dsgen new {path}")


# The commands this module provides, by the name users type (dsgen.cli registers them lazily).
COMMANDS = {"init": init}
