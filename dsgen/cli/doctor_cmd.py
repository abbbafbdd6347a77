"""``dsgen doctor``: will this existing DeepSpeed config fit the cluster, why not, and the fix.

Exit codes: 0 predicted to fit, 1 config errors (validation, batch assertion, Trainer mismatch),
2 bad input, 3 predicted not to fit (GPU, host or NVMe). With ``--fix -o`` the best fix is written
(atomically, never over an existing file without ``--force``) and the exit code is the fixed
config's: 0. No ``from __future__ import annotations``: typer reads these signatures.
"""

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from dsgen.errors import DsgenError, ExitCode


def doctor(
    config: Annotated[
        Path, typer.Argument(help="The DeepSpeed config the run used (JSON; comments allowed).", metavar="CONFIG")
    ],
    spec: Annotated[
        Path, typer.Option("--spec", help="Cluster spec: model, hardware, sequence length, attention.", metavar="SPEC")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
    fix: Annotated[bool, typer.Option("--fix", help="Write the best fix (needs -o).")] = False,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Where --fix writes the fixed config.", metavar="PATH")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --output file.")] = False,
    training_args: Annotated[
        Path | None,
        typer.Option(
            "--training-args", help='TrainingArguments as JSON, to resolve "auto" as the Trainer does.', metavar="PATH"
        ),
    ] = None,
    world_size: Annotated[
        int | None,
        typer.Option("--world-size", help="The launcher's world size (default: the spec's GPUs).", metavar="N"),
    ] = None,
    error: Annotated[
        str | None, typer.Option("--error", help="A PyTorch CUDA out-of-memory message to explain.", metavar="MESSAGE")
    ] = None,
    peft: Annotated[
        Path | None,
        typer.Option("--peft", help="PEFT's adapter_config.json: the LoRA adapters the run trains.", metavar="PATH"),
    ] = None,
    llamafactory: Annotated[
        Path | None,
        typer.Option(
            "--llamafactory",
            help="LLaMA-Factory's training YAML: stage, method, batch and cutoff_len.",
            metavar="PATH",
        ),
    ] = None,
    deepspeed_version: Annotated[
        str | None,
        typer.Option(
            "--deepspeed-version",
            help="The DeepSpeed release the run uses, e.g. 0.18.5 (default: the spec's training.deepspeed_version).",
            metavar="VERSION",
        ),
    ] = None,
) -> None:
    """Diagnose an existing DeepSpeed config: verdict, memory per phase, findings, ranked fixes."""
    from dsgen.api import doctor as run_doctor
    from dsgen.doctor.report import diagnosis_dict, human
    from dsgen.output import write_atomic

    if fix and output is None:
        raise DsgenError("--fix needs -o/--output: the file to write the fixed config to")
    if output is not None and not fix:
        raise DsgenError("-o/--output is only used with --fix")
    if world_size is not None and world_size < 1:
        raise DsgenError(f"--world-size must be a positive integer, got {world_size}")
    if output is not None and output.exists() and not force:
        raise DsgenError(f"{output} already exists", hint="pass --force to overwrite it")
    diagnosis = run_doctor(
        config,
        spec,
        world_size=world_size,
        training_args=training_args,
        error=error,
        deepspeed_version=deepspeed_version,
        peft=peft,
        llamafactory=llamafactory,
    )
    code = diagnosis.exit_code
    written = None
    if fix:
        assert output is not None
        if diagnosis.fixes:
            best = diagnosis.fixes[0]
            write_atomic(output, json.dumps(best.config, indent=2) + "\n", force=force)
            written = best
            code = ExitCode.OK
        elif code != ExitCode.OK:
            raise DsgenError("no plan dsgen solve finds for this spec fits; nothing written", exit_code=code)
    if as_json:
        body = diagnosis_dict(diagnosis)
        if written is not None:
            body["written"] = {"path": str(output), "fix": written.label}
        typer.echo(json.dumps(body, indent=2))
    else:
        typer.echo(human(diagnosis))
        if fix and written is None:
            typer.echo("\nnothing to fix: the config is predicted to fit; nothing written")
        if written is not None:
            typer.echo(f"\nwrote {output}: {written.label}")
            if written.script_changes:
                typer.echo("the training script must also: " + "; ".join(written.script_changes))
    if code != ExitCode.OK:
        sys.stdout.flush()
        raise typer.Exit(int(code))


COMMANDS = {"doctor": doctor}
