"""Kubernetes manifests for a bundle: a ConfigMap of its files and a Kubeflow job that runs them.

Two launchers, one layout:

* ``kubernetes``: a Kubeflow Trainer ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``, Trainer
  v2.3) on the ``torch-distributed`` ClusterTrainingRuntime. The Trainer's torch plugin sets
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and
  ``PET_MASTER_PORT`` in the ``node`` container (``pkg/runtime/framework/plugins/torch/torch.go``),
  which torchrun reads as the defaults of its options, so the command is a bare ``torchrun``.
  Volumes and mounts go through ``runtimePatches`` (the only way to add them in v2.3; env vars of
  the ``node`` container must go in ``trainer.env`` instead, which the Trainer's webhook enforces in
  ``pkg/runtime/framework/plugins/jobset/jobset.go``).
* ``pytorchjob``: a training-operator v1 ``PyTorchJob`` (``kubeflow.org/v1``, operator v1.9): one
  ``Master`` and ``nodes - 1`` ``Worker`` replicas, each one node, container ``pytorch`` (the name
  the operator looks for). The operator sets the same ``PET_*`` variables
  (``pkg/controller.v1/pytorch/envvar.go``, ``master.go``).

The bundle's files (DeepSpeed JSON, the framework's file) go in a ConfigMap, mounted read-only at
:data:`BUNDLE_MOUNT`; the command copies them into a writable ``emptyDir`` at :data:`RUN_DIR` and
starts torchrun there, so the script finds ``ds_config.json`` by name and may write beside it as
under ``launch.sh``. ``/dev/shm`` is a memory-backed ``emptyDir``: a container's default 64 MiB is
too small for NCCL and DataLoader workers.

Each node asks for ``nvidia.com/gpu`` (requests and limits: an extended resource must have its
limit, equal to its request) and the plan's host memory request (:mod:`dsgen.targets.requests`;
no memory limit, so the kubelet does not kill a run at dsgen's estimate). The image, the training
script and its arguments are placeholders the user fills in.

The manifests are built as data and written with PyYAML rather than templated: the ConfigMap
carries the other files verbatim, and YAML's emitter quotes them correctly whatever they hold.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from dsgen.targets.requests import ResourceRequest

CONFIGMAP_FILE = "configmap.yaml"
#: The job manifest each Kubernetes launcher writes beside the ConfigMap.
JOB_FILE = {"kubernetes": "trainjob.yaml", "pytorchjob": "pytorchjob.yaml"}
KUBERNETES_LAUNCHERS = tuple(JOB_FILE)

#: Placeholders: the container image (torch, DeepSpeed, your framework and your training script)
#: and the script's path inside it.
IMAGE_PLACEHOLDER = "CHANGE_ME"
TRAIN_SCRIPT_PLACEHOLDER = "/workspace/train.py"

BUNDLE_MOUNT = "/dsgen/bundle"
RUN_DIR = "/dsgen/run"
GPU_RESOURCE = "nvidia.com/gpu"
TRAINER_RUNTIME = "torch-distributed"  # the Trainer's default torch ClusterTrainingRuntime
PATCH_MANAGER = "dsgen/launcher"  # runtimePatches[].manager: a domain-prefixed path (the webhook checks it)

# bash -c script: arguments after the script name are the training script's (``args``).
_COMMAND = (
    "set -euo pipefail\n"
    'mkdir -p "$DSGEN_RUN_DIR"\n'
    f'cp -L {BUNDLE_MOUNT}/* "$DSGEN_RUN_DIR"/\n'
    'cd "$DSGEN_RUN_DIR"\n'
    'exec torchrun "$TRAIN_SCRIPT" "$@"\n'
)
COMMAND = ["bash", "-c", _COMMAND, "dsgen-launch"]

#: A TrainJob's name must be an RFC 1035 label of at most 63 characters (the CRD's CEL rules);
#: JobSet adds ``-node-<i>`` to name the Job and its pods, so dsgen keeps names to 48.
MAX_NAME = 48
_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def k8s_name(name: str) -> str:
    """``name`` as a Kubernetes object name (RFC 1035 label, at most :data:`MAX_NAME` characters).

    A name that is already one is kept; any other is lower-cased, its other characters become
    ``-``, and a hash of the original is appended, so two run names never map to one object.
    """
    if _LABEL.match(name) and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not cleaned or not cleaned[0].isalpha():
        cleaned = "run-" + cleaned
    cleaned = cleaned[: MAX_NAME - len(digest) - 1].rstrip("-")
    return f"{cleaned}-{digest}"


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "dsgen"}


def configmap(name: str, files: dict[str, str]) -> dict[str, Any]:
    """The ConfigMap holding the bundle's files, one key per file name."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-bundle", "labels": _labels(name)},
        "data": dict(files),
    }


def _env(extra: dict[str, str]) -> list[dict[str, str]]:
    """The container's variables: the placeholders the command reads, then ``extra`` (the
    allocator setting of every launch file, dsgen.targets.allocator_env)."""
    return [
        {"name": "TRAIN_SCRIPT", "value": TRAIN_SCRIPT_PLACEHOLDER},
        {"name": "DSGEN_RUN_DIR", "value": RUN_DIR},
        *({"name": key, "value": value} for key, value in extra.items()),
    ]


def _volumes(name: str, nvme_path: str | None) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "dsgen-bundle", "configMap": {"name": f"{name}-bundle"}},
        {"name": "dsgen-run", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    if nvme_path is not None:
        # ZeRO-Infinity swaps to the node's NVMe drive at the path the DeepSpeed JSON names
        volumes.append({"name": "dsgen-nvme", "hostPath": {"path": nvme_path, "type": "Directory"}})
    return volumes


def _mounts(nvme_path: str | None) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "dsgen-bundle", "mountPath": BUNDLE_MOUNT, "readOnly": True},
        {"name": "dsgen-run", "mountPath": RUN_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if nvme_path is not None:
        mounts.append({"name": "dsgen-nvme", "mountPath": nvme_path})
    return mounts


def _resources(request: ResourceRequest) -> dict[str, Any]:
    gpus = request.gpus_per_node
    return {
        "requests": {GPU_RESOURCE: gpus, "memory": request.memory_k8s},
        "limits": {GPU_RESOURCE: gpus},
    }


def trainjob(name: str, request: ResourceRequest, nvme_path: str | None, env: dict[str, str]) -> dict[str, Any]:
    """A Kubeflow Trainer TrainJob running the bundle on the plan's nodes x GPUs."""
    mounts = _mounts(nvme_path)
    pod_patch = {"volumes": _volumes(name, nvme_path), "containers": [{"name": "node", "volumeMounts": mounts}]}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": TRAINER_RUNTIME,
            },
            "trainer": {
                "image": IMAGE_PLACEHOLDER,
                "command": COMMAND,
                "args": [],
                "env": _env(env),
                "numNodes": request.nodes,
                "numProcPerNode": request.gpus_per_node,
                "resourcesPerNode": _resources(request),
            },
            "runtimePatches": [
                {
                    "manager": PATCH_MANAGER,
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {"name": "node", "template": {"spec": {"template": {"spec": pod_patch}}}}
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


def _replica(
    name: str, request: ResourceRequest, replicas: int, nvme_path: str | None, env: dict[str, str]
) -> dict[str, Any]:
    container = {
        "name": "pytorch",
        "image": IMAGE_PLACEHOLDER,
        "command": COMMAND,
        "args": [],
        "env": _env(env),
        "resources": _resources(request),
        "volumeMounts": _mounts(nvme_path),
    }
    return {
        "replicas": replicas,
        "restartPolicy": "OnFailure",
        "template": {
            "metadata": {"labels": _labels(name)},
            "spec": {"containers": [container], "volumes": _volumes(name, nvme_path)},
        },
    }


def pytorchjob(name: str, request: ResourceRequest, nvme_path: str | None, env: dict[str, str]) -> dict[str, Any]:
    """A training-operator v1 PyTorchJob: a Master and ``nodes - 1`` Workers of one node each."""
    replicas = {"Master": _replica(name, request, 1, nvme_path, env)}
    if request.nodes > 1:
        replicas["Worker"] = _replica(name, request, request.nodes - 1, nvme_path, env)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "nprocPerNode": str(request.gpus_per_node),
            "pytorchReplicaSpecs": replicas,
        },
    }


def _dump(document: dict[str, Any], header: str) -> str:
    """YAML text of ``document``; multi-line strings (the bundle's files, the command) as literal
    blocks, so the ConfigMap reads like the files it holds."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _text)
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=120)
    return header + body


def kubernetes_files(
    launcher: str,
    name: str,
    files: dict[str, str],
    request: ResourceRequest,
    nvme_path: str | None,
    env: dict[str, str],
) -> dict[str, str]:
    """The manifests (file name -> YAML text) that run ``files`` under ``launcher``; ``nvme_path``:
    the node directory the plan offloads to (ZeRO-Infinity), mounted at the same path; ``env``:
    variables every container gets beside the placeholders."""
    job_name = k8s_name(name)
    kind = "TrainJob (Kubeflow Trainer v2)" if launcher == "kubernetes" else "PyTorchJob (training-operator v1)"
    build = trainjob if launcher == "kubernetes" else pytorchjob
    job = build(job_name, request, nvme_path, env)
    header = (
        f"# dsgen: {kind} for {request.nodes} node(s) x {request.gpus_per_node} GPU(s).\n"
        f"# Placeholders: image ({IMAGE_PLACEHOLDER}: an image with torch, DeepSpeed and your script),\n"
        f"# env TRAIN_SCRIPT (the script's path in the image) and args (the script's arguments).\n"
        f"# Memory request: {request.memory_k8s} per node, from the plan's predicted host RAM\n"
        f'# ({request.predicted_host_bytes / 2**30:.1f} GiB) plus a margin (docs/templates.md, "Resource requests").\n'
        f"# Apply with the ConfigMap: kubectl apply -f {CONFIGMAP_FILE} -f {JOB_FILE[launcher]}\n"
    )
    if nvme_path is not None:
        header += (
            f"# The plan offloads to NVMe at {nvme_path}: that node directory is mounted as a hostPath volume\n"
            "# (Pod Security's baseline and restricted levels forbid hostPath: use a local PersistentVolume there).\n"
        )
    cm_header = f"# dsgen: the bundle's files, mounted at {BUNDLE_MOUNT} by {JOB_FILE[launcher]}.\n"
    return {CONFIGMAP_FILE: _dump(configmap(job_name, files), cm_header), JOB_FILE[launcher]: _dump(job, header)}
