"""Generated hostile inputs (issue 14): 2,000 per loader, and 2,000 pin combinations for the solver.

The property is the one a user relies on: whatever the input, dsgen either succeeds or raises its
own :class:`DsgenError` (a message and an exit code); never ``ValueError``, ``KeyError``,
``RecursionError``, ``min() arg is an empty sequence``... Inputs are small and cheap to build, so the
five properties together take well under a minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsgen.errors import DsgenError
from dsgen.solver import solve
from dsgen.spec.loader import spec_from_data
from dsgen.spec.overrides import apply_overrides
from dsgen.spec.yaml_source import load_yaml
from dsgen.sweep import load_sweep
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
