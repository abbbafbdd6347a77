"""The fine-tuning rules of ``dsgen validate`` (``--spec`` / ``validate_config(..., method=...)``).

Each rule has a config + method that fires it and a near miss that does not; where a CPU can run
it, the framework's own code is made to raise (or to do what the rule says) on the same config:

* ``trl-reference-engine``: TRL's ``prepare_deepspeed`` is run with ``deepspeed.initialize``
  captured, and DeepSpeed's own parser judges the config it built; a slow test builds the real
  reference engines on one CPU rank;
* ``grpo-generation-batch``: TRL's ``GRPOConfig``;
* ``trl-bf16-default``: TRL's ``DPOConfig`` with the DeepSpeed config, and accelerate's
  ``DeepSpeedPlugin.set_mixed_precision`` / the HF Trainer's ``trainer_config_finalize``;
* ``qlora-zero3-offload-param`` rests on PEFT's DeepSpeed guide, which no installed package ships.

The method's own refusal (quantization only with QLoRA) is checked against transformers'
``validate_quantization_for_training`` on a tiny bitsandbytes model.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dsgen.api import load_spec, training_method
from dsgen.errors import DsgenError
from dsgen.validate import METHOD_RULES, RULES, Report, TrainingMethod, validate_config, validate_file
from dsgen.validate.rules.finetuning import TRL_CONFIG_CLASSES, reference_engine_config
from tests.cli_helpers import run_cli
from tests.conftest import REPO_ROOT, free_port, require_module

BATCH = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
ADAMW = {"type": "AdamW", "params": {"lr": 1e-3}}
CPU_OFFLOAD = {"device": "cpu"}

DPO_SEPARATE = TrainingMethod(objective="dpo", reference="separate")
KTO_PRECOMPUTED = TrainingMethod(objective="kto", reference="precomputed")
DPO_LORA = TrainingMethod(finetuning="lora", objective="dpo", reference="adapter-disabled")
GRPO = TrainingMethod(finetuning="lora", objective="grpo", generation_engine="vllm-colocate", num_generations=4)
QLORA = TrainingMethod(finetuning="qlora", quantization_bits=4, quantization_type="nf4")


def config(**sections: Any) -> dict[str, Any]:
    return {**BATCH, **sections}


def zero(stage: int, **keys: Any) -> dict[str, Any]:
    return {"stage": stage, **keys}


# Configs DeepSpeed accepts for the policy but refuses for TRL's reference engine (ZeRO stage 0,
# no optimizer, scheduler or offload_optimizer), and their near misses.
FP16_MASTER = config(
    fp16={"enabled": True, "fp16_master_weights_and_grads": True},
    optimizer=ADAMW,
    zero_optimization=zero(2, offload_optimizer=CPU_OFFLOAD),
)
BF16_MASTER = config(
    bf16={"enabled": True, "bf16_master_weights_and_grads": True},
    optimizer=ADAMW,
    zero_optimization=zero(2, offload_optimizer=CPU_OFFLOAD),
)
BF16_MASTER_Z3 = {**BF16_MASTER, "zero_optimization": zero(3, offload_optimizer=CPU_OFFLOAD)}
NO_GRAD_NORM = config(gradient_clipping=0, zero_optimization=zero(2, compute_grad_norm=False))
MANAGED_GA = config(managed_gradient_accumulation=False, zero_optimization=zero(2, overlap_comm=True))
ZENFLOW = config(
    bf16={"enabled": True},
    optimizer=ADAMW,
    zero_optimization=zero(2, overlap_comm=True, offload_optimizer=CPU_OFFLOAD, zenflow={"topk_ratio": 0.1}),
)
ZENFLOW_Z3 = {**ZENFLOW, "zero_optimization": {**ZENFLOW["zero_optimization"], "stage": 3}}
ZENFLOW_FIXED = {
    **ZENFLOW,
    "zero_optimization": {
        **ZENFLOW["zero_optimization"],
        "zenflow": {"topk_ratio": 0.1, "update_interval": 4, "select_strategy": "step", "select_interval": 4},
    },
}
PLAIN_Z2 = config(bf16={"enabled": True}, optimizer=ADAMW, zero_optimization=zero(2, offload_optimizer=CPU_OFFLOAD))
Z3_PARAM_OFFLOAD = config(
    bf16={"enabled": True},
    optimizer=ADAMW,
    zero_optimization=zero(3, offload_optimizer=CPU_OFFLOAD, offload_param=CPU_OFFLOAD),
)

# rule id -> (config, method, kwargs) that fires it, and a near miss that does not
CASES: dict[str, tuple[tuple[dict[str, Any], TrainingMethod, dict[str, Any]], ...]] = {
    "trl-reference-engine": (
        (FP16_MASTER, DPO_SEPARATE, {}),
        ({**FP16_MASTER, "zero_optimization": zero(3, offload_optimizer=CPU_OFFLOAD)}, DPO_SEPARATE, {}),
    ),
    "grpo-generation-batch": (
        ({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1}, GRPO, {}),
        ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}, GRPO, {}),
    ),
    "qlora-zero3-offload-param": (
        (Z3_PARAM_OFFLOAD, QLORA, {}),
        ({**Z3_PARAM_OFFLOAD, "zero_optimization": zero(3)}, QLORA, {}),
    ),
    "trl-bf16-default": (
        (config(zero_optimization=zero(2)), DPO_LORA, {"target": "hf-trainer"}),
        (config(bf16={"enabled": "auto"}, zero_optimization=zero(2)), DPO_LORA, {"target": "hf-trainer"}),
    ),
}


def fired(report: Report, rule_id: str) -> list[Any]:
    return [f for f in report.findings if f.rule_id == rule_id]


# -- the method ---------------------------------------------------------------------------------


def test_every_method_rule_has_a_case_and_its_ids_are_not_config_rule_ids() -> None:
    assert set(CASES) == set(METHOD_RULES)
    assert not set(METHOD_RULES) & set(RULES)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires(rule_id: str) -> None:
    (cfg, method, kwargs), _ = CASES[rule_id]
    hits = fired(validate_config(cfg, method=method, **kwargs), rule_id)
    assert hits, validate_config(cfg, method=method, **kwargs).findings
    assert all(f.severity == METHOD_RULES[rule_id].severity and f.message and f.hint for f in hits)
    assert all(f.phase != "config" for f in hits)  # DeepSpeedConfig accepts the config itself


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_near_miss(rule_id: str) -> None:
    _, (cfg, method, kwargs) = CASES[rule_id]
    assert not fired(validate_config(cfg, method=method, **kwargs), rule_id)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_without_a_method_the_report_is_what_it_was(rule_id: str) -> None:
    (cfg, method, kwargs), _ = CASES[rule_id]
    before = validate_config(cfg, **kwargs)
    assert before == validate_config(cfg, method=None, **kwargs)
    assert not {f.rule_id for f in before.findings} & set(METHOD_RULES)
    with_method = validate_config(cfg, method=method, **kwargs)
    assert [f for f in with_method.findings if f.rule_id not in METHOD_RULES] == before.findings


def test_a_method_that_fires_nothing_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(PLAIN_Z2, indent=2))
    for method in (TrainingMethod(), DPO_LORA, QLORA, TrainingMethod(finetuning="freeze")):
        assert validate_file(path, method=method) == validate_file(path)
    assert validate_file(path, method=DPO_SEPARATE, strict=True) == validate_file(path, strict=True)


def test_findings_are_located_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(FP16_MASTER, indent=2))
    (finding,) = fired(validate_file(path, method=DPO_SEPARATE), "trl-reference-engine")
    text = path.read_text().splitlines()
    assert finding.line is not None and "fp16_master_weights_and_grads" in text[finding.line - 1]


def test_strict_makes_method_warnings_errors() -> None:
    (cfg, method, kwargs), _ = CASES["qlora-zero3-offload-param"]
    report = validate_config(cfg, method=method, strict=True, **kwargs)
    assert [f.severity for f in fired(report, "qlora-zero3-offload-param")] == ["error"]


def test_a_method_of_the_wrong_type_is_a_settings_error() -> None:
    with pytest.raises(DsgenError, match="TrainingMethod"):
        validate_config(PLAIN_Z2, method="lora")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"finetuning": "lora2"}, "finetuning must be one of"),
        ({"reference": "auto"}, "reference must be one of"),
        ({"reference": "adapter-disabled"}, "needs a LoRA or QLoRA policy"),
        ({"finetuning": "qlora"}, "quantization_type must be one of"),
        ({"finetuning": "qlora", "quantization_type": "int8", "quantization_bits": 4}, "stores 8-bit"),
        ({"finetuning": "full", "quantization_type": "nf4", "quantization_bits": 4}, "qlora only"),
        ({"objective": "grpo"}, "generation_engine must be one of"),
        ({"objective": "grpo", "generation_engine": "transformers", "num_generations": 0}, "positive integer"),
        ({"objective": "dpo", "reference": "separate", "num_generations": 4}, "objective grpo or ppo"),
    ],
)
def test_method_refuses_what_no_run_can_be(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        TrainingMethod(**kwargs)


SPEC_HEAD = """\
model: {preset: llama-3.1-8b}
hardware: {gpu: h100-80gb, gpus_per_node: 8}
training:
  sequence_length: 2048
  global_batch_size: 64
"""


@pytest.mark.parametrize(
    ("training", "expected"),
    [
        ("", TrainingMethod()),
        ("  objective: dpo\n", DPO_SEPARATE),
        ("  finetuning: lora\n  objective: dpo\n", DPO_LORA),
        ("  objective: kto\n  reference_model: precomputed\n", KTO_PRECOMPUTED),
        (
            "  finetuning: qlora\n  quantization: {bits: 8, type: int8}\n",
            TrainingMethod("qlora", quantization_bits=8, quantization_type="int8"),
        ),
        ("  finetuning: freeze\n  objective: orpo\n", TrainingMethod("freeze", "orpo")),
    ],
)
def test_the_method_of_a_spec(training: str, expected: TrainingMethod, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC_HEAD + training)
    assert training_method(path) == expected == TrainingMethod.from_spec(load_spec(path))


def test_the_method_of_a_grpo_spec() -> None:
    spec = load_spec(
        {
            "model": {"preset": "llama-3.1-8b"},
            "hardware": {"gpu": "h100-80gb", "gpus_per_node": 8},
            "training": {
                "sequence_length": 48,
                "global_batch_size": 64,
                "finetuning": "lora",
                "objective": "grpo",
                "generation": {"num_generations": 8, "max_prompt_length": 16, "max_completion_length": 32},
            },
        }
    )
    method = training_method(spec)
    assert (method.objective, method.reference, method.num_generations) == ("grpo", "none", 8)
    assert method.generation_engine == spec.training.finetuning.generation.engine


# -- the rules, case by case --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "pointer"),
    [
        (FP16_MASTER, "/fp16/fp16_master_weights_and_grads"),
        (BF16_MASTER, "/bf16/bf16_master_weights_and_grads"),
        (NO_GRAD_NORM, "/zero_optimization/compute_grad_norm"),
        (MANAGED_GA, "/managed_gradient_accumulation"),
        (ZENFLOW, "/zero_optimization/zenflow"),
        (ZENFLOW_Z3, "/zero_optimization/zenflow"),
    ],
)
def test_reference_engine_failures(cfg: dict[str, Any], pointer: str) -> None:
    assert validate_config(cfg, world_size=1).ok or pointer.endswith("zenflow")  # the policy's config is fine
    for method in (
        DPO_SEPARATE,
        KTO_PRECOMPUTED,
        TrainingMethod(objective="grpo", reference="separate", generation_engine="transformers", num_generations=2),
    ):
        hits = fired(validate_config(cfg, world_size=1, method=method), "trl-reference-engine")
        assert [f.pointer for f in hits] == [pointer], hits
        assert "prepare_deepspeed" in hits[0].message


@pytest.mark.parametrize(
    "method",
    [
        DPO_LORA,
        TrainingMethod(objective="orpo"),
        TrainingMethod(objective="kto", reference="adapter-disabled", finetuning="lora"),
        GRPO,
    ],
)
def test_no_reference_engine_no_finding(method: TrainingMethod) -> None:
    for cfg in (FP16_MASTER, MANAGED_GA, ZENFLOW):
        assert not fired(validate_config(cfg, method=method), "trl-reference-engine")


@pytest.mark.parametrize("cfg", [BF16_MASTER_Z3, ZENFLOW_FIXED, PLAIN_Z2, Z3_PARAM_OFFLOAD])
def test_reference_engine_near_misses(cfg: dict[str, Any]) -> None:
    assert not fired(validate_config(cfg, method=DPO_SEPARATE), "trl-reference-engine")


def test_reference_engine_config_is_trls() -> None:
    derived = reference_engine_config({**Z3_PARAM_OFFLOAD, "scheduler": {"type": "WarmupLR", "params": {}}}, 3)
    assert "optimizer" not in derived and "scheduler" not in derived
    assert derived["zero_optimization"] == {"stage": 3, "offload_param": CPU_OFFLOAD}
    assert reference_engine_config(PLAIN_Z2, 2)["zero_optimization"] == {"stage": 0}


def test_grpo_batch_from_the_micro_batch_and_world_size() -> None:
    cfg = {"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1}
    assert not fired(validate_config(cfg, method=GRPO), "grpo-generation-batch")  # world size unknown
    (finding,) = fired(validate_config(cfg, method=GRPO, world_size=2), "grpo-generation-batch")
    assert finding.pointer == "/train_micro_batch_size_per_gpu" and "(6)" in finding.message
    assert "e.g. 8" in (finding.hint or "")
    assert not fired(validate_config(cfg, method=GRPO, world_size=4), "grpo-generation-batch")
    auto = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    assert not fired(validate_config(auto, method=GRPO, world_size=3, target="hf-trainer"), "grpo-generation-batch")


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_qlora_offload_param_only_for_qlora_at_stage3(device: str) -> None:
    cfg = config(
        zero_optimization=zero(3, offload_optimizer=CPU_OFFLOAD, offload_param={"device": device, "nvme_path": "/x"})
    )
    assert fired(validate_config(cfg, method=QLORA), "qlora-zero3-offload-param")
    for method in (TrainingMethod(finetuning="lora"), TrainingMethod()):
        assert not fired(validate_config(cfg, method=method), "qlora-zero3-offload-param")
    below = config(zero_optimization=zero(2, offload_param={"device": device}))
    assert not fired(validate_config(below, method=QLORA), "qlora-zero3-offload-param")


@pytest.mark.parametrize(
    ("cfg", "phase"),
    [
        (config(zero_optimization=zero(2)), "lint"),  # no bf16 section: accelerate adds bf16 enabled
        (config(fp16={"enabled": False}, zero_optimization=zero(2)), "lint"),
        (config(bf16={"enabled": False}, zero_optimization=zero(2)), "engine"),  # the Trainer's mismatch
    ],
)
def test_trl_bf16_default(cfg: dict[str, Any], phase: str) -> None:
    (finding,) = fired(validate_config(cfg, method=DPO_LORA, target="hf-trainer"), "trl-bf16-default")
    assert finding.phase == phase and "DPOConfig" in finding.message
    for quiet in (
        validate_config(cfg, method=DPO_LORA, target="deepspeed"),  # no TRL trainer reads it
        validate_config(cfg, method=TrainingMethod(), target="hf-trainer"),  # full SFT: the plain Trainer too
        validate_config(
            config(fp16={"enabled": True}, zero_optimization=zero(2)), method=DPO_LORA, target="hf-trainer"
        ),
        validate_config(
            config(bf16={"enabled": True}, zero_optimization=zero(2)), method=DPO_LORA, target="hf-trainer"
        ),
    ):
        assert not fired(quiet, "trl-bf16-default")


# -- the frameworks' own code --------------------------------------------------------------------------


def _captured_reference_config(cfg: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What TRL's own ``prepare_deepspeed`` hands ``deepspeed.initialize`` for a frozen model."""
    from tests.ds_oracle import _deepspeed_config_module

    _deepspeed_config_module()  # import DeepSpeed on the CPU accelerator first
    import deepspeed
    from trl.models.utils import prepare_deepspeed

    captured: dict[str, Any] = {}

    def initialize(*, model: Any, config: dict[str, Any]) -> tuple[Any, ...]:
        captured.update(config)
        return (model,)

    monkeypatch.setattr(deepspeed, "initialize", initialize)
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=64), eval=lambda: None)
    accelerator = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=cfg)))
    prepare_deepspeed(model, accelerator)
    return captured


@pytest.mark.deepspeed
@pytest.mark.parametrize(
    ("cfg", "refused"),
    [
        (FP16_MASTER, True),
        (BF16_MASTER, True),
        (NO_GRAD_NORM, True),
        (BF16_MASTER_Z3, False),
        (PLAIN_Z2, False),
        (Z3_PARAM_OFFLOAD, False),
    ],
)
def test_trl_builds_the_reference_config_and_deepspeed_refuses_it(
    cfg: dict[str, Any], refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's derivation is ours (dotted keys aside, which DeepSpeed ignores), and DeepSpeedConfig
    refuses exactly the derived configs the rule flags, while accepting the policy's config."""
    require_module("trl")
    from tests.ds_oracle import deepspeed_verdict

    trl_config = _captured_reference_config(cfg, monkeypatch)
    stage = cfg["zero_optimization"]["stage"]
    assert {k: v for k, v in trl_config.items() if "." not in k} == reference_engine_config(cfg, stage)
    assert deepspeed_verdict(cfg, 1)[0], "the policy's own config must parse"
    accepted, why = deepspeed_verdict(trl_config, 1)
    hits = fired(validate_config(cfg, world_size=1, method=DPO_SEPARATE), "trl-reference-engine")
    assert accepted is not refused, why
    assert bool(hits) is refused
    if refused:
        assert hits[0].message.split("DeepSpeed refuses it there: ")[1].rstrip(".") in why


_ENGINE_PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    import torch, deepspeed
    from types import SimpleNamespace
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.models.utils import prepare_deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    for name, cfg in json.loads(sys.argv[1]).items():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
        plugin = SimpleNamespace(deepspeed_config=cfg)
        try:
            engine = prepare_deepspeed(model, SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)))
            with torch.no_grad():
                engine(input_ids=torch.randint(0, 128, (1, 8)))
            print("DSGEN_REF", json.dumps([name, None]), flush=True)
        except Exception as exc:
            print("DSGEN_REF", json.dumps([name, f"{type(exc).__name__}: {exc}"[:400]]), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.deepspeed
def test_trls_reference_engine_fails_where_the_rule_says(tmp_path: Path) -> None:
    """The real thing: TRL's prepare_deepspeed builds each reference engine on one CPU rank and runs
    a forward; it fails exactly for the configs the rule flags (the assertions DeepSpeedConfig does
    not make: managed_gradient_accumulation at initialize, ZenFlow at the first forward)."""
    require_module("trl")
    require_module("transformers")
    from tests.ds_oracle import worker_env

    cases = {
        "managed_ga": MANAGED_GA,
        "zenflow": ZENFLOW,
        "zenflow_z3": ZENFLOW_Z3,
        "zenflow_fixed_interval": ZENFLOW_FIXED,
        "z3_param_offload": Z3_PARAM_OFFLOAD,
    }
    proc = subprocess.run(
        [sys.executable, "-c", _ENGINE_PROGRAM, json.dumps(cases), str(free_port())],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env=worker_env(),
    )
    outcomes = dict(json.loads(m) for m in re.findall(r"^DSGEN_REF (.*)$", proc.stdout, re.M))
    assert set(outcomes) == set(cases), proc.stdout[-3000:] + proc.stderr[-3000:]
    for name, cfg in cases.items():
        hits = fired(validate_config(cfg, world_size=1, method=DPO_SEPARATE), "trl-reference-engine")
        assert bool(hits) is (outcomes[name] is not None), (name, outcomes[name], hits)
    assert "managed_gradient_accumulation=False supports ZeRO overlap_comm only" in outcomes["managed_ga"]
    assert "zenflow_need_update" in outcomes["zenflow"] and "zenflow_need_update" in outcomes["zenflow_z3"]


_TRL_ARGS_PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    os.environ["DS_ACCELERATOR"] = "cpu"
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config
    import trl
    from trl.trainer.base_config import _BaseConfig
    out = {"base": {}}
    for name in json.loads(sys.argv[2]):
        cls = getattr(trl, name, None)
        if cls is None:
            from trl.experimental.orpo import ORPOConfig
            from trl.experimental.cpo import CPOConfig
            cls = {"ORPOConfig": ORPOConfig, "CPOConfig": CPOConfig}[name]
        out["base"][name] = issubclass(cls, _BaseConfig)
    common = dict(output_dir=sys.argv[1], report_to="none", use_cpu=True)
    for name, (micro, accumulation, groups) in json.loads(sys.argv[3]).items():
        try:
            trl.GRPOConfig(per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation,
                           num_generations=groups, **common)
            out[name] = None
        except ValueError as exc:
            out[name] = str(exc)
    for name, cfg in json.loads(sys.argv[4]).items():
        for label, cls in (("dpo", trl.DPOConfig), ("trainer", TrainingArguments)):
            args = cls(deepspeed=cfg, per_device_train_batch_size=1, **common)
            result = {"mixed_precision": args.mixed_precision}
            try:
                args.hf_deepspeed_config.trainer_config_finalize(args, None, 10)
                result["finalize"] = None
            except ValueError as exc:
                result["finalize"] = str(exc)
            try:
                args.deepspeed_plugin.set_mixed_precision(args.mixed_precision)
                result["bf16"] = args.deepspeed_plugin.deepspeed_config.get("bf16")
            except ValueError as exc:
                result["bf16"] = str(exc)
            out[f"{name}/{label}"] = result
            del args
            unset_hf_deepspeed_config()
    print("DSGEN_TRL " + json.dumps(out), flush=True)
    """
)
GRPO_BATCHES = {"grpo_6_of_4": (3, 2, 4), "grpo_8_of_4": (4, 2, 4), "grpo_3_of_2": (3, 1, 2)}
PRECISION_CONFIGS = {
    "no_bf16_section": config(zero_optimization=zero(2)),
    "bf16_false": config(bf16={"enabled": False}, zero_optimization=zero(2)),
    "bf16_auto": config(bf16={"enabled": "auto"}, zero_optimization=zero(2)),
}


@pytest.fixture(scope="module")
def trl_arguments(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """TRL's and transformers' argument classes on the cases (in a child process: TrainingArguments
    with a DeepSpeed config sets process-wide state, the accelerate PartialState among it)."""
    require_module("trl")
    require_module("deepspeed")
    from tests.ds_oracle import worker_env

    out = tmp_path_factory.mktemp("trl_args")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _TRL_ARGS_PROGRAM,
            str(out),
            json.dumps(sorted(set(TRL_CONFIG_CLASSES.values()))),
            json.dumps(GRPO_BATCHES),
            json.dumps(PRECISION_CONFIGS),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out,
        env=worker_env(),
    )
    match = re.search(r"^DSGEN_TRL (.*)$", proc.stdout, re.M)
    assert match, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(match.group(1))
    return result


@pytest.mark.deepspeed
@pytest.mark.parametrize("name", sorted(GRPO_BATCHES))
def test_grpo_config_raises_where_the_rule_fires(name: str, trl_arguments: dict[str, Any]) -> None:
    micro, accumulation, groups = GRPO_BATCHES[name]
    method = TrainingMethod(
        finetuning="lora", objective="grpo", generation_engine="transformers", num_generations=groups
    )
    cfg = {
        "train_batch_size": micro * accumulation,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
    }
    hits = fired(validate_config(cfg, world_size=1, method=method), "grpo-generation-batch")
    raised = trl_arguments[name]
    assert bool(hits) is (raised is not None), (raised, hits)
    if raised:
        assert (
            f"generation_batch_size ({micro * accumulation}) must be divisible by num_generations ({groups})" in raised
        )
        assert raised.rstrip(".") in hits[0].message


@pytest.mark.deepspeed
def test_every_trl_config_class_shares_the_bf16_default(trl_arguments: dict[str, Any]) -> None:
    assert trl_arguments["base"] == dict.fromkeys(set(TRL_CONFIG_CLASSES.values()), True)


@pytest.mark.deepspeed
def test_trl_turns_a_fp32_config_into_bf16_or_refuses_it(trl_arguments: dict[str, Any]) -> None:
    dpo, trainer = trl_arguments["no_bf16_section/dpo"], trl_arguments["no_bf16_section/trainer"]
    # TRL: bf16 by default, and accelerate writes it into the DeepSpeed config; the plain Trainer stays fp32
    assert dpo["mixed_precision"] == "bf16" and dpo["bf16"] == {"enabled": True} and dpo["finalize"] is None
    assert trainer["mixed_precision"] == "no" and trainer["bf16"] == {"enabled": False}
    # an explicit bf16.enabled false: TRL's Trainer refuses the mismatch, the plain Trainer does not
    dpo, trainer = trl_arguments["bf16_false/dpo"], trl_arguments["bf16_false/trainer"]
    assert "ds bf16.enabled=False vs hf bf16|bf16_full_eval=True" in dpo["finalize"]
    assert trainer["finalize"] is None
    assert trl_arguments["bf16_auto/dpo"]["finalize"] is None  # the near miss: "auto" is filled, not compared
    for name, cfg in PRECISION_CONFIGS.items():
        hits = fired(validate_config(cfg, method=DPO_LORA, target="hf-trainer"), "trl-bf16-default")
        assert bool(hits) is (name != "bf16_auto")


def test_quantized_base_without_adapters_is_refused_by_transformers(tmp_path: Path) -> None:
    """Why TrainingMethod takes quantization only with QLoRA: transformers' Trainer refuses to train
    a quantized base without adapters, and accepts it with LoRA adapters (a tiny 4-bit model on CPU)."""
    require_module("bitsandbytes")
    peft = require_module("peft")
    torch = require_module("torch")
    from safetensors.torch import save_file
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
    from transformers.trainer_utils import validate_quantization_for_training

    hf_config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4
    )
    LlamaForCausalLM(hf_config).config.save_pretrained(tmp_path)
    save_file(
        {k: v.contiguous() for k, v in LlamaForCausalLM(hf_config).state_dict().items()},
        tmp_path / "model.safetensors",
        {"format": "pt"},
    )
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    model = LlamaForCausalLM.from_pretrained(tmp_path, quantization_config=bnb, device_map={"": "cpu"})
    with pytest.raises(ValueError, match="You cannot perform fine-tuning on purely quantized models"):
        validate_quantization_for_training(model)
    with pytest.raises(ValueError, match="qlora only"):
        TrainingMethod(finetuning="full", quantization_bits=4, quantization_type="nf4")
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj"]))
    validate_quantization_for_training(adapted)  # QLoRA: accepted
    TrainingMethod(finetuning="qlora", quantization_bits=4, quantization_type="nf4")


# -- the CLI ---------------------------------------------------------------------------------------


def _spec(tmp_path: Path, training: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(SPEC_HEAD + training)
    return path


def _ds(tmp_path: Path, cfg: dict[str, Any], name: str = "ds.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg, indent=2))
    return path


def test_cli_spec_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dpo = _spec(tmp_path, "  objective: dpo\n")
    bad = _ds(tmp_path, FP16_MASTER)
    good = _ds(tmp_path, PLAIN_Z2, "good.json")
    assert run_cli(["validate", str(bad)], capsys).exit_code == 0  # the policy's config alone is fine
    result = run_cli(["validate", str(bad), "--spec", str(dpo)], capsys)
    assert result.exit_code == 1 and "[trl-reference-engine]" in result.stdout, result.stdout
    assert run_cli(["validate", str(good), "--spec", str(dpo)], capsys).exit_code == 0
    qlora = _spec(tmp_path, "  finetuning: qlora\n", "qlora.yaml")
    warned = run_cli(["validate", str(_ds(tmp_path, Z3_PARAM_OFFLOAD, "z3.json")), "--spec", str(qlora)], capsys)
    assert warned.exit_code == 0 and "[qlora-zero3-offload-param]" in warned.stdout
    strict = run_cli(["validate", str(tmp_path / "z3.json"), "--spec", str(qlora), "--strict"], capsys)
    assert strict.exit_code == 1


@pytest.mark.parametrize(
    ("spec_text", "words"),
    [
        (None, "spec file not found"),
        ("model: {preset: llama-3.1-8b}\n", "missing required key 'hardware'"),
        (
            SPEC_HEAD + "  finetuning: lora\n  reference_model: adapter-disabled\n  objective: orpo\n",
            "uses no reference model",
        ),
        ("model: [\n", "spec"),
    ],
)
def test_cli_bad_spec_is_one_clear_error(
    spec_text: str | None, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    if spec_text is not None:
        spec.write_text(spec_text)
    result = run_cli(["validate", str(_ds(tmp_path, PLAIN_Z2)), "--spec", str(spec), "--json"], capsys)
    assert result.exit_code == 2
    assert result.stdout == ""  # stopped before any config was read
    assert result.stderr.startswith("error: ") and words in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_spec_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grpo = SPEC_HEAD.replace("2048", "48") + (
        "  finetuning: lora\n  objective: grpo\n"
        "  generation: {num_generations: 4, max_prompt_length: 16, max_completion_length: 32}\n"
    )
    spec = tmp_path / "grpo.yaml"
    spec.write_text(grpo)
    cfg = _ds(tmp_path, {"train_batch_size": 6, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1})
    result = run_cli(["validate", str(cfg), "--spec", str(spec), "--json", "--world-size", "2"], capsys)
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    (finding,) = document["files"][0]["findings"]
    assert finding["rule_id"] == "grpo-generation-batch" and finding["severity"] == "error"
    assert finding["pointer"] == "/train_batch_size" and finding["line"] == 2
    plain = json.loads(run_cli(["validate", str(cfg), "--json", "--world-size", "2"], capsys).stdout)
    assert plain["files"][0]["findings"] == [] and plain["ok"]


# -- the documentation -----------------------------------------------------------------------------


def test_docs_list_every_method_rule_with_its_severity() -> None:
    text = (REPO_ROOT / "docs" / "validation.md").read_text(encoding="utf-8")
    section = text.split("### Fine-tuning setups", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (error|warning) \|", section, re.M)
    assert dict(rows) == {r.rule_id: r.severity for r in METHOD_RULES.values()}
    assert len(rows) == len(METHOD_RULES)
