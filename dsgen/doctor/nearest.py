"""Where the doctor leads when no plan fits: the nearest plans, what each lacks, and how many GPUs
of the same kind would make the run fit.

"Add GPUs or nodes" is no answer for a run that misses by 1.3 GiB, or whose nearest plan is short
of host RAM rather than GPU memory. The solver's search already priced the plans that came
closest (the closest miss, and the nearest plan of each ZeRO stage, offload choice and AutoTP /
AutoEP layout), so the doctor shows a few of them, each with its shortfall in the unit the user
can act on: GiB of GPU memory over the limit, GiB of host RAM over what a node can use, GiB of
NVMe. How many GPUs would do is found by asking the solver's own feasibility test
(:func:`dsgen.search.solver.fits_any`) at larger node counts of the same node, smallest first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from dsgen.errors import DsgenError
from dsgen.search.evaluation import Evaluation
from dsgen.search.ranking import rank_key
from dsgen.search.solver import SolveResult, fits_any, solve
from dsgen.spec.types import Spec

#: How many of the nearest plans the doctor shows (each a different structure).
NEAREST = 3

#: The largest cluster the doctor tries when looking for the GPUs that would make a run fit, as a
#: multiple of the spec's own node count (the search stops at the first count that fits).
MAX_SCALE = 16


@dataclass(frozen=True)
class NearMiss:
    """One plan that does not fit, and by how much it misses each limit (bytes; 0 where it fits)."""

    evaluation: Evaluation
    gpu_short: int  # predicted GPU peak minus the limit (capacity x (1 - memory_headroom))
    host_short: int  # predicted host RAM per node minus what a node can use
    nvme_short: int  # NVMe per node beyond the declared capacity

    @property
    def kernel_limit(self) -> str | None:
        """A kernel's own limit the plan hits whatever the memory (then no GiB would do)."""
        return self.evaluation.kernel_limit


@dataclass(frozen=True)
class MoreGpus:
    """The smallest cluster of the spec's own nodes on which the run fits, and its best plan."""

    nodes: int
    world_size: int
    evaluation: Evaluation


def near_miss(evaluation: Evaluation) -> NearMiss:
    """What ``evaluation`` lacks, per resource, in bytes."""
    memory = evaluation.memory
    return NearMiss(
        evaluation,
        gpu_short=max(0, memory.gpu.total - evaluation.usable_gpu_bytes),
        host_short=max(0, memory.cpu.total - evaluation.usable_cpu_bytes),
        nvme_short=max(0, memory.nvme.total - memory.nvme.capacity),
    )


def _structure(evaluation: Evaluation) -> tuple[object, ...]:
    """What makes two plans different structures to a user: stage, offload, model and sequence
    parallelism, recomputation (not the micro-batch or the ZeRO knobs)."""
    p = evaluation.plan
    return (
        p.zero_stage,
        p.offload_optimizer,
        p.offload_param,
        p.offload_ratio if p.offload_optimizer != "none" else 1.0,
        p.model_parallel,
        p.long_context,
        p.checkpointing,
    )


def nearest_plans(result: SolveResult, count: int = NEAREST) -> tuple[NearMiss, ...]:
    """The ``count`` plans of different structures that miss by least (the solver's own measure,
    :meth:`Evaluation.shortfall`), from what the search already priced: its closest miss and the
    nearest plan of each stage, offload choice and model-parallel layout."""
    pool = [
        result.closest,
        *(a.evaluation for a in result.alternatives),
        *(e for _, e, _ in result.offload_alternatives),
        *(e for _, e, _ in result.model_parallel_alternatives),
    ]
    misses = sorted((e for e in pool if e is not None and not e.feasible), key=lambda e: (e.shortfall(), rank_key(e)))
    chosen: dict[tuple[object, ...], Evaluation] = {}
    for evaluation in misses:
        chosen.setdefault(_structure(evaluation), evaluation)
    return tuple(near_miss(e) for e in list(chosen.values())[:count])


def more_gpus(spec: Spec, search_at: Callable[[Spec], Spec]) -> MoreGpus | None:
    """The fewest nodes like the run's (``spec``'s hardware: each with its GPUs and host RAM) on
    which the doctor's search finds a plan that fits, and that plan; None when no count up to
    :data:`MAX_SCALE` times as many does (the global batch may not split over that many ranks).
    ``search_at`` turns the run's spec on a larger cluster into the spec the doctor searches there."""
    hardware = spec.hardware
    for nodes in range(hardware.nodes + 1, hardware.nodes * MAX_SCALE + 1):
        larger = replace(spec, hardware=replace(hardware, nodes=nodes))
        try:
            search = search_at(larger)
            if not fits_any(search):
                continue
            result = solve(search)
        except DsgenError:  # no batch split on this many ranks: a later count may have one
            continue
        if result.best is not None and result.feasible:
            return MoreGpus(nodes, larger.hardware.world_size, result.best)
    return None
