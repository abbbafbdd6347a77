"""Load the doctor scenario fixtures (tests/fixtures/doctor) and the consumers that judge a fix.

A fixture's config is read from the corpus by name (``$DSGEN_CORPUS``) or given inline. The
HF Trainer's own ``HfTrainerDeepSpeedConfig`` fills ``"auto"`` values before DeepSpeed's own
``DeepSpeedConfig`` parses the result at the run's world size: the same path a real run takes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from dsgen.spec.loader import load_spec_text
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


def trainer_resolved(
    config: dict[str, Any], trainer_args: dict[str, Any] | None, world_size: int, hidden_size: int
) -> dict[str, Any]:
    """The config after transformers' HfTrainerDeepSpeedConfig process+finalize (what DeepSpeed gets)."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    values = {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "max_grad_norm": 1.0,
        "learning_rate": 5e-5,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "weight_decay": 0.0,
        "bf16": False,
        "fp16": False,
        **(trainer_args or {}),
    }
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
