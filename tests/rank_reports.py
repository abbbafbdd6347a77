"""What each rank of a multi-process test run reports back: one JSON-lines file per rank.

Why files and not stdout: torchrun's ranks share one stdout pipe, and with ``PYTHONUNBUFFERED``
(:func:`tests.ds_oracle.worker_env`) ``print`` issues its text and its newline as two writes. Under
load another rank's output lands between them, and a record parsed from lines is lost or corrupted
(issue 48: ``seen=...55842DSGEN_TP rank=2 ...`` failed the 4-rank AutoTP launch with ``2 == 4``).
A file that only one process appends to cannot interleave.

The protocol: the harness (:func:`tests.ds_oracle.run_torchrun`, :func:`tests.ds_oracle.launch_script`)
empties ``<cwd>/rank_reports`` before each launch and names it in ``DSGEN_RANK_REPORTS``; a rank calls
:func:`write` (``<kind>.rank<rank>.jsonl``, one record per line, one ``write`` per record); the test
calls :func:`read` after the launch. Standard library only: workers import this before torch, and
the tests import it without DeepSpeed installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV_VAR = "DSGEN_RANK_REPORTS"
DIRNAME = "rank_reports"
_FILE_RE = re.compile(r"^(?P<kind>.+)\.rank(?P<rank>\d+)\.jsonl$")


def directory(cwd: Path) -> Path:
    """Where a launch started in ``cwd`` collects its ranks' reports."""
    return cwd.resolve() / DIRNAME


def prepare(cwd: Path) -> dict[str, str]:
    """Empty the report directory of a launch in ``cwd`` (a report left by an earlier launch in
    the same directory must not count for this one) and return the environment entry that points
    every rank at it; torchrun and launch.sh pass the environment on to the ranks."""
    reports = directory(cwd)
    shutil.rmtree(reports, ignore_errors=True)
    reports.mkdir(parents=True)
    return {ENV_VAR: str(reports)}


def report_path(reports: Path, kind: str, rank: int) -> Path:
    """The one file rank ``rank`` appends its ``kind`` records to."""
    if not kind or "/" in kind or rank < 0:
        raise ValueError(f"bad report name: kind={kind!r} rank={rank}")
    return reports / f"{kind}.rank{rank}.jsonl"


def write(kind: str, rank: int, record: Mapping[str, Any]) -> Path | None:
    """Append ``record`` (JSON-serialisable) to this rank's ``kind`` file in the directory the
    harness named; returns the file. Run by hand, without a harness, the record goes to stdout
    instead (``<kind> <json>``) and nothing is returned."""
    line = json.dumps(dict(record), sort_keys=True) + "\n"
    named = os.environ.get(ENV_VAR)
    if not named:
        sys.stdout.write(f"{kind} {line}")
        sys.stdout.flush()
        return None
    path = report_path(Path(named), kind, rank)
    with path.open("a", encoding="utf-8") as handle:  # one writer per file: nothing to interleave with
        handle.write(line)
    return path


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The records of one report file. A last line without its newline is a record the rank did
    not finish writing (it died mid-write) and is left out; the caller's count of records then
    says what is missing. A complete line that is not a JSON object raises ``ValueError``."""
    records = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        record = json.loads(line)
        if not isinstance(record, dict):
            raise ValueError(f"rank report line is not a JSON object: {line!r}")
        records.append(record)
    return records


def read(cwd: Path, kind: str) -> list[dict[str, Any]]:
    """Every complete ``kind`` record the ranks of a launch in ``cwd`` wrote: by rank, then in the
    order each rank wrote them. Empty when none did (or the launch never started)."""
    reports = directory(cwd)
    found: list[tuple[int, Path]] = []
    if reports.is_dir():
        for path in reports.iterdir():
            match = _FILE_RE.match(path.name)
            if match and match["kind"] == kind:
                found.append((int(match["rank"]), path))
    return [record for _, path in sorted(found) for record in parse_lines(path.read_text(encoding="utf-8"))]


def trainer_record(trainer: Any) -> dict[str, Any]:
    """What an HF Trainer (or TRL trainer) ran, as its DeepSpeed engine holds it: the steps taken
    and the batch DeepSpeed checked (the launched scripts' report; duck-typed, nothing imported)."""
    engine = trainer.model_wrapped
    return {
        "global_step": trainer.state.global_step,
        "world_size": trainer.args.world_size,
        "zero_stage": engine.zero_optimization_stage(),
        "train_batch_size": engine.train_batch_size(),
        "micro": engine.train_micro_batch_size_per_gpu(),
        "accumulation": engine.gradient_accumulation_steps(),
    }
