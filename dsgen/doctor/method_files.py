"""The fine-tuning method and objective a run's own files state, as spec overrides.

PEFT's ``adapter_config.json`` says the adapters (``LoraConfig.to_dict``: ``peft_type``, ``r``,
``lora_alpha``, ``lora_dropout``, ``target_modules``) and TRL's config, passed as
``--training-args``, says the objective by the fields only its class has. Reading them is one step
before pricing: the doctor loads the spec with these ``--set`` overrides, so what the files say
wins over the spec and every later stage sees one spec.

These files are written by other tools and edited by hand, so every field read here is checked
here, against the type its own tool declares and, where it becomes a spec key, against the spec's
schema: a wrong value ends in one message naming the file, its line and the field, never a
``--set`` error the user did not write, nor an exception from deeper in the doctor.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError, Location
from dsgen.facts.frameworks import LLAMAFACTORY_PREF_LOSS, LLAMAFACTORY_STAGES
from dsgen.inputs import read_text
from dsgen.intake.schema_errors import LARGEST_NUMBER as LARGEST  # far past any real batch or rank
from dsgen.intake.schema_errors import refusal, show
from dsgen.resources import schema_path
from dsgen.validate.jsontypes import escape_pointer_token

#: A field's check: why its value is refused ("must be ..., got ..."), or None.
Check = Callable[[Any], str | None]

_MISSING: Any = object()


def _shown(value: Any) -> str:
    """The value as written, cut short: a hostile value may be a megabyte of list."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > LARGEST:
        return f"an integer of {value.bit_length()} bits"
    text = show(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _null(nullable: bool) -> str:
    return " or null" if nullable else ""


def integer(low: int | None = 1, *, nullable: bool = False) -> Check:
    """An integer (not a boolean) of at least ``low``, at most 2**53."""

    def check(value: Any) -> str | None:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
            floor = f" of at least {low}" if low is not None else ""
            return f"must be an integer{floor}{_null(nullable)}, got {_shown(value)}"
        if abs(value) > LARGEST:
            return f"must be at most 2**53 in magnitude, got {_shown(value)}"
        return None

    return check


def number(low: float | None = None, *, below: float | None = None, nullable: bool = False) -> Check:
    """A finite number (not a boolean) of at least ``low`` and below ``below``."""

    def check(value: Any) -> str | None:
        if value is None and nullable:
            return None
        bounds = [f"at least {low}"] if low is not None else []
        bounds += [f"below {below}"] if below is not None else []
        wanted = f"must be a finite number{' ' + ' and '.join(bounds) if bounds else ''}{_null(nullable)}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{wanted}, got {_shown(value)}"
        if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > LARGEST:
            return f"{wanted}, got {_shown(value)}"
        if (low is not None and value < low) or (below is not None and value >= below):
            return f"{wanted}, got {_shown(value)}"
        return None

    return check


def boolean(*, nullable: bool = False) -> Check:
    """true or false (a string "true" is not: ``bool("false")`` is True)."""

    def check(value: Any) -> str | None:
        if (value is None and nullable) or isinstance(value, bool):
            return None
        return f"must be true or false{_null(nullable)}, got {_shown(value)}"

    return check


def choice(options: tuple[str, ...], *, nullable: bool = False) -> Check:
    """One of ``options`` (a list or mapping is refused, not looked up: it is unhashable)."""

    def check(value: Any) -> str | None:
        if (value is None and nullable) or (isinstance(value, str) and value in options):
            return None
        return f"must be one of {', '.join(options)}{_null(nullable)}, got {_shown(value)}"

    return check


def text(*, nullable: bool = False) -> Check:
    """A non-empty string."""

    def check(value: Any) -> str | None:
        if (value is None and nullable) or (isinstance(value, str) and value.strip()):
            return None
        return f"must be a non-empty string{_null(nullable)}, got {_shown(value)}"

    return check


def spec_key(key: str, first: Check) -> Check:
    """``first``, then what the spec's schema refuses at ``key`` (the override the value becomes)."""
    path = tuple(key.split("."))

    def check(value: Any) -> str | None:
        problem = first(value)
        if problem is None and value is not None:
            problem = refusal(value, schema_path("spec"), path)
        return problem

    return check


class RunFile:
    """One run file's top-level fields, read through checks that name the file, line and field."""

    def __init__(self, data: Mapping[str, Any], where: str, line_of: Callable[[str], int | None]) -> None:
        self.data = data
        self.where = where
        self.line_of = line_of

    def fail(self, key: str, message: str, hint: str | None = None) -> DsgenError:
        """One error for ``key``: ``file:line: key: message``, the key said once."""
        return DsgenError(message, path=key, location=Location(self.where, self.line_of(key)), hint=hint)

    def get(self, key: str, check: Check, default: Any = None) -> Any:
        """``key``'s value (``default`` when absent), or the error its check raises."""
        value = self.data.get(key, _MISSING)
        if value is _MISSING:
            return default
        problem = check(value)
        if problem is not None:
            raise self.fail(key, problem)
        return value


#: A JSON string (kept as it is) or one of the non-JSON numbers Python's json reads.
_NON_JSON_NUMBER = re.compile(r'"(?:[^"\\]|\\.)*"|-?Infinity|NaN')


def _blank(match: re.Match[str]) -> str:
    word = match.group()
    return word if word.startswith('"') else "0".ljust(len(word))


def read_json_file(path: str | Path, what: str) -> RunFile:
    """A JSON object from ``path`` (strict JSON, as PEFT and ``HfArgumentParser`` read it), with the
    line of each top-level key for messages (from dsgen's position-keeping parser)."""
    from dsgen.validate.loader import loads

    file = Path(path)
    raw = read_text(file, what)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DsgenError(f"{file}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise DsgenError(f"{file}: invalid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise DsgenError(f"{file}: {what} must be a JSON object")
    try:  # NaN and Infinity (json takes them) blanked to a 0 of the same length: lines stay put
        positions = loads(_NON_JSON_NUMBER.sub(_blank, raw), str(file)).positions
    except DsgenError:
        positions = {}

    def line_of(key: str) -> int | None:
        found = positions.get("/" + escape_pointer_token(key))
        return found[0] if found else None

    return RunFile(data, str(file), line_of)


#: A field only one TRL config class has, and the objective it names (TRL 1.16's config classes:
#: GRPOConfig, KTOConfig, CPOConfig, RewardConfig, ORPOConfig, DPOConfig), checked in this order.
TRL_OBJECTIVE_FIELDS: tuple[tuple[str, str], ...] = (
    ("num_generations", "grpo"),
    ("desirable_weight", "kto"),
    ("cpo_alpha", "simpo"),
    ("simpo_gamma", "simpo"),
    ("center_rewards_coefficient", "reward"),
    ("precompute_ref_log_probs", "dpo"),
)

#: What the doctor reads from TrainingArguments (transformers 5.24 ``training_args.py``) and TRL 1.16's
#: config classes, with the type each declares: ``int`` batch fields (at least 1, as the doctor divides
#: by them), ``warmup_steps: float`` (``__post_init__`` refuses < 0), ``gradient_checkpointing: bool |
#: None``, ``max_length: int | None``, GRPOConfig's ``num_generations``, ``max_completion_length``,
#: ``steps_per_generation`` (``int | None``), ``vllm_mode`` ("colocate" or "server"). Those that become
#: spec keys are also checked against the spec's schema. The objective-only fields (``desirable_weight``
#: ...) are read for their presence, so any value is taken.
TRAINING_ARGS_FIELDS: dict[str, Check] = {
    "per_device_train_batch_size": integer(1),
    "per_device_eval_batch_size": integer(1),
    "gradient_accumulation_steps": integer(1),
    "max_steps": integer(None),
    "warmup_steps": number(0),
    "eval_strategy": choice(("no", "steps", "epoch")),
    "evaluation_strategy": choice(("no", "steps", "epoch")),
    "do_eval": boolean(),
    "max_length": integer(1, nullable=True),
    "max_seq_length": integer(1, nullable=True),
    "packing": boolean(),
    "optim": text(),
    "gradient_checkpointing": boolean(nullable=True),
    "max_grad_norm": number(),
    "learning_rate": number(),
    "adam_beta1": number(),
    "adam_beta2": number(),
    "adam_epsilon": number(),
    "weight_decay": number(),
    "fp16": boolean(),
    "bf16": boolean(),
    "num_generations": spec_key("training.generation.num_generations", integer(1, nullable=True)),
    "max_completion_length": spec_key("training.generation.max_completion_length", integer(1, nullable=True)),
    "steps_per_generation": integer(1, nullable=True),
    "use_vllm": boolean(),
    "vllm_mode": choice(("colocate", "server")),
    "vllm_gpu_memory_utilization": spec_key("training.generation.vllm_gpu_memory_utilization", number()),
    "precompute_ref_log_probs": boolean(),
}


def check_training_args(args: RunFile) -> dict[str, Any]:
    """Every field of :data:`TRAINING_ARGS_FIELDS` the arguments state, checked (and the accelerate
    ``parallelism_config`` block, by :func:`dsgen.doctor.parallelism.check_parallelism_config`)."""
    from dsgen.doctor.parallelism import check_parallelism_config

    for key, check in TRAINING_ARGS_FIELDS.items():
        args.get(key, check)
    if "parallelism_config" in args.data:
        line = args.line_of("parallelism_config")
        check_parallelism_config(args.data["parallelism_config"], args.where + (f":{line}" if line else ""))
    return dict(args.data)


def read_training_args(path: str | Path) -> dict[str, Any]:
    """Trainer arguments from JSON (``TrainingArguments`` field names, as in ``to_json_string``, and a
    TRL config's), every field the doctor reads checked. ``parallelism_config`` is an object of
    accelerate ``ParallelismConfig`` fields (:mod:`dsgen.doctor.parallelism`)."""
    return check_training_args(read_json_file(path, "training arguments (TrainingArguments fields)"))


def peft_overrides(path: str | Path, spec_method: str) -> list[str]:
    """``--set`` overrides for the LoRA adapters an ``adapter_config.json`` describes. The method
    stays ``qlora`` when the spec says so (the file does not record the base model's quantization).
    PEFT 0.x ``LoraConfig``: ``r: int``, ``lora_alpha: int``, ``lora_dropout: float``,
    ``target_modules: list[str] | str | None`` (a string is a regular expression unless it is
    ``all-linear``); absent alpha and dropout, and null targets, leave the spec's."""
    adapter = read_json_file(path, "PEFT adapter config")
    kind = adapter.data.get("peft_type", _MISSING)
    if kind != "LORA":
        got = "nothing" if kind is _MISSING else _shown(kind)
        raise adapter.fail("peft_type", f"dsgen prices LoRA adapters (LORA), got {got}")
    rank = adapter.get("r", spec_key("training.lora.rank", integer(1)), _MISSING)
    if rank is _MISSING:
        raise adapter.fail("r", "missing: the LoRA rank (a positive integer)")
    overrides = [f"training.finetuning={'qlora' if spec_method == 'qlora' else 'lora'}", f"training.lora.rank={rank}"]
    alpha = adapter.get("lora_alpha", spec_key("training.lora.alpha", number()))
    if alpha is not None:
        overrides.append(f"training.lora.alpha={float(alpha)}")
    dropout = adapter.get("lora_dropout", spec_key("training.lora.dropout", number()))
    if dropout is not None:
        overrides.append(f"training.lora.dropout={float(dropout)}")
    targets = adapter.get("target_modules", _peft_targets)
    if targets is not None:
        overrides.append(f"training.lora.target_modules={json.dumps(targets)}")
    return overrides


def _peft_targets(value: Any) -> str | None:
    """PEFT's ``target_modules``: null, ``all-linear``, or a list of module names the spec takes."""
    if value is None or value == "all-linear":
        return None
    if isinstance(value, str):
        return f"dsgen reads a list of module names or 'all-linear', got the regular expression {_shown(value)}"
    if isinstance(value, list) and all(isinstance(name, str) for name in value):
        return refusal(sorted(set(value)), schema_path("spec"), ("training", "lora", "target_modules"))
    return f"must be a list of module names, 'all-linear' or null, got {_shown(value)}"


def trl_overrides(args: dict[str, Any]) -> list[str]:
    """``--set`` overrides for the objective a TRL config states (none for plain TrainingArguments).
    Arguments given as a mapping (the Python API) are checked as a file's are."""
    check_training_args(RunFile(args, "training arguments", lambda _key: None))
    objective = next((name for key, name in TRL_OBJECTIVE_FIELDS if key in args), None)
    if objective is None:
        return []
    overrides = [f"training.objective={objective}"]
    if objective in ("dpo", "kto") and args.get("precompute_ref_log_probs") is True:
        overrides.append("training.reference_model=precomputed")
    if objective == "grpo":
        for key in ("num_generations", "max_completion_length"):
            if args.get(key) is not None:
                overrides.append(f"training.generation.{key}={args[key]}")
        if args.get("use_vllm") is True:
            mode = args.get("vllm_mode", "colocate")
            overrides.append(f"training.generation.engine={'vllm-colocate' if mode == 'colocate' else 'vllm-server'}")
            if "vllm_gpu_memory_utilization" in args:
                overrides.append(
                    f"training.generation.vllm_gpu_memory_utilization={args['vllm_gpu_memory_utilization']}"
                )
    return overrides


def llamafactory_inputs(path: str | Path) -> tuple[list[str], dict[str, Any]]:
    """(spec overrides, Trainer arguments) from a LLaMA-Factory training YAML: the method
    (``finetuning_type``, ``lora_rank``, ``lora_alpha``, ``lora_dropout``, ``lora_target``,
    ``quantization_bit``, ``freeze_trainable_layers``), the objective (``stage``, ``pref_loss``),
    and what it passes to the HF Trainer (``per_device_train_batch_size``,
    ``gradient_accumulation_steps``, ``cutoff_len`` as the sequence, ``bf16``/``fp16``, and checkpointing,
    on unless ``disable_gradient_checkpointing``). Defaults and
    types are LLaMA-Factory's (``hparams/finetuning_args.py``: ``stage`` and ``finetuning_type``
    literals, ``lora_rank: int = 8``, ``lora_alpha: int | None`` (None: 2 x rank), ``lora_dropout:
    float = 0``, ``lora_target: str = "all"``, ``freeze_trainable_layers: int = 2``, ``pref_loss: str``;
    ``model_args.py``: ``quantization_bit: int | None``; ``data_args.py``: ``cutoff_len: int = 2048``)."""
    from dsgen.spec.yaml_source import load_yaml, read_source

    file = Path(path)
    data, source = load_yaml(read_source(file, "LLaMA-Factory YAML"), str(file))
    if not isinstance(data, dict):
        raise DsgenError(f"{file}: a LLaMA-Factory training YAML is a mapping of its arguments")
    yaml = RunFile(data, str(file), lambda key: source.location((key,)).line)

    stage = yaml.get("stage", choice(tuple(LLAMAFACTORY_STAGES)), "sft")
    objective = LLAMAFACTORY_STAGES[stage]
    if stage == "dpo":
        objective = LLAMAFACTORY_PREF_LOSS.get(yaml.get("pref_loss", text(), "sigmoid"), objective)
    kind = yaml.get("finetuning_type", choice(("lora", "freeze", "full")), "lora")
    bits = yaml.get("quantization_bit", integer(1, nullable=True))
    if bits is not None and bits not in (4, 8):
        raise yaml.fail("quantization_bit", f"dsgen prices 4- and 8-bit bitsandbytes quantization, got {bits}")
    overrides = [f"training.objective={objective}"]
    if kind == "lora":
        overrides.append(f"training.finetuning={'qlora' if bits else 'lora'}")
        rank = yaml.get("lora_rank", spec_key("training.lora.rank", integer(1)), 8)
        overrides.append(f"training.lora.rank={rank}")
        alpha = yaml.get("lora_alpha", integer(0, nullable=True)) or 2 * rank  # 0 or null: the default
        overrides.append(f"training.lora.alpha={alpha}")
        dropout = yaml.get("lora_dropout", spec_key("training.lora.dropout", number()), 0.0)
        overrides.append(f"training.lora.dropout={dropout}")
        target = yaml.get("lora_target", _llamafactory_target, "all")
        overrides.append("training.lora.target_modules=" + json.dumps(_target_names(target)))
        if bits:
            overrides.append(f"training.quantization.bits={bits}")
            overrides.append(f"training.quantization.type={'nf4' if bits == 4 else 'int8'}")
    elif kind == "freeze":
        layers = yaml.get("freeze_trainable_layers", spec_key("training.freeze.trainable_layers", integer(1)), 2)
        overrides += ["training.finetuning=freeze", f"training.freeze.trainable_layers={layers}"]
    else:
        overrides.append("training.finetuning=full")
    args: dict[str, Any] = {}
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        value = yaml.get(key, integer(1))
        if value is not None:
            args[key] = value
    args["max_length"] = yaml.get("cutoff_len", integer(1), 2048)
    # LLaMA-Factory checkpoints every layer unless told not to (model_args.py
    # disable_gradient_checkpointing: bool = False; model/model_utils/checkpointing.py)
    args["gradient_checkpointing"] = not yaml.get("disable_gradient_checkpointing", boolean(), False)
    for key in ("bf16", "fp16"):
        if key in data:
            args[key] = yaml.get(key, boolean())
    return overrides, args


def _target_names(target: str) -> str | list[str]:
    """LLaMA-Factory's ``lora_target`` (``all`` or comma-separated names) as the spec's value."""
    names = [name.strip() for name in target.split(",") if name.strip()]
    return "all-linear" if names == ["all"] else names


def _llamafactory_target(value: Any) -> str | None:
    if not isinstance(value, str) or not _target_names(value):
        return f"must be 'all' or comma-separated module names, got {_shown(value)}"
    return refusal(_target_names(value), schema_path("spec"), ("training", "lora", "target_modules"))
