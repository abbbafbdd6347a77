"""Generated hostile inputs (issue 14): 2,000 per loader, and 2,000 pin combinations for the solver.

The property is the one a user relies on: whatever the input, dsgen either succeeds or raises its
own :class:`DsgenError` (a message and an exit code); never ``ValueError``, ``KeyError``,
``RecursionError``, ``min() arg is an empty sequence``... Inputs are small and cheap to build, so the
five properties together take well under a minute.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import json
import os
import re
import sys
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsgen.errors import DsgenError
from dsgen.intake.loader import spec_from_data
from dsgen.intake.overrides import apply_overrides
from dsgen.search.solver import solve
from dsgen.spec.yaml_source import load_yaml
from dsgen.sweeps.runner import load_sweep
from dsgen.validate import validate_config
from dsgen.validate.loader import loads
from tests.conftest import EXAMPLES_DIR

EXAMPLES = int(os.environ.get("DSGEN_PROPERTY_EXAMPLES", "2000"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

EXAMPLE = (EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml").read_text(encoding="utf-8")
# A small model on two GPUs keeps one solve at milliseconds.
SMALL = (
    EXAMPLE.replace("preset: llama-3.1-8b", "preset: gpt2")
    .replace("gpus_per_node: 8", "gpus_per_node: 2")
    .replace("global_batch_size: 256", "global_batch_size: 8")
    .replace("sequence_length: 4096", "sequence_length: 512")
)
EMPTY_DIR = Path(tempfile.mkdtemp(prefix="dsgen-properties-"))

# Pieces hostile YAML is made of: structure, aliases, tags, odd scalars, huge numbers.
YAML_PIECES = [
    "\n",
    "  ",
    ": ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ", ",
    "&a ",
    "*a",
    "&b [*a, *a, *a, *a]",
    "<<: *a",
    "!!python/object:os.system",
    "!!binary aGVsbG8=",
    "!!float",
    "!!set",
    "? ",
    "|",
    ">",
    "'",
    '"',
    "#",
    "---",
    "...",
    "%YAML 1.1",
    ".nan",
    ".inf",
    "-.inf",
    "~",
    "null",
    "true",
    "0x1f",
    "0o17",
    "1e400",
    "9" * 5000,
    str(2**53),
    str(2**64),
    "-1",
    "0",
    "model",
    "preset",
    "training",
    "hardware",
    "constraints",
    "global_batch_size",
    "gpus_per_node",
    "zero_stage",
    "\t",
    "\x00",
    "\ufeff",
    "é",
]
yaml_fragments = st.lists(st.sampled_from(YAML_PIECES) | st.text(max_size=8), max_size=30).map("".join)


def _load_spec(text: str) -> None:
    data, source = load_yaml(text, "s.yaml")
    spec_from_data(data, source, base_dir=EMPTY_DIR)


@st.composite
def spec_texts(draw: st.DrawFn) -> str:
    """The example spec with random lines replaced or inserted, or pure fragments."""
    if draw(st.integers(0, 4)) == 0:
        return draw(yaml_fragments)
    lines = SMALL.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(lines)))
        piece = draw(yaml_fragments)
        if draw(st.booleans()) and at < len(lines):
            head = lines[at].split(":")[0] if ":" in lines[at] else lines[at]
            lines[at] = f"{head}: {piece}"
        else:
            lines.insert(at, piece)
    return "\n".join(lines) + "\n"


@PROPERTY
@given(spec_texts())
def test_spec_loader_raises_only_dsgen_errors(text: str) -> None:
    with contextlib.suppress(DsgenError):
        _load_spec(text)


JSON_PIECES = [
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    '"train_batch_size"',
    '"train_micro_batch_size_per_gpu"',
    '"gradient_accumulation_steps"',
    '"zero_optimization"',
    '"stage"',
    '"offload_optimizer"',
    '"device"',
    '"cpu"',
    '"nvme"',
    '"optimizer"',
    '"type"',
    '"params"',
    '"AdamW"',
    '"auto"',
    '"fp16"',
    '"bf16"',
    '"enabled"',
    "true",
    "false",
    "null",
    "0",
    "-1",
    "3",
    "1e400",
    "1.5",
    "9" * 200,
    "9" * 5000,
    '"\\ud800"',
    '"\\u0000"',
    "//c\n",
    "/* c */",
    "#c\n",
    "/*",
    " ",
    "\n",
]
json_fragments = st.lists(st.sampled_from(JSON_PIECES) | st.text(max_size=6), max_size=40).map("".join)


@st.composite
def json_configs(draw: st.DrawFn) -> str:
    """Valid-looking configs (small JSON trees of DeepSpeed keys) or raw fragments."""
    if draw(st.booleans()):
        return draw(json_fragments)
    keys = st.sampled_from([p.strip('"') for p in JSON_PIECES if p.startswith('"') and len(p) > 3])
    scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.sampled_from(["auto", "cpu"])
    tree = st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3), max_leaves=6
    )
    return json.dumps(draw(st.dictionaries(keys, tree, max_size=5)))


@PROPERTY
@given(json_configs(), st.sampled_from([None, 1, 8, 2**40]), st.sampled_from(["deepspeed", "hf-trainer", "accelerate"]))
def test_deepspeed_config_loader_raises_only_dsgen_errors(text: str, world_size: int | None, target: str) -> None:
    with contextlib.suppress(DsgenError):
        loaded = loads(text, "c.json")
        validate_config(loaded.data, world_size=world_size, target=target)


KEYS = [
    "training.global_batch_size",
    "training.sequence_length",
    "training.optimizer.type",
    "training.precision",
    "hardware.gpus_per_node",
    "hardware.nodes",
    "hardware.gpu",
    "hardware.nvme",
    "model.preset",
    "model.architecture",
    "model.architecture.num_layers",
    "model.hf_config",
    "constraints.zero_stage",
    "constraints.micro_batch_size",
    "constraints.offload_optimizer",
    "output.target",
    "model",
    "training",
    "x.y.z",
]


@st.composite
def set_items(draw: st.DrawFn) -> list[str]:
    items = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(KEYS) | st.text(max_size=10))
        sep = draw(st.sampled_from(["=", "=", "==", ":", ""]))
        items.append(f"{key}{sep}{draw(yaml_fragments)}")
    return items


@PROPERTY
@given(set_items())
def test_set_parser_raises_only_dsgen_errors(items: list[str]) -> None:
    data, source = load_yaml(SMALL, "s.yaml")
    with contextlib.suppress(DsgenError):
        apply_overrides(data, items, source)
        spec_from_data(data, source, base_dir=EMPTY_DIR)


TEMPLATE_PIECES = [
    "{{ ",
    " }}",
    "{% ",
    " %}",
    "index",
    "vars",
    "model.preset",
    "hardware.nodes",
    "1/0",
    "range(",
    "10**9",
    ")",
    "*",
    "**",
    "%",
    "'a'",
    "'%0999d'",
    "|center(",
    "|join",
    "for i in ",
    "endfor",
    "macro f()",
    "endmacro",
    "f()",
    "include 'x'",
    "import 'x' as y",
    "set x = ",
    "x",
    ".__class__",
    "..",
    "/",
    "manifest.jsonl",
    "-",
    "r",
]


@st.composite
def sweep_texts(draw: st.DrawFn) -> str:
    name = draw(st.lists(st.sampled_from(TEMPLATE_PIECES) | st.text(max_size=4), max_size=12).map("".join))
    values = st.lists(st.integers(-2, 2**60) | st.sampled_from(["a", None, True, 1.5]), max_size=3)
    grid = draw(st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), values, max_size=2))
    zipped = draw(st.dictionaries(st.sampled_from(KEYS), values, max_size=2))
    doc: dict[str, Any] = {"base": "base.yaml", "name": name}
    if grid or not zipped:
        doc["grid"] = grid
    if zipped:
        doc["zip"] = zipped
    text = json.dumps(doc)  # JSON is YAML
    if draw(st.integers(0, 5)) == 0:
        text += "\n" + draw(yaml_fragments)
    return text


SWEEP_DIR = Path(tempfile.mkdtemp(prefix="dsgen-sweep-properties-"))
(SWEEP_DIR / "base.yaml").write_text(SMALL, encoding="utf-8")


@PROPERTY
@given(sweep_texts())
def test_sweep_loader_raises_only_dsgen_errors(text: str) -> None:
    path = SWEEP_DIR / "sweep.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with contextlib.suppress(DsgenError):
        load_sweep(path)


PIN = {
    "zero_stage": st.sampled_from(["auto", 0, 1, 2, 3]),
    "offload_optimizer": st.sampled_from(["auto", "none", "cpu", "nvme"]),
    "offload_param": st.sampled_from(["auto", "none", "cpu", "nvme"]),
    "activation_checkpointing": st.sampled_from(["auto", "selective", True, False]),
    "micro_batch_size": st.sampled_from(["auto", 1, 2, 3, 8, 2**20, 2**53]),
    "gradient_accumulation_steps": st.sampled_from(["auto", 1, 4, 7, 2**53]),
    "allow_batch_rounding": st.sampled_from(["none", "nearest"]),
}


@st.composite
def pinned_specs(draw: st.DrawFn) -> dict[str, Any]:
    data, _ = load_yaml(SMALL, "s.yaml")
    data["constraints"] = {key: draw(strategy) for key, strategy in PIN.items() if draw(st.booleans())}
    training = data["training"]
    training["optimizer"]["type"] = draw(
        st.sampled_from(["adamw", "adam", "sgd", "lion", "adagrad", "adafactor", "adamw-8bit"])
    )
    training["global_batch_size"] = draw(st.sampled_from([1, 2, 8, 7, 96, 10**12, 2**53]))
    training["attention"] = draw(st.sampled_from(["flash", "eager", "sdpa"]))
    hardware = data["hardware"]
    hardware["gpus_per_node"] = draw(st.sampled_from([1, 2, 8, 2**53]))
    hardware["nodes"] = draw(st.sampled_from([1, 2, 3]))
    if draw(st.booleans()):
        hardware["nvme"] = {"path": "/nvme", "capacity_gib": draw(st.sampled_from([1, 2000]))}
    data["model"] = {"preset": draw(st.sampled_from(["gpt2", "qwen2.5-0.5b", "bert-base"]))}
    return data


@PROPERTY
@given(pinned_specs())
def test_solver_pin_combinations_raise_only_dsgen_errors(data: dict[str, Any]) -> None:
    _, source = load_yaml(SMALL, "s.yaml")
    with contextlib.suppress(DsgenError):
        solve(spec_from_data(data, source, base_dir=EMPTY_DIR))


# ---- the run's own files, read by `dsgen doctor` ---------------------------------------------------
#
# Each reader (LLaMA-Factory YAML, PEFT adapter_config.json, TrainingArguments / TRL JSON) gets one
# generated hostile value in one field it reads, on a base file the doctor accepts (exit 0). Whatever
# the value, the CLI ends in its own exit code, never 70 or a traceback; a value the field's own tool
# declares another type for (its dataclass field, read from that tool where it is installed) is
# refused with exit 2; and a refusal that names the run file is one line, ``file:line: field: ...``,
# with the field said once.

DOCTOR_DIR = Path(tempfile.mkdtemp(prefix="dsgen-doctor-properties-"))
DOCTOR_CONFIG = DOCTOR_DIR / "ds.json"
DOCTOR_CONFIG.write_text(
    json.dumps(
        {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "bf16": {"enabled": "auto"},
            "zero_optimization": {"stage": 2},
        }
    )
)
SFT_SPEC = DOCTOR_DIR / "sft.yaml"
SFT_SPEC.write_text(
    "model: {preset: qwen2.5-0.5b}\nhardware: {gpu: a100-80gb, gpus_per_node: 1, cpu_memory_gib: 64}\n"
    "training: {sequence_length: 1024, global_batch_size: 8}\n"
)
GRPO_SPEC = DOCTOR_DIR / "grpo.yaml"  # TRL's GRPO fields need a spec whose sequence is prompt + completion
GRPO_SPEC.write_text(
    "model: {preset: qwen2.5-0.5b}\nhardware: {gpu: a100-80gb, gpus_per_node: 1, cpu_memory_gib: 64}\n"
    "training:\n  sequence_length: 768\n  global_batch_size: 8\n  objective: grpo\n"
    "  generation: {num_generations: 4, max_prompt_length: 512, max_completion_length: 256}\n"
)

#: LLaMA-Factory's declared types (it is not a dependency; read from its source, v0.9:
#: hparams/finetuning_args.py, model_args.py, data_args.py, and transformers' TrainingArguments).
LLAMAFACTORY_TYPES: dict[str, Any] = {
    "stage": Literal["pt", "sft", "rm", "ppo", "dpo", "kto"],
    "finetuning_type": Literal["lora", "freeze", "full"],
    "pref_loss": str,
    "lora_rank": int,
    "lora_alpha": int | None,
    "lora_dropout": float,
    "lora_target": str,
    "freeze_trainable_layers": int,
    "quantization_bit": int | None,
    "cutoff_len": int,
    "per_device_train_batch_size": int,
    "gradient_accumulation_steps": int,
    "bf16": bool,
    "fp16": bool,
}
LLAMAFACTORY_BASE: dict[str, Any] = {
    "stage": "dpo",
    "finetuning_type": "lora",
    "lora_rank": 16,
    "lora_target": "q_proj,v_proj",
    "quantization_bit": 4,
    "pref_loss": "sigmoid",
    "cutoff_len": 1024,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "bf16": True,
}
PEFT_BASE: dict[str, Any] = {
    "peft_type": "LORA",
    "r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.05,
    "target_modules": ["q_proj", "v_proj"],
    "task_type": "CAUSAL_LM",
}
TRAINING_ARGS_BASE: dict[str, Any] = {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "num_generations": 4,
    "learning_rate": 1e-5,
    "bf16": True,
}


def _field_types(*classes: Any) -> dict[str, Any]:
    """Each dataclass field's declared type, the first class that declares it winning."""
    found: dict[str, Any] = {}
    for cls in classes:
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # a forward reference the module cannot resolve: the raw field types
            hints = {f.name: f.type for f in dataclasses.fields(cls)}
        for name, hint in hints.items():
            found.setdefault(name, hint)
    return found


def declared_types(reader: str) -> dict[str, Any]:
    """The type each field's own tool declares: LoraConfig (PEFT), TrainingArguments and TRL's
    GRPOConfig / DPOConfig / SFTConfig, LLaMA-Factory's above."""
    if reader == "llamafactory":
        return LLAMAFACTORY_TYPES
    if reader == "peft":
        import peft

        # lora_alpha is declared int, but PEFT only divides by it (lora/layer.py update_layer:
        # ``self.scaling[adapter_name] = lora_alpha / r``), so a float works as well
        return {**_field_types(peft.LoraConfig), "peft_type": Literal["LORA"], "lora_alpha": float}
    import transformers
    import trl

    found = _field_types(transformers.TrainingArguments, trl.GRPOConfig, trl.DPOConfig, trl.SFTConfig)
    # the older names of two fields, which files written by earlier releases still carry
    # (transformers renamed evaluation_strategy in 4.46, TRL max_seq_length in 0.20)
    return {**found, "evaluation_strategy": found["eval_strategy"], "max_seq_length": found["max_length"]}


def accepts(hint: Any, value: Any) -> bool:
    """Does ``value`` have the declared type ``hint``? True for a type this does not model (no claim)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(accepts(arg, value) for arg in args)
    if origin is Literal:
        return any(type(value) is type(arg) and value == arg for arg in args)
    if origin is list:
        return isinstance(value, list) and all(accepts(args[0], item) for item in value)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return any(value == member.value for member in hint)
    return True


def _fields_read(reader: str) -> list[str]:
    """The fields each reader reads (what it covers; the expectations come from the declared types)."""
    if reader == "llamafactory":
        return sorted(LLAMAFACTORY_TYPES)
    if reader == "peft":
        return ["peft_type", "r", "lora_alpha", "lora_dropout", "target_modules"]
    from dsgen.doctor.method_files import TRAINING_ARGS_FIELDS

    return sorted(TRAINING_ARGS_FIELDS)


def test_training_args_fields_are_fields_of_the_tools_classes() -> None:
    """Every field the training-arguments reader checks is a TrainingArguments or TRL config field
    (a misspelt field would be checked and never read)."""
    types_ = declared_types("training-args")
    assert [name for name in _fields_read("training-args") if name not in types_] == []


# Values no field should crash on: every JSON type, the edges of numbers, odd strings. Colons are left
# out of strings so that a value cannot spell "field:" in the message by itself.
HOSTILE_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-3, 10)
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(blacklist_characters=":", blacklist_categories=("Cs",)), max_size=12)
    | st.sampled_from(["all", "all-linear", "sft", "dpo", "freeze", "LORA", "q_proj,v_proj", "steps", "server", ""])
    | st.lists(st.sampled_from(["q_proj", "v_proj", 1, None, "a*"]), max_size=3)
    | st.dictionaries(st.sampled_from(["a", "stage"]), st.integers(0, 2), max_size=2)
)


def _doctor(args: list[str]) -> tuple[int, str]:
    """``dsgen doctor ARGS`` in this process (as the console script runs it): exit code, stderr."""
    from dsgen.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["dsgen", "doctor", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    finally:
        sys.argv = argv
    return code, err.getvalue()


def write_run_file(reader: str, content: dict[str, Any]) -> Path:
    if reader == "llamafactory":
        path = DOCTOR_DIR / "train.yaml"
        path.write_text(yaml.safe_dump(content, sort_keys=False, allow_unicode=True))
    else:
        path = DOCTOR_DIR / ("adapter_config.json" if reader == "peft" else "training_args.json")
        path.write_text(json.dumps(content, indent=2))
    return path


def key_line(path: Path, key: str) -> int:
    """The 1-based line where top-level ``key`` is written (YAML ``key:``, indented JSON ``"key":``)."""
    starts = (f"{key}:", f"'{key}':", f'  "{key}":')
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(starts))


def run_file_case(reader: str, field: str, value: Any) -> None:
    """The property for one value in one field of one reader's base file."""
    base = {"llamafactory": LLAMAFACTORY_BASE, "peft": PEFT_BASE, "training-args": TRAINING_ARGS_BASE}[reader]
    content = {**base, field: value}
    if reader == "llamafactory" and field == "freeze_trainable_layers":
        content["finetuning_type"] = "freeze"  # read only for a freeze run
    path = write_run_file(reader, content)
    option = {"llamafactory": "--llamafactory", "peft": "--peft", "training-args": "--training-args"}[reader]
    spec = GRPO_SPEC if reader == "training-args" else SFT_SPEC
    code, err = _doctor([str(DOCTOR_CONFIG), "--spec", str(spec), option, str(path)])
    assert code != 70 and "Traceback" not in err, err
    hint = declared_types(reader).get(field)
    if hint is not None and not accepts(hint, value):
        assert code == 2, f"{field}={value!r} (not {hint}) was taken: exit {code}\n{err}"
    if code == 2 and str(path) in err:
        lines = [line for line in err.splitlines() if not line.startswith("  hint: ")]
        assert len(lines) == 1, err
        head = f"error: {path}:{key_line(path, field)}: {field}: "
        assert lines[0].startswith(head), f"{field}={value!r}: {err}"
        rest = lines[0][len(head) :]
        assert not re.search(rf"(^|\W){re.escape(field)}(\W|$)", rest.split(", got ")[0]), err


@pytest.mark.parametrize("reader", ["llamafactory", "peft", "training-args"])
def test_each_run_file_base_is_accepted(reader: str) -> None:
    """The base files are clean: a refusal in the property below is the generated value's doing."""
    option = {"llamafactory": "--llamafactory", "peft": "--peft", "training-args": "--training-args"}[reader]
    spec = GRPO_SPEC if reader == "training-args" else SFT_SPEC
    base = {"llamafactory": LLAMAFACTORY_BASE, "peft": PEFT_BASE, "training-args": TRAINING_ARGS_BASE}[reader]
    code, err = _doctor([str(DOCTOR_CONFIG), "--spec", str(spec), option, str(write_run_file(reader, base))])
    assert code == 0, err


@pytest.mark.parametrize("reader", ["llamafactory", "peft", "training-args"])
def test_every_field_of_every_run_file_refuses_a_hostile_value_by_name(reader: str) -> None:
    fields = _fields_read(reader)

    @PROPERTY
    @given(st.sampled_from(fields), HOSTILE_VALUES)
    def check(field: str, value: Any) -> None:
        run_file_case(reader, field, value)

    check()


@pytest.mark.parametrize(
    ("reader", "field", "value"),
    [  # the issue's seven exit-70 cases
        ("llamafactory", "stage", ["sft"]),
        ("llamafactory", "stage", {"a": 1}),
        ("llamafactory", "lora_rank", None),
        ("training-args", "per_device_train_batch_size", None),
        ("training-args", "gradient_accumulation_steps", None),
        ("training-args", "per_device_eval_batch_size", None),
        ("peft", "r", None),
    ],
)
def test_the_issues_crashing_values_are_refused_by_name(reader: str, field: str, value: Any) -> None:
    run_file_case(reader, field, value)
