"""``dsgen presets gpus|models``: list the bundled presets."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from dsgen.catalog.gpu import GpuSpec


class PresetKind(str, Enum):
    gpus = "gpus"
    models = "models"


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    for name, command in COMMANDS.items():
        app.command(name)(command)


def presets(
    kind: Annotated[
        PresetKind, typer.Argument(help="Which presets to list: gpus or models.", metavar="KIND", show_default=False)
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the GPU or model presets that specs can name."""
    from dsgen.catalog.presets import gpu_presets, model_presets

    if kind is PresetKind.gpus:
        gpus = gpu_presets()
        if as_json:
            typer.echo(json.dumps({name: asdict(g) for name, g in gpus.items()}, indent=2))
            return
        typer.echo(f"{'name':<16} {'memory':>9} {'bf16':>5} {'bf16 TFLOPS':>12}  description")
        for name, g in gpus.items():
            typer.echo(
                f"{name:<16} {g.memory_gib:>6.1f} GiB {'yes' if g.bf16 else 'no':>5} {_bf16_peak(g):>12}  {g.description}"
            )
        return
    models = model_presets()
    if as_json:
        typer.echo(
            json.dumps({name: {**asdict(m), "parameters": m.parameter_count()} for name, m in models.items()}, indent=2)
        )
        return
    typer.echo(
        f"{'name':<16} {'family':<9} {'params':>9} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>3} {'vocab':>7}"
    )
    for name, m in models.items():
        typer.echo(
            f"{name:<16} {m.family:<9} {m.parameter_count() / 1e9:>8.2f}B {m.num_layers:>6} {m.hidden_size:>6} "
            f"{m.num_attention_heads:>5} {m.num_key_value_heads:>3} {m.vocab_size:>7}"
        )


def _bf16_peak(gpu: GpuSpec) -> str:
    """The bf16 TFLOPS cell: '-' for a GPU without bf16, never another precision's peak.

    Printing the fp16 figure there made a V100 look like a 125-TFLOPS bf16 part.
    """
    return f"{gpu.peak_tflops_bf16:.0f}" if gpu.bf16 and gpu.peak_tflops_bf16 else "-"


# The commands this module provides, by the name users type (dsgen.cli registers them lazily).
COMMANDS: dict[str, Callable[..., None]] = {"presets": presets}
