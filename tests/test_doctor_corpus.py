"""Every real config of the corpus through ``dsgen doctor`` on one cluster: a diagnosis or one
clear DsgenError, never a crash; and the fix ``--fix`` would write is accepted by DeepSpeed's
own parser (after the HF Trainer fills "auto") with the global batch the config had."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsgen.api import load_spec
from dsgen.doctor.diagnose import diagnose
from dsgen.errors import DsgenError
from dsgen.validate import loader
from tests.conftest import EXAMPLES_DIR, require_module
from tests.doctor_scenarios import trainer_resolved

ARGS = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "bf16": True}


def _autotp(config: dict[str, Any]) -> int:
    """The AutoTP degree a config states (1 without one)."""
    size = (config.get("tensor_parallel") or {}).get("autotp_size", 1)
    return size if isinstance(size, int) and size > 1 else 1


def test_corpus_never_crashes_and_fixes_parse(corpus_dir: Path) -> None:
    require_module("deepspeed")
    require_module("transformers")
    from tests.ds_oracle import deepspeed_verdict, parse_with_deepspeed

    spec = load_spec(EXAMPLES_DIR / "doctor" / "cluster.yaml")
    world = spec.hardware.world_size
    verdicts: dict[str, int] = {}
    fixes_checked = 0
    for path in sorted(corpus_dir.glob("*.json")):
        try:
            config = loader.load(path).data
        except DsgenError:
            continue
        try:
            d = diagnose(config, spec, trainer_args=ARGS)
        except DsgenError:
            continue
        verdicts[d.verdict] = verdicts.get(d.verdict, 0) + 1
        if d.verdict != "oom" or not d.fixes:
            continue
        try:
            before = trainer_resolved(config, ARGS, world, spec.model.hidden_size)
        except ValueError:
            continue  # the Trainer refuses the original (a mismatch the doctor reports)
        if not deepspeed_verdict(before, world)[0]:
            continue
        fix = d.fixes[0]
        plan = fix.evaluation.plan
        args = dict(ARGS)
        if fix.script_changes and any("--per_device_train_batch_size" in c for c in fix.script_changes):
            args.update(
                per_device_train_batch_size=plan.micro_batch_size,
                gradient_accumulation_steps=plan.gradient_accumulation_steps,
            )
        after = trainer_resolved(fix.config, args, world, spec.model.hidden_size)
        parsed = parse_with_deepspeed(after, world)
        # the samples a step trains are kept; DeepSpeed counts each AutoTP peer in train_batch_size
        samples = parsed.train_batch_size // _autotp(after)
        assert samples == parse_with_deepspeed(before, world).train_batch_size // _autotp(before), path.name
        assert fix.evaluation.feasible
        fixes_checked += 1
    assert verdicts.get("oom", 0) >= 50, verdicts
    assert fixes_checked >= 30
