"""What a cluster scheduler is asked for: nodes, GPUs, host memory and (when known) wall time.

The numbers come from the plan's predictions, so the scheduler places the job where it fits:

* **Host memory** per node is the predicted host RAM (``memory.cpu.total``: the ranks' process
  footprint plus the larger of the model-loading copies and the offloaded states,
  :func:`dsgen.estimate.memory.host_bytes`) divided by ``1 - HOST_RESERVE``. The solver accepts a
  plan only when its prediction is at most ``1 - HOST_RESERVE`` (90 %) of the node's RAM, keeping
  10 % for the OS, the page cache and data-loader workers, which the prediction does not count
  (docs/memory-model.md, "Host RAM"). Requesting the same share on top of the prediction covers what
  the prediction leaves out, and keeps the request within the node the spec describes: a feasible
  plan never asks for more than ``hardware.cpu_memory_gib``. The request is rounded up to whole GiB
  and capped at the node's RAM.
* **Wall time** is known only when the spec names the run's length
  (``training.scheduler.total_steps``): the predicted step time times the steps, times
  :data:`TIME_FACTOR`, plus :data:`STARTUP_S`. Otherwise the scheduler's limit stays a placeholder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsgen.estimate.memory import HOST_RESERVE
from dsgen.spec.types import Spec
from dsgen.units import GIB

MIB = 1024 * 1024

#: Share of the request above the prediction, as a share of the request (see the module docstring).
MEMORY_MARGIN = HOST_RESERVE

#: Measured step time was up to 2.5 x the prediction (predicted/measured 0.40 at worst over the 15
#: runs of docs/prediction-accuracy.md, "Step time"); a limit below that would kill such runs.
TIME_FACTOR = 2.5
#: Allowance for what precedes the first step: loading the model, building DeepSpeed's engine and
#: its JIT-compiled ops. Not a measured figure; an hour is generous for one node's start-up.
STARTUP_S = 3600


@dataclass(frozen=True)
class ResourceRequest:
    """One run's request to a scheduler, per node unless named otherwise."""

    nodes: int
    gpus_per_node: int
    tasks_per_node: int  # Slurm tasks per node: one per GPU for Lightning (srun ranks), else one
    predicted_host_bytes: int  # the plan's predicted host RAM per node
    memory_bytes: int  # requested host RAM per node: a whole number of MiB, >= predicted_host_bytes
    time_limit_s: int | None  # wall-clock limit, whole minutes; None: the spec gives no step count

    @property
    def shape(self) -> tuple[int, int, int]:
        """What a job array must share: nodes, GPUs per node, tasks per node."""
        return (self.nodes, self.gpus_per_node, self.tasks_per_node)

    @property
    def memory_k8s(self) -> str:
        """The request as a Kubernetes quantity (``480Gi``, or ``491520Mi`` when capped)."""
        return _with_unit(self.memory_bytes, "Gi", "Mi")

    @property
    def memory_slurm(self) -> str:
        """The request as Slurm's ``--mem`` value (Slurm's G and M are binary: GiB and MiB)."""
        return _with_unit(self.memory_bytes, "G", "M")

    @property
    def memory_text(self) -> str:
        """The request for people (``767 GiB``)."""
        return _with_unit(self.memory_bytes, " GiB", " MiB")

    @property
    def slurm_time(self) -> str | None:
        """``--time`` as Slurm's ``days-hours:minutes:seconds``."""
        return None if self.time_limit_s is None else slurm_duration(self.time_limit_s)


def _with_unit(nbytes: int, gib_unit: str, mib_unit: str) -> str:
    return f"{nbytes // GIB}{gib_unit}" if nbytes % GIB == 0 else f"{nbytes // MIB}{mib_unit}"


def memory_request_bytes(predicted_host_bytes: int, capacity_bytes: int) -> int:
    """Host RAM to request per node for a plan predicted to need ``predicted_host_bytes``."""
    wanted = math.ceil(predicted_host_bytes / (1 - MEMORY_MARGIN) / GIB) * GIB
    capped = min(wanted, capacity_bytes // MIB * MIB)
    return max(capped, math.ceil(predicted_host_bytes / MIB) * MIB)


def time_limit_s(step_time_s: float, steps: int) -> int:
    """The wall-clock limit for ``steps`` optimizer steps of ``step_time_s`` predicted seconds."""
    seconds = steps * step_time_s * TIME_FACTOR + STARTUP_S
    return math.ceil(seconds / 60) * 60


def slurm_duration(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def resource_request(spec: Spec, target: str, predicted_host_bytes: int, step_time_s: float) -> ResourceRequest:
    """The request for one plan on ``spec``'s cluster from the plan's predictions."""

    hardware = spec.hardware
    steps = spec.training.scheduler.total_steps if spec.names("training.scheduler.total_steps") else None
    return ResourceRequest(
        nodes=hardware.nodes,
        gpus_per_node=hardware.gpus_per_node,
        tasks_per_node=hardware.gpus_per_node if target == "lightning" else 1,
        predicted_host_bytes=predicted_host_bytes,
        memory_bytes=memory_request_bytes(predicted_host_bytes, hardware.cpu_memory_bytes),
        time_limit_s=None if steps is None else time_limit_s(step_time_s, steps),
    )
