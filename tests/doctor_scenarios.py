"""Load the doctor scenario fixtures (tests/fixtures/doctor) and the consumers that judge a fix.

A fixture's config is read from the corpus by name (``$DSGEN_CORPUS``) or given inline. The
HF Trainer's own ``HfTrainerDeepSpeedConfig`` fills ``"auto"`` values before DeepSpeed's own
``DeepSpeedConfig`` parses the result at the run's world size: the same path a real run takes.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from dsgen.intake.loader import load_spec_text
from dsgen.spec.types import Spec
from dsgen.validate import loader

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "doctor"
SCENARIOS = sorted(FIXTURES.glob("*.yaml"))


def load_scenario(path: Path, corpus: Path) -> tuple[dict[str, Any], dict[str, Any], Spec]:
    """(fixture, DeepSpeed config, spec)."""
    fixture = yaml.safe_load(path.read_text(encoding="utf-8"))
    source = fixture["config"]
    config = loader.load(corpus / source["corpus"]).data if "corpus" in source else source["inline"]
    spec = load_spec_text(yaml.safe_dump(fixture["spec"]), file=str(path), base_dir=FIXTURES)
    return fixture, config, spec


TRAINER_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_grad_norm",
    "learning_rate",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "weight_decay",
    "bf16",
    "fp16",
)


@functools.cache  # one TrainingArguments for the whole session
def trainer_defaults() -> dict[str, Any]:
    """What the installed transformers' TrainingArguments holds for the fields the DeepSpeed
    integration reads when none is passed: the oracle's defaults come from transformers, not dsgen."""
    import tempfile

    from transformers import TrainingArguments

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, use_cpu=True)
    return {name: getattr(args, name) for name in TRAINER_FIELDS}


def trainer_resolved(
    config: dict[str, Any], trainer_args: dict[str, Any] | None, world_size: int, hidden_size: int
) -> dict[str, Any]:
    """The config after transformers' HfTrainerDeepSpeedConfig process+finalize (what DeepSpeed gets)."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    values = {**trainer_defaults(), **(trainer_args or {})}  # a fresh dict: the cached one stays intact
    args = SimpleNamespace(
        world_size=world_size,
        save_on_each_node=False,
        fp16_full_eval=False,
        bf16_full_eval=False,
        get_warmup_steps=lambda steps: 0,
        **{k: v for k, v in values.items() if k != "gradient_checkpointing"},
    )
    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
    hf.trainer_config_process(args)
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=hidden_size))
    hf.trainer_config_finalize(args, model, num_training_steps=1000)
    return hf.config
