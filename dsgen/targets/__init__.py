"""Output targets and launchers: which files ``dsgen new`` writes for a framework and a launcher.

A *target* is the program that reads the DeepSpeed JSON (DeepSpeed itself, the Hugging Face
Trainer, Accelerate, Lightning); a *launcher* is what starts one process per GPU on every node
(torchrun, the ``deepspeed`` launcher, ``accelerate launch``, an sbatch script, a Kubeflow
``TrainJob`` or ``PyTorchJob`` on Kubernetes, or none). The file names below are part of the output
contract: pipelines rely on them.
"""

from __future__ import annotations

__all__ = [
    "ALLOWED_LAUNCHERS",
    "CONFIG_FILE",
    "DEFAULT_LAUNCHER",
    "FRAMEWORK_FILE",
    "HOSTFILE",
    "LAUNCHERS",
    "LAUNCH_FILE",
    "TARGETS",
]

#: Programs that read the DeepSpeed JSON (dsgen.validate.targets knows which "auto" each fills).
TARGETS: tuple[str, ...] = ("deepspeed", "hf-trainer", "accelerate", "lightning")

LAUNCHERS: tuple[str, ...] = ("torchrun", "deepspeed", "accelerate", "slurm", "kubernetes", "pytorchjob", "none")

CONFIG_FILE = "ds_config.json"
LAUNCH_FILE = "launch.sh"
HOSTFILE = "hostfile"

#: The framework's own file next to the DeepSpeed JSON (the deepspeed target has none).
FRAMEWORK_FILE: dict[str, str] = {
    "hf-trainer": "training_args.json",
    "accelerate": "accelerate_config.yaml",
    "lightning": "lightning_trainer.json",
}

#: What each target is normally started with. ``deepspeed`` keeps today's single JSON file.
DEFAULT_LAUNCHER: dict[str, str] = {
    "deepspeed": "none",
    "hf-trainer": "torchrun",
    "accelerate": "accelerate",
    "lightning": "torchrun",
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
}
