"""What submits a whole sweep at once: Slurm job arrays, or a kustomization of Kubernetes manifests.

* Runs with the ``slurm`` launcher get ``submit.sh``: one ``sbatch --array`` per resource shape
  (nodes x GPUs per node x tasks per node, what one allocation must share), whose memory request
  is the largest its runs need (and whose time limit is the longest, when every run has one). The
  arrays run ``array.sh``, given the shape's run names in manifest order: array task ``i`` runs the
  ``i``-th, through that run's own ``launch.sh``. ``max_parallel`` becomes each array's ``%N``
  (Slurm starts at most N of its tasks at once).
* Runs with the ``kubernetes`` or ``pytorchjob`` launcher get ``kustomization.yaml``, listing
  each run's ConfigMap and job manifest: ``kubectl apply -k runs/`` submits them all.

Both are rendered as text here (no template directory: they are the sweep's, not a target's).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from dsgen.sweeps.name_template import ARRAY_SCRIPT, KUSTOMIZATION, SUBMIT_SCRIPT
from dsgen.sweeps.runner import Outcome
from dsgen.targets.kubernetes import KUBERNETES_LAUNCHERS
from dsgen.targets.requests import ResourceRequest, slurm_duration


@dataclass(frozen=True)
class SlurmArray:
    """One job array: a resource shape and the runs it holds, in manifest order."""

    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    runs: tuple[str, ...]
    memory: str  # --mem: the largest request among the runs
    time: str | None  # --time: the longest limit, None when any run has none

    @property
    def job_name(self) -> str:
        tasks = f"-{self.tasks_per_node}tasks" if self.tasks_per_node != 1 else ""
        return f"dsgen-{self.nodes}x{self.gpus_per_node}{tasks}"


def slurm_arrays(outcomes: Iterable[Outcome]) -> list[SlurmArray]:
    """The sweep's Slurm runs grouped by shape, shapes in order of their first run."""
    groups: dict[tuple[int, int, int], list[tuple[str, ResourceRequest]]] = {}
    for outcome in outcomes:
        if outcome.launcher == "slurm" and outcome.request is not None:
            groups.setdefault(outcome.request.shape, []).append((outcome.run.name, outcome.request))
    arrays = []
    for (nodes, gpus, tasks), runs in groups.items():
        largest = max(runs, key=lambda item: item[1].memory_bytes)[1]
        limits = [request.time_limit_s for _, request in runs]
        time = None if any(t is None for t in limits) else slurm_duration(max(t for t in limits if t is not None))
        names = tuple(name for name, _ in runs)
        arrays.append(SlurmArray(nodes, gpus, tasks, names, largest.memory_slurm, time))
    return arrays


def _sbatch(array: SlurmArray, max_parallel: int | None) -> str:
    indices = f"0-{len(array.runs) - 1}" + (f"%{max_parallel}" if max_parallel else "")
    time = array.time if array.time is not None else '"$DSGEN_TIME"'
    options = [
        f"--job-name={array.job_name}",
        f"--array={indices}",
        f"--nodes={array.nodes}",
        f"--ntasks-per-node={array.tasks_per_node}",
        f"--gpus-per-node={array.gpus_per_node}",
        f"--mem={array.memory}",
        f"--time={time}",
        '--partition="$DSGEN_PARTITION"',
    ]
    runs = " \\\n  ".join(shlex.quote(name) for name in array.runs)
    return f'sbatch {" ".join(options)} \\\n  {ARRAY_SCRIPT} \\\n  {runs} \\\n  -- "$@"\n'


def submit_script(arrays: list[SlurmArray], max_parallel: int | None) -> str:
    """``submit.sh``: one ``sbatch --array`` per shape."""
    needs_time = any(array.time is None for array in arrays)
    lines = [
        "#!/usr/bin/env bash",
        "# dsgen sweep: submit every Slurm run of this sweep, one job array per resource shape",
        "# (nodes x GPUs per node x tasks per node). Task i of an array runs the i-th run listed",
        "# after array.sh, through that run's launch.sh; each array asks for the largest host",
        "# memory (--mem) and the longest time limit its runs need.",
        "#",
        "# Usage: cd <this directory> && TRAIN_SCRIPT=/path/to/train.py DSGEN_PARTITION=<partition> \\",
        "#   ./submit.sh [arguments for your script...]",
    ]
    if needs_time:
        lines.append("# DSGEN_TIME=<days-hours:minutes:seconds>: the time limit of the arrays whose runs have none")
        lines.append("# (set training.scheduler.total_steps and dsgen derives it from the predicted step time).")
    lines += [
        "# sbatch passes this environment (TRAIN_SCRIPT included) on to the jobs: --export=ALL, its default.",
        "set -euo pipefail",
        "",
        ': "${DSGEN_PARTITION:?set DSGEN_PARTITION to the partition of your cluster}"',
    ]
    if needs_time:
        lines.append(': "${DSGEN_TIME:?set DSGEN_TIME to the time limit of one run, e.g. 1-00:00:00}"')
    lines += ['cd "$(dirname "${BASH_SOURCE[0]}")"', ""]
    for array in arrays:
        lines.append(
            f"# {array.nodes} node(s) x {array.gpus_per_node} GPU(s), {array.tasks_per_node} task(s) per node:"
            f" {len(array.runs)} run(s)"
        )
        lines.append(_sbatch(array, max_parallel))
    return "\n".join(lines)


ARRAY_TEXT = """#!/usr/bin/env bash
# dsgen sweep: one task of a job array that submit.sh submits. Its arguments are the array's run
# directories, "--", then the training script's arguments; SLURM_ARRAY_TASK_ID picks the run, whose
# launch.sh then runs as if it had been submitted from the run's own directory.
set -euo pipefail

RUNS=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  RUNS+=("$1")
  shift
done
if [[ $# -gt 0 ]]; then
  shift
fi
INDEX="${SLURM_ARRAY_TASK_ID:?array.sh runs as a task of a Slurm job array (see submit.sh)}"
if (( INDEX < 0 || INDEX >= ${#RUNS[@]} )); then
  echo "array.sh: array task $INDEX, but this array has ${#RUNS[@]} run(s)" >&2
  exit 2
fi
RUN_DIR="${SLURM_SUBMIT_DIR:-$PWD}/${RUNS[$INDEX]}"
echo "array.sh: task $INDEX runs $RUN_DIR" >&2
export SLURM_SUBMIT_DIR="$RUN_DIR"
cd "$RUN_DIR"
exec bash ./launch.sh "$@"
"""


def kustomization(outcomes: Iterable[Outcome]) -> str | None:
    """``kustomization.yaml`` listing every Kubernetes run's manifests (None: there are none)."""
    resources = [
        f"{outcome.run.name}/{name}"
        for outcome in outcomes
        if outcome.launcher in KUBERNETES_LAUNCHERS
        for name in outcome.launch_files
    ]
    if not resources:
        return None
    import yaml

    body = yaml.safe_dump(
        {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": resources},
        sort_keys=False,
    )
    return "# dsgen sweep: every Kubernetes run's ConfigMap and job. Submit them all: kubectl apply -k .\n" + body


def submission_files(outcomes: list[Outcome], max_parallel: int | None = None) -> dict[str, str]:
    """The sweep-level files (name -> text) for the launchers its runs use."""
    files: dict[str, str] = {}
    arrays = slurm_arrays(outcomes)
    if arrays:
        files[SUBMIT_SCRIPT] = submit_script(arrays, max_parallel)
        files[ARRAY_SCRIPT] = ARRAY_TEXT
    manifests = kustomization(outcomes)
    if manifests is not None:
        files[KUSTOMIZATION] = manifests
    return files
