"""Output targets and launchers: which files ``dsgen new`` writes for a framework and a launcher.

A *target* is the program that reads the DeepSpeed JSON (DeepSpeed itself, the Hugging Face
Trainer, Accelerate, Lightning, TRL's CLI, LLaMA-Factory); a *launcher* is what starts one process per GPU on every node
(torchrun, the ``deepspeed`` launcher, ``accelerate launch``, an sbatch script, a Kubeflow
``TrainJob`` or ``PyTorchJob`` on Kubernetes, or none). The file names below are part of the output
contract: pipelines rely on them.

May import :mod:`dsgen.validate` (a rendered config is validated) and everything below it.
``lint-imports`` holds every package to its layer (pyproject.toml, ``[tool.importlinter]``).
"""

from __future__ import annotations

__all__ = [
    "ALLOWED_LAUNCHERS",
    "CONFIG_FILE",
    "DEEPSPEED_ENV_FILE",
    "DEFAULT_LAUNCHER",
    "FRAMEWORK_FILE",
    "HOSTFILE",
    "LAUNCHERS",
    "LAUNCH_FILE",
    "TARGETS",
    "allocator_env",
]

from dsgen.catalog.gpu import GpuSpec
from dsgen.facts.frameworks import TARGETS

LAUNCHERS: tuple[str, ...] = ("torchrun", "deepspeed", "accelerate", "slurm", "kubernetes", "pytorchjob", "none")

CONFIG_FILE = "ds_config.json"
LAUNCH_FILE = "launch.sh"
HOSTFILE = "hostfile"
#: The deepspeed launcher exports this file's ``NAME=value`` lines on the other nodes (its pdsh
#: runner forwards no ``PYTORCH_*`` variable of the shell: deepspeed/launcher/runner.py, ``main``).
DEEPSPEED_ENV_FILE = ".deepspeed_env"

#: What every launch file sets on NVIDIA GPUs: the CUDA caching allocator grows its segments in
#: place instead of carving fixed-size ones, so blocks freed at one size serve the next step's
#: other sizes and fragmentation does not build up near capacity. The ALST recipes launch with it
#: (ArcticTraining's sequence-parallelism README), and the long-context runs a packed spec's
#: ``tight`` verdict is read against (dsgen.search.verdict) are theirs.
_ALLOCATOR_ENV: dict[str, str] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def allocator_env(gpu: GpuSpec) -> dict[str, str]:
    """The allocator variables a launch file exports for ``gpu`` (none off NVIDIA: ROCm's
    allocator reads its own ``PYTORCH_HIP_ALLOC_CONF``, whose segment support dsgen has not checked)."""
    return dict(_ALLOCATOR_ENV) if gpu.vendor == "nvidia" else {}


#: The framework's own file next to the DeepSpeed JSON (the deepspeed target has none).
FRAMEWORK_FILE: dict[str, str] = {
    "hf-trainer": "training_args.json",
    "accelerate": "accelerate_config.yaml",
    "lightning": "lightning_trainer.json",
    "trl": "trl_config.yaml",
    "llamafactory": "llamafactory.yaml",
}

#: What each target is normally started with. ``deepspeed`` keeps today's single JSON file.
DEFAULT_LAUNCHER: dict[str, str] = {
    "deepspeed": "none",
    "hf-trainer": "torchrun",
    "accelerate": "accelerate",
    "lightning": "torchrun",
    "trl": "accelerate",
    "llamafactory": "none",
}

#: Launchers that can start each target's processes. Accelerate's config is read only by
#: ``accelerate launch``; Lightning starts under torchrun (TorchElastic environment) or srun
#: (one task per GPU, its SLURM environment), not under Accelerate or the deepspeed launcher.
#: The Kubernetes launchers (``kubernetes``: a Kubeflow Trainer TrainJob, ``pytorchjob``: a
#: training-operator PyTorchJob) start torchrun on every node, so they take torchrun's targets.
ALLOWED_LAUNCHERS: dict[str, tuple[str, ...]] = {
    "deepspeed": ("torchrun", "deepspeed", "slurm", "kubernetes", "pytorchjob", "none"),
    "hf-trainer": ("torchrun", "deepspeed", "accelerate", "slurm", "kubernetes", "pytorchjob", "none"),
    "accelerate": ("accelerate", "slurm", "none"),
    "lightning": ("torchrun", "slurm", "kubernetes", "pytorchjob", "none"),
    # TRL's CLI is itself ``accelerate launch`` of TRL's script (trl/cli/accelerate_launcher.py)
    "trl": ("accelerate", "none"),
    # llamafactory-cli starts torchrun itself (FORCE_TORCHRUN=1; NNODES, NODE_RANK on several nodes)
    "llamafactory": ("none",),
}
