"""A framework's own training YAML read as a spec (LLaMA-Factory's): what ``new``/``solve --from
llamafactory`` plan from, and what ``doctor --llamafactory`` fills a bare spec with.

The YAML states the model (``model_name_or_path``), the sequence (``cutoff_len``), the precision, the
method and objective (:func:`dsgen.doctor.method_files.llamafactory_inputs`, checked key by key) and
the batch. Each becomes a spec override (``key=value``, as ``--set`` writes them) for a key the spec
file does not state: the spec, often just the cluster's hardware, wins over the YAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsgen.doctor.method_files import llamafactory_inputs
from dsgen.errors import DsgenError
from dsgen.inputs import read_text
from dsgen.spec.defaults import spec_default
from dsgen.spec.yaml_source import load_yaml


@dataclass(frozen=True)  # one per YAML read
class FrameworkRun:
    """The spec overrides a framework's YAML gives, by what they describe."""

    shape: tuple[str, ...]  # the model, sequence and precision (for keys the spec does not state)
    method: tuple[str, ...]  # the method and objective
    pins: tuple[str, ...]  # what it fixes: the micro-batch, checkpointing off
    batch: tuple[str, ...]  # its global batch, where the spec has none


def _stated(data: Any, key: str) -> bool:
    node = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def llamafactory_run(framework_yaml: str | Path, spec: str | Path) -> FrameworkRun:
    """What a LLaMA-Factory training YAML gives a spec file that may hold only hardware. Without a
    global batch in the spec, the YAML's micro-batch x accumulation x GPUs is the batch."""
    method, args = llamafactory_inputs(framework_yaml)
    raw, _ = load_yaml(read_text(Path(framework_yaml), "LLaMA-Factory YAML"), str(framework_yaml))
    stated_data, _ = load_yaml(read_text(Path(spec), "spec"), str(spec))

    def unstated(items: list[str]) -> tuple[str, ...]:
        return tuple(item for item in items if not _stated(stated_data, item.split("=", 1)[0]))

    shape: list[str] = []
    model = raw.get("model_name_or_path") if isinstance(raw, dict) else None
    if isinstance(model, str) and not _stated(stated_data, "model"):
        local = Path(framework_yaml).parent / model
        shape.append(f"model.hf_config={local.resolve()}" if local.is_dir() else f"model.hf={model}")
    shape.append(f"training.sequence_length={args['max_length']}")
    shape += [f"training.precision={flag}" for flag in ("bf16", "fp16") if args.get(flag)]
    pins: list[str] = []
    if "per_device_train_batch_size" in args:  # a pin, as the YAML states it
        pins.append(f"constraints.micro_batch_size={args['per_device_train_batch_size']}")
    if isinstance(raw, dict) and raw.get("disable_gradient_checkpointing") is True:
        pins.append("constraints.activation_checkpointing=false")
    batch = _batch(framework_yaml, args, stated_data)
    return FrameworkRun(unstated(shape), unstated(method), unstated(pins), unstated(batch))


def _batch(framework_yaml: str | Path, args: dict[str, Any], stated_data: Any) -> list[str]:
    """The global batch the YAML runs, where the spec states none and its GPU count is readable
    (a bad one is the loader's to name)."""
    if _stated(stated_data, "training.global_batch_size") or _stated(stated_data, "training.tokens_per_step"):
        return []
    hardware = stated_data.get("hardware") if isinstance(stated_data, dict) else None
    if not isinstance(hardware, dict):
        return []
    counts = [hardware.get(key, spec_default(f"hardware.{key}")) for key in ("gpus_per_node", "nodes")]
    if not all(type(count) is int and count > 0 for count in counts):
        return []
    if "per_device_train_batch_size" not in args:
        raise DsgenError(
            f"{framework_yaml}: no per_device_train_batch_size, and the spec states no training.global_batch_size",
            path="training.global_batch_size",
            hint="set training.global_batch_size in the spec, or per_device_train_batch_size in the YAML",
        )
    per_step = args["per_device_train_batch_size"] * args.get("gradient_accumulation_steps", 1)
    return [f"training.global_batch_size={per_step * counts[0] * counts[1]}"]
