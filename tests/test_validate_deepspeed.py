"""dsgen against DeepSpeed 0.19.8 itself: the verdicts agree, and the messages are DeepSpeed's.

DeepSpeed is imported once per session (through ``tests/ds_oracle.py``, which also simulates the
data-parallel world size by patching ``deepspeed.comm``). The claim under test is
:meth:`Report.rejected_by_deepspeed`: dsgen reports an error of phase ``config`` exactly when
``DeepSpeedConfig(config)`` raises. It is checked on random configs (good and bad, built below
with hypothesis over ZeRO stage, offload, precision, batch keys and typical mistakes) and on the
real-world corpus, as written and after the HF Trainer's "auto" substitutions.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsgen.errors import DsgenError
from dsgen.validate import Report, validate_config
from dsgen.validate.loader import loads
from dsgen.validate.schema_findings import base_schema
from dsgen.validate.versions import removed_keys
from tests.conftest import require_module

pytestmark = pytest.mark.deepspeed

HARDWARE_RULES = {"aio-gds-cuda"}  # DeepSpeed refuses these only on a non-CUDA accelerator (like CI's CPU)


@pytest.fixture(scope="module")
def oracle() -> Any:
    """tests/ds_oracle.py with DeepSpeed imported (skips, or fails under DSGEN_REQUIRE_ALL, without it)."""
    require_module("deepspeed")
    from tests import ds_oracle

    ds_oracle.deepspeed_verdict({"train_micro_batch_size_per_gpu": 1}, 1)  # pay the import once, up front
    return ds_oracle


def predicts_rejection(report: Report) -> bool:
    return report.rejected_by_deepspeed() or any(f.rule_id in HARDWARE_RULES for f in report.findings)


def assert_agrees(oracle: Any, config: dict[str, Any], dp_size: int, report: Report, label: str = "") -> None:
    accepted, error = oracle.deepspeed_verdict(config, dp_size)
    findings = [(f.rule_id, f.phase, f.severity, f.message[:90]) for f in report.findings]
    assert accepted != predicts_rejection(report), (
        f"{label} DeepSpeed {'accepts' if accepted else 'rejects: ' + error[:300]}\n"
        f"dsgen: {findings}\nconfig: {json.dumps(config)[:600]} dp_size={dp_size}"
    )


# -- random configs ------------------------------------------------------------------------------
BATCH_VALUES = st.one_of(st.integers(1, 64), st.sampled_from([0, 3, 17, 128]))

MISTAKES: dict[str, Any] = {
    "zero-typo": ("zero_optimization", "stage3_max_live_parameter", 1000000),
    "top-typo": ((), "train_micro_batch_size_per_gpus", 4),
    "removed-amp": ((), "amp", {"enabled": True}),
    "removed-elasticity": ((), "elasticity", {"enabled": False}),
    "removed-curriculum": ((), "curriculum_learning", {"enabled": False}),
    "removed-mics": ("zero_optimization", "mics_shard_size", 8),
    "fractional-bucket": ("zero_optimization", "stage3_prefetch_bucket_size", 15099494.4),
    "string-bucket": ("zero_optimization", "reduce_bucket_size", "5e8"),
    "zero-bucket": ("zero_optimization", "reduce_bucket_size", 0),
    "auto-stage": ("zero_optimization", "stage", "auto"),
    "list-stage": ("zero_optimization", "stage", [2, 3]),
    "bad-stage": ("zero_optimization", "stage", 4),
    "bad-device": ("zero_optimization", "offload_optimizer", {"device": "gpu"}),
    "bf16-extra": ("bf16", "loss_scale", 0),
    "fp16-extra": ("fp16", "opt_level", "O2"),
    "bad-comm-dtype": ((), "communication_data_type", "int8"),
    "upper-comm-dtype": ((), "communication_data_type", "FP16"),
    "bad-allreduce": ((), "gradient_allreduce_op", "max"),
    "alias-both": ("zero_optimization", "max_live_parameters", 1000),
    "cpu-offload-both": ("zero_optimization", "cpu_offload", True),
    "tag-validation": ("checkpoint", "tag_validation", "maybe"),
    "keep-fp32": ("data_types", "keep_in_fp32_modules", "x"),
    "hybrid-tokens": ("hybrid_engine", "max_out_tokens", 0),
    "compile-passes": ("compile", "passes", ["z9"]),
    "results-dir": ("autotuning", "results_dir", ""),
    "autocast-dtype": ("torch_autocast", "dtype", "int4"),
    "ratio-bound": ("zero_optimization", "offload_optimizer", {"device": "cpu", "ratio": 1.5}),
    "zenflow-topk": ("zero_optimization", "zenflow", {"topk_ratio": 1.0}),
    "load-balance": ("expert_parallel", "load_balance_coeff", 0.01),
    "dynamic-batching": ("data_efficiency", "data_sampling", {"dynamic_batching": {"enabled": True}}),
    "ignored-aio": ("aio", "thread_count", 4),
    "string-clipping": ((), "gradient_clipping", "1.0"),
    "bool-as-int": ("zero_optimization", "overlap_comm", 1),
}


def _put(config: dict[str, Any], section: Any, key: str, value: Any) -> None:
    node = config
    if section:
        node = config.setdefault(section, {})
        if not isinstance(node, dict):
            return
    node[key] = value


@st.composite
def ds_configs(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A (config, data-parallel size) pair."""
    config: dict[str, Any] = {}
    world = draw(st.sampled_from([1, 2, 4, 8]))
    present = draw(
        st.sets(
            st.sampled_from(["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"]),
            min_size=0,
            max_size=3,
        )
    )
    if draw(st.integers(0, 9)) < 6:  # mostly consistent triples, so the other checks get a chance
        micro, accumulation = draw(st.integers(1, 8)), draw(st.integers(1, 4))
        values = {
            "train_batch_size": micro * accumulation * world,
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": accumulation,
        }
        present = present or {"train_micro_batch_size_per_gpu"}
        config.update({key: values[key] for key in sorted(present)})
    else:
        for key in sorted(present):
            config[key] = draw(BATCH_VALUES)

    if draw(st.booleans()):
        stage = draw(st.sampled_from([0, 1, 2, 3]))
        zero: dict[str, Any] = {"stage": stage}
        device = draw(st.sampled_from(["none", "cpu", "nvme", None]))
        if device is not None:
            block: dict[str, Any] = {"device": device}
            if device == "nvme" and draw(st.booleans()):
                block["nvme_path"] = "/local_nvme"
            if draw(st.integers(0, 5)) == 0:
                block["ratio"] = 0.5
            zero["offload_optimizer"] = block
        if draw(st.booleans()):
            zero["offload_param"] = {"device": draw(st.sampled_from(["none", "cpu", "nvme"])), "nvme_path": "/nvme"}
        if draw(st.booleans()):
            zero["reduce_bucket_size"] = draw(st.sampled_from([500000000, 5e8, 16777216]))
            zero["stage3_prefetch_bucket_size"] = draw(st.sampled_from([15099494, 50000000]))
        if draw(st.integers(0, 4)) == 0:
            zero["compute_grad_norm"] = False
        config["zero_optimization"] = zero

    precision = draw(st.sampled_from(["fp32", "fp16", "bf16", "both"]))
    if precision in ("fp16", "both"):
        fp16: dict[str, Any] = {"enabled": True}
        if draw(st.integers(0, 4)) == 0:
            fp16.update(
                loss_scale=0,
                loss_scale_window=draw(st.sampled_from([0, 1000])),
                min_loss_scale=draw(st.sampled_from([0, 1])),
            )
        if draw(st.integers(0, 5)) == 0:
            fp16["fp16_master_weights_and_grads"] = True
        config["fp16"] = fp16
    if precision in ("bf16", "both"):
        bf16: dict[str, Any] = {"enabled": True}
        if draw(st.integers(0, 5)) == 0:
            bf16["bf16_optimizer_states"] = True
            bf16["bf16_master_weights_and_grads"] = draw(st.booleans())
        config["bf16"] = bf16

    if draw(st.booleans()):
        config["gradient_allreduce_op"] = draw(st.sampled_from(["mean", "sum", "SUM"]))
    if draw(st.booleans()):
        config["optimizer"] = {"type": draw(st.sampled_from(["AdamW", "Adam", "Lamb", "SGD"])), "params": {"lr": 1e-4}}
    if draw(st.booleans()):
        config["gradient_clipping"] = draw(st.sampled_from([0.0, 1.0]))

    for name in draw(st.lists(st.sampled_from(sorted(MISTAKES)), max_size=2, unique=True)):
        section, key, value = MISTAKES[name]
        _put(config, section, key, value)
    return config, world


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(ds_configs())
def test_generated_configs_agree(oracle: Any, pair: tuple[dict[str, Any], int]) -> None:
    config, dp_size = pair
    assert_agrees(oracle, config, dp_size, validate_config(config, world_size=dp_size))


def test_the_generator_covers_both_verdicts(oracle: Any) -> None:
    """Guard against a strategy that drifts to all-accept or all-reject (the agreement test would go vacuous)."""
    verdicts = []

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(ds_configs())
    def collect(pair: tuple[dict[str, Any], int]) -> None:
        verdicts.append(oracle.deepspeed_verdict(*pair)[0])

    collect()
    assert 0.2 < sum(verdicts) / len(verdicts) < 0.8


# -- the corpus, as written and after HF Trainer substitution ------------------------------------
def corpus_configs(corpus: Path) -> list[tuple[str, dict[str, Any], str, int]]:
    import csv

    out = []
    with (corpus / "ORACLE-0.19.8.tsv").open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            if row["verdict"] == "skip":
                continue
            out.append(
                (
                    row["file"],
                    loads((corpus / row["file"]).read_text(encoding="utf-8")).data,
                    row["mode"],
                    int(row["world_size"]),
                )
            )
    return out


def hf_substitute(config: dict[str, Any], dp_size: int) -> dict[str, Any]:
    """What the HF Trainer (plus accelerate's DeepSpeedPlugin) does to the "auto" keys before DeepSpeed runs.

    Batch sizes are chosen consistently with whichever batch keys are numbers, as a user's
    TrainingArguments would have to be; everything else gets a typical value.
    """
    cfg = copy.deepcopy(config)

    def number(key: str) -> int | None:
        value = cfg.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    tb, mb, ga = (
        number("train_batch_size"),
        number("train_micro_batch_size_per_gpu"),
        number("gradient_accumulation_steps"),
    )
    if ga is None:
        ga = 1 if tb is None or mb is None else max(1, tb // (mb * dp_size))
    if mb is None:
        mb = max(1, tb // (dp_size * ga)) if tb is not None else 2
    values = {
        "train_micro_batch_size_per_gpu": mb,
        "gradient_accumulation_steps": ga,
        "train_batch_size": dp_size * mb * ga,
        "gradient_clipping": 1.0,
        "optimizer.params.lr": 1e-5,
        "optimizer.params.betas": [0.9, 0.999],
        "optimizer.params.eps": 1e-8,
        "optimizer.params.weight_decay": 0.0,
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": 1e-5,
        "scheduler.params.warmup_num_steps": 10,
        "scheduler.params.total_num_steps": 100,
        "fp16.enabled": False,
        "bf16.enabled": False,
        "amp.enabled": False,
        "amp.opt_level": "O1",
        "zero_optimization.reduce_bucket_size": 4096 * 4096,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * 4096 * 4096),
        "zero_optimization.stage3_param_persistence_threshold": 40960,
        # accelerate's DeepSpeedPlugin defaults (no accelerate config file)
        "zero_optimization.stage": 2,
        "zero_optimization.offload_optimizer.device": "none",
        "zero_optimization.offload_param.device": "none",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
    }
    for dotted, value in values.items():
        *parents, key = dotted.split(".")
        node: Any = cfg
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(key) == "auto":
            node[key] = value
    return cfg


def test_corpus_as_written_agrees(oracle: Any, corpus_dir: Path) -> None:
    checked = 0
    for name, config, mode, dp_size in corpus_configs(corpus_dir):
        if mode == "raw":
            assert_agrees(oracle, config, dp_size, validate_config(config, world_size=dp_size), name)
            checked += 1
    assert checked > 140


def test_corpus_after_hf_substitution_agrees(oracle: Any, corpus_dir: Path) -> None:
    """Validating the file with --target hf-trainer predicts DeepSpeed's verdict on the substituted config."""
    checked = 0
    for name, config, mode, dp_size in corpus_configs(corpus_dir):
        if mode != "hf":
            continue
        report = validate_config(config, world_size=dp_size, target="hf-trainer")
        assert_agrees(oracle, hf_substitute(config, dp_size), dp_size, report, name)
        checked += 1
    assert checked > 150


# -- DeepSpeed's own messages ---------------------------------------------------------------------
@pytest.mark.parametrize("pointer", [p for p, _ in removed_keys(base_schema())])
def test_removed_keys_report_deepspeeds_error(oracle: Any, pointer: str) -> None:
    path = pointer[1:].split("/")
    config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1}
    if path[0] == "zero_optimization":
        config["zero_optimization"] = {"stage": 3, path[1]: {} if path[1] == "zeropp_loco_param" else 1}
    else:
        config[path[0]] = {"enabled": False}
    with pytest.raises(Exception) as info:
        oracle.parse_with_deepspeed(config, 1)
    assert type(info.value).__name__ == "DeepSpeedConfigError"
    (finding,) = [f for f in validate_config(config).findings if f.rule_id == "removed-key"]
    assert finding.pointer == pointer and finding.severity == "error" and finding.phase == "config"
    assert str(info.value) in finding.message and "0.19.8" in finding.message


@pytest.mark.parametrize(
    ("config", "dp_size", "rule_id"),
    [
        (
            {"train_batch_size": 17, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4},
            1,
            "batch-mismatch",
        ),
        ({"train_batch_size": 64, "gradient_accumulation_steps": 3}, 8, "batch-mismatch"),
        ({"train_batch_size": 4}, 8, "batch-mismatch"),
        ({"gradient_accumulation_steps": 2}, 1, "batch-missing"),
        (
            {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}},
            1,
            "fp16-bf16-both",
        ),
        (
            {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"cpu_offload": True, "offload_optimizer": {}}},
            1,
            "deprecated-with-replacement",
        ),
        (
            {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True, "fp16_master_weights_and_grads": True}},
            1,
            "master-weights-stage",
        ),
        (
            {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "gradient_allreduce_op": "sum"},
            1,
            "allreduce-sum-conflict",
        ),
        (
            {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0, "compute_grad_norm": False}},
            1,
            "compute-grad-norm",
        ),
        (
            {
                "train_micro_batch_size_per_gpu": 1,
                "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu", "ratio": 0.5}},
            },
            1,
            "partial-offload",
        ),
        (
            {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True, "min_loss_scale": 0}},
            1,
            "fp16-dynamic-loss-scale",
        ),
        (
            {
                "train_micro_batch_size_per_gpu": 1,
                "bf16": {"enabled": True, "bf16_optimizer_states": True},
                "zero_optimization": {"stage": 1},
            },
            1,
            "bf16-optimizer-states",
        ),
        (
            {
                "train_micro_batch_size_per_gpu": 1,
                "data_efficiency": {"data_sampling": {"dynamic_batching": {"enabled": True}}},
            },
            1,
            "data-efficiency-incomplete",
        ),
    ],
)
def test_messages_quote_deepspeed(oracle: Any, config: dict[str, Any], dp_size: int, rule_id: str) -> None:
    accepted, error = oracle.deepspeed_verdict(config, dp_size)
    assert not accepted
    (finding,) = [f for f in validate_config(config, world_size=dp_size).findings if f.rule_id == rule_id]
    deepspeed_text = deepspeed_message(error)
    assert deepspeed_text.rstrip(".") in finding.message, (deepspeed_text, finding.message)


def deepspeed_message(error: str) -> str:
    """The sentence DeepSpeed wrote, without pydantic's or the oracle's decoration."""
    text = error.split(": ", 1)[1]
    for line in text.splitlines():
        if " [type=" in line:  # pydantic: "  Value error, <message> [type=value_error, ...]"
            text = line.split(" [type=")[0].strip()
            break
    text = text.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    # DeepSpeed's batch message has no colon before the numbers; dsgen's has one.
    return text.replace("Check batch related parameters. ", "").replace("world_size ", "world_size: ")


def test_validate_file_reads_what_deepspeed_reads(oracle: Any, tmp_path: Path) -> None:
    """Comments and trailing commas load; a duplicate key is refused by both."""
    import deepspeed.runtime.config as ds_config

    relaxed = tmp_path / "relaxed.json"
    relaxed.write_text('{\n // comment\n "train_micro_batch_size_per_gpu": 2, # more\n "bf16": {"enabled": true,},\n}')
    ds_config.DeepSpeedConfig(str(relaxed))
    from dsgen.validate import validate_file

    assert validate_file(relaxed).ok
    dup = tmp_path / "dup.json"
    dup.write_text('{"train_micro_batch_size_per_gpu": 2, "train_micro_batch_size_per_gpu": 4}')
    with pytest.raises(ValueError, match="Duplicate keys"):
        ds_config.DeepSpeedConfig(str(dup))
    assert [f.rule_id for f in validate_file(dup).errors] == ["duplicate-key"]
    broken = tmp_path / "broken.json"
    broken.write_text('{"train_micro_batch_size_per_gpu": ZERO}')
    with pytest.raises(DsgenError, match=r"broken\.json:1:36"):
        validate_file(broken)
