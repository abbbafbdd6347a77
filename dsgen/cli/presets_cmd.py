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
    from dsgen.reporting.text_table import text_table

    if kind is PresetKind.gpus:
        gpus = gpu_presets()
        if as_json:
            typer.echo(json.dumps({name: asdict(g) for name, g in gpus.items()}, indent=2))
            return
        rows = [
            [name, f"{g.memory_gib:.1f} GiB", "yes" if g.bf16 else "no", _bf16_peak(g), g.description]
            for name, g in gpus.items()
        ]
        typer.echo(text_table(["name", "memory", "bf16", "bf16 TFLOPS", "description"], rows, right={1, 2, 3}))
        return
    models = model_presets()
    if as_json:
        typer.echo(
            json.dumps({name: {**asdict(m), "parameters": m.parameter_count()} for name, m in models.items()}, indent=2)
        )
        return
    rows = [
        [
            name,
            m.family,
            f"{m.parameter_count() / 1e9:.2f}B",
            str(m.num_layers),
            str(m.hidden_size),
            str(m.num_attention_heads),
            str(m.num_key_value_heads),
            str(m.vocab_size),
        ]
        for name, m in models.items()
    ]
    header = ["name", "family", "params", "layers", "hidden", "heads", "kv", "vocab"]
    typer.echo(text_table(header, rows, right=set(range(2, len(header)))))


def _bf16_peak(gpu: GpuSpec) -> str:
    """The bf16 TFLOPS cell: '-' for a GPU without bf16, never another precision's peak.

    Printing the fp16 figure there made a V100 look like a 125-TFLOPS bf16 part.
    """
    return f"{gpu.peak_tflops_bf16:.0f}" if gpu.bf16 and gpu.peak_tflops_bf16 else "-"


# The commands this module provides, by the name users type (dsgen.cli registers them lazily).
COMMANDS: dict[str, Callable[..., None]] = {"presets": presets}
