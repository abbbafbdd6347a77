"""Write everything dsgen prints and writes for a fixed set of inputs into one directory.

A refactor that moves code without changing behaviour (issue 49: packages by stage) must leave
these files byte for byte the same. Run it before and after and compare the two directories:

    .venv/bin/python bench/output_snapshot.py /tmp/snap_before     # on the old commit
    .venv/bin/python bench/output_snapshot.py /tmp/snap_after
    diff -r /tmp/snap_before /tmp/snap_after && echo identical

What it covers, each through the installed ``dsgen`` command as a user runs it:

* every example spec (``examples/*.yaml``): ``new`` (the config alone, and a bundle for each
  target, with four launchers between them), ``solve --json``, ``solve --top 10``, ``explain`` and
  ``explain --json``;
* the doctor on every config of the corpus (``$DSGEN_CORPUS``, else ``../shared/corpus``) against
  the bundled cluster, ``--json``; and on the bundled doctor examples;
* the 1,000-run sweep of ``bench/sweep_speed.py`` (its manifest and every run's files).

Each command's stdout, stderr and exit code are kept; paths that name the snapshot directory are
written as ``<OUT>`` so that two snapshots taken in different directories compare equal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import installed_dsgen  # bench/installed_dsgen.py
from sweep_speed import BASE, SWEEP

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
#: (target, launcher) bundles written for every example: each target's templates, four launchers.
BUNDLES = (
    ("hf-trainer", "torchrun"),
    ("deepspeed", "slurm"),
    ("accelerate", "accelerate"),
    ("lightning", "kubernetes"),
)


def corpus_dir() -> Path:
    named = os.environ.get("DSGEN_CORPUS")
    return Path(named) if named else REPO.parent / "shared" / "corpus"


def commands(out: Path) -> list[tuple[str, list[str]]]:
    """(record name, arguments) for every command of the snapshot."""
    jobs: list[tuple[str, list[str]]] = []
    for spec in sorted(EXAMPLES.glob("*.yaml")):
        name = spec.stem
        jobs += [
            (f"examples/{name}/new", ["new", str(spec), "-o", str(out / "examples" / name / "ds_config.json")]),
            (f"examples/{name}/solve-json", ["solve", str(spec), "--json"]),
            (f"examples/{name}/solve-top", ["solve", str(spec), "--top", "10"]),
            (f"examples/{name}/explain", ["explain", str(spec)]),
            (f"examples/{name}/explain-json", ["explain", str(spec), "--json"]),
        ]
        for target, launcher in BUNDLES:
            bundle = out / "examples" / name / f"{target}-{launcher}"
            jobs.append(
                (
                    f"examples/{name}/new-{target}-{launcher}",
                    ["new", str(spec), "--target", target, "--launcher", launcher, "-o", f"{bundle}/"],
                )
            )
    cluster = str(EXAMPLES / "doctor" / "cluster.yaml")
    for config in sorted(corpus_dir().glob("*.json")):
        jobs.append((f"doctor-corpus/{config.stem}", ["doctor", str(config), "--spec", cluster, "--json"]))
    doctor = EXAMPLES / "doctor"
    jobs += [
        ("doctor-examples/ds_config", ["doctor", str(doctor / "ds_config.json"), "--spec", cluster]),
        ("doctor-examples/ds_z3_config", ["doctor", str(doctor / "ds_z3_config.json"), "--spec", cluster]),
        (
            "doctor-examples/ds_z2_micro8",
            ["doctor", str(doctor / "ds_z2_micro8.json"), "--spec", str(doctor / "cluster-mistral-2x4090.yaml")],
        ),
    ]
    sweep_dir = out / "sweep-input"
    jobs.append(("sweep/run", ["sweep", str(sweep_dir / "sweep.yaml"), "-o", str(out / "sweep" / "runs")]))
    return jobs


def run(out: Path, name: str, args: list[str]) -> None:
    done = subprocess.run([*installed_dsgen.command(), *args], capture_output=True, text=True)
    record = out / "records" / f"{name}.txt"
    record.parent.mkdir(parents=True, exist_ok=True)
    text = f"exit {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    record.write_text(text.replace(str(out), "<OUT>"))


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: output_snapshot.py OUT_DIR (a directory that does not exist yet)")
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True)
    (out / "sweep-input").mkdir()
    (out / "sweep-input" / "base.yaml").write_text(BASE)
    (out / "sweep-input" / "sweep.yaml").write_text(SWEEP)
    installed_dsgen.warm()
    jobs = commands(out)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda job: run(out, *job), jobs))
    # files that name the snapshot's own directory (launch scripts, manifests) compare by content
    for path in out.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            if str(out).encode() in data:
                path.write_bytes(data.replace(str(out).encode(), b"<OUT>"))
    print(f"{len(jobs)} commands recorded under {out}")


if __name__ == "__main__":
    main()
