"""One config that triggers each rule id and one near-miss that must not.

The table covers every id in the registry (checked below), so a new rule cannot ship without a
positive and a negative example.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsgen.validate import RULES, Report, validate_config
from dsgen.validate.schema_findings import base_schema
from tests.conftest import require_module

MB = {"train_micro_batch_size_per_gpu": 2}
ADAMW = {"type": "AdamW", "params": {"lr": 1e-4}}


def z(stage: int, **extra: Any) -> dict[str, Any]:
    return {"zero_optimization": {"stage": stage, **extra}}


def c(*parts: dict[str, Any], batch: bool = True) -> dict[str, Any]:
    """Merge config fragments (one level deep) on top of a valid micro-batch setting."""
    out: dict[str, Any] = dict(MB) if batch else {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = {**out[key], **value}
            else:
                out[key] = value
    return out


OFFLOAD_CPU = {"offload_optimizer": {"device": "cpu"}}

# rule id -> (trigger config, near-miss config, validate_config keyword arguments)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "unknown-key": (c(z(3, stage3_max_live_parameter=10)), c(z(3, stage3_max_live_parameters=10)), {}),
    "ignored-key": ({"train_micro_batch_size_per_gpus": 2, "train_batch_size": 8}, {"train_batch_size": 8}, {}),
    "type-mismatch": (c(z(2, overlap_comm=2)), c(z(2, overlap_comm=True)), {}),
    "invalid-value": (c(z(4)), c(z(3)), {}),
    "out-of-range": (c(z(2, reduce_bucket_size=0)), c(z(2, reduce_bucket_size=1)), {}),
    "non-integer": (
        c(z(3, stage3_prefetch_bucket_size=15099494.4)),
        c(z(3, stage3_prefetch_bucket_size=15099494.0)),
        {},
    ),
    "number-as-string": ({"train_batch_size": "8"}, {"train_batch_size": 8}, {}),
    "removed-key": (c({"amp": {"enabled": False}}), c({"bf16": {"enabled": True}}), {}),
    "renamed-key": (c(z(2, cpu_offload=True), {"optimizer": ADAMW}), c(z(2, **OFFLOAD_CPU), {"optimizer": ADAMW}), {}),
    "deprecated-with-replacement": (c(z(2, cpu_offload=True, **OFFLOAD_CPU)), c(z(2, **OFFLOAD_CPU)), {}),
    "alias-conflict": (
        c(z(3, stage3_max_live_parameters=1, max_live_parameters=1)),
        c(z(3, max_live_parameters=1)),
        {},
    ),
    "auto-value": (
        c({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}),
        c({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}),
        {},
    ),
    "batch-missing": ({"gradient_accumulation_steps": 4}, {"train_batch_size": 8}, {}),
    "batch-mismatch": (
        {"train_batch_size": 17, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4},
        {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4},
        {},
    ),
    "autotp-train-batch-size": (
        {"train_batch_size": 16, "tensor_parallel": {"autotp_size": 4}},
        c({"gradient_accumulation_steps": 2, "tensor_parallel": {"autotp_size": 4}}),
        {},
    ),
    "fp16-bf16-both": (
        c({"fp16": {"enabled": True}, "bf16": {"enabled": True}}),
        c({"fp16": {"enabled": False}, "bf16": {"enabled": True}}),
        {},
    ),
    "fp16-dynamic-loss-scale": (
        c({"fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 0}}),
        c({"fp16": {"enabled": True, "loss_scale": 128, "loss_scale_window": 0}}),
        {},
    ),
    "master-weights-stage": (
        c(z(0), {"fp16": {"enabled": True, "fp16_master_weights_and_grads": True}}),
        c(
            z(2, **OFFLOAD_CPU),
            {"optimizer": ADAMW},
            {"fp16": {"enabled": True, "fp16_master_weights_and_grads": True}},
        ),
        {},
    ),
    "bf16-optimizer-states": (
        c(z(2), {"bf16": {"enabled": True, "bf16_optimizer_states": True}}),
        c(z(2), {"bf16": {"enabled": True, "bf16_optimizer_states": True, "bf16_master_weights_and_grads": True}}),
        {},
    ),
    "master-weights-offload": (
        c(z(2), {"optimizer": ADAMW}, {"fp16": {"enabled": True, "fp16_master_weights_and_grads": True}}),
        c(
            z(2, **OFFLOAD_CPU),
            {"optimizer": ADAMW},
            {"fp16": {"enabled": True, "fp16_master_weights_and_grads": True}},
        ),
        {},
    ),
    "param-dtype-mismatch": (
        c({"bf16": {"enabled": True}, "data_types": {"param_dtype": "fp16"}}),
        c({"bf16": {"enabled": True}, "data_types": {"param_dtype": "bfloat16"}}),
        {},
    ),
    "grad-accum-dtype": (
        c(z(0), {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}),
        c(z(1), {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}),
        {},
    ),
    "autocast-quantized-weights": (
        c(z(3, zero_quantized_weights=True), {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}),
        c(z(3), {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}),
        {},
    ),
    "autocast-dtype-missing": (
        c({"torch_autocast": {"enabled": True}}),
        c({"torch_autocast": {"enabled": True, "dtype": "bf16"}}),
        {},
    ),
    "offload-param-below-stage3": (
        c(z(2, offload_param={"device": "cpu"})),
        c(z(3, offload_param={"device": "cpu"})),
        {},
    ),
    "offload-optimizer-without-zero": (
        c(z(0, **OFFLOAD_CPU), {"optimizer": ADAMW}),
        c(z(1, **OFFLOAD_CPU), {"optimizer": ADAMW}),
        {},
    ),
    "nvme-without-path": (
        c(z(3, offload_param={"device": "nvme"})),
        c(z(2, offload_optimizer={"device": "nvme"}), {"optimizer": ADAMW}),  # ZeRO-2 runs it as CPU offload
        {},
    ),
    "nvme-offload-below-stage3": (
        c(z(2, offload_optimizer={"device": "nvme", "nvme_path": "/nvme"}), {"optimizer": ADAMW}),
        c(z(3, offload_optimizer={"device": "nvme", "nvme_path": "/nvme"}), {"optimizer": ADAMW}),
        {},
    ),
    "stage3-key-below-stage3": (c(z(2, stage3_max_live_parameters=10)), c(z(3, stage3_max_live_parameters=10)), {}),
    "partial-offload": (
        c(z(2, offload_optimizer={"device": "cpu", "ratio": 0.5}), {"optimizer": ADAMW}),
        c(z(3, offload_optimizer={"device": "cpu", "ratio": 0.5}), {"optimizer": ADAMW}),
        {},
    ),
    "compute-grad-norm": (
        c(z(3, compute_grad_norm=False)),
        c(z(2, compute_grad_norm=False), {"gradient_clipping": 0.0}),
        {},
    ),
    "prescale-gradients-zero": (c(z(2), {"prescale_gradients": True}), c(z(1), {"prescale_gradients": True}), {}),
    "predivide-factor-zero": (
        c(z(3), {"gradient_predivide_factor": 2.0}),
        c(z(3, reduce_scatter=False), {"gradient_predivide_factor": 2.0}),
        {},
    ),
    "allgather-bucket-odd": (c(z(2, allgather_bucket_size=500000001)), c(z(2, allgather_bucket_size=500000000)), {}),
    "legacy-stage1": (c(z(1, legacy_stage1=True)), c(z(1, legacy_stage1=False)), {}),
    "zenflow-offload": (
        c(z(2, zenflow={"topk_ratio": 0.05})),
        c(z(2, zenflow={"topk_ratio": 0.05}, **OFFLOAD_CPU), {"optimizer": ADAMW}),
        {},
    ),
    "hpz-world-size": (c(z(3, zero_hpz_partition_size=3)), c(z(3, zero_hpz_partition_size=8)), {"world_size": 8}),
    "allreduce-sum-conflict": (
        c(z(3), {"gradient_allreduce_op": "sum"}),
        c(z(2), {"gradient_allreduce_op": "sum"}),
        {},
    ),
    "elastic-checkpoint-stage3": (c(z(3, elastic_checkpoint=True)), c(z(2, elastic_checkpoint=True)), {}),
    "optimizer-unknown": (c({"optimizer": {"type": "AdamWW"}}), c({"optimizer": {"type": "AdamW"}}), {}),
    "untested-optimizer": (
        c(z(2), {"optimizer": {"type": "SGD", "params": {"lr": 0.1}}}),
        c(z(2), {"optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_allow_untested_optimizer": True}),
        {},
    ),
    "lamb-static-loss-scale": (
        c({"optimizer": {"type": "Lamb"}, "fp16": {"enabled": True, "loss_scale": 128}}),
        c({"optimizer": {"type": "Lamb"}, "fp16": {"enabled": True, "loss_scale": 0}}),
        {},
    ),
    "max-grad-norm": (
        c({"optimizer": {"type": "Adam", "params": {"lr": 1e-4, "max_grad_norm": 1.0}}}),
        c({"optimizer": {"type": "Adam", "params": {"lr": 1e-4}}, "gradient_clipping": 1.0}),
        {},
    ),
    "offload-client-optimizer": (
        c(z(2, **OFFLOAD_CPU)),
        c(z(2, **OFFLOAD_CPU), {"zero_force_ds_cpu_optimizer": False}),
        {},
    ),
    "offload-unsupported-optimizer": (
        c(z(2, **OFFLOAD_CPU), {"optimizer": {"type": "Lamb"}}),
        c(z(2, **OFFLOAD_CPU), {"optimizer": {"type": "Adam"}}),
        {},
    ),
    "muon-reduce-scatter": (
        c(z(3), {"optimizer": {"type": "Muon"}}),
        c(z(3, reduce_scatter=False), {"optimizer": {"type": "Muon"}}),
        {},
    ),
    "scheduler-unknown": (c({"scheduler": {"type": "WarmupLinear"}}), c({"scheduler": {"type": "WarmupLR"}}), {}),
    "scheduler-missing-param": (
        c({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}}),
        c({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 100}}}),
        {},
    ),
    "pipeline-zero-stage": (
        c(z(2), {"pipeline": {"activation_checkpoint_interval": 1}}),
        c(z(1), {"pipeline": {"activation_checkpoint_interval": 1}}),
        {},
    ),
    "pipeline-overlap-comm": (
        c(z(1, overlap_comm=True), {"pipeline": {}}),
        c(z(1, overlap_comm=False), {"pipeline": {}}),
        {},
    ),
    "managed-ga-conflict": (
        c(z(1, overlap_comm=True), {"managed_gradient_accumulation": False}),
        c(z(2, overlap_comm=True), {"managed_gradient_accumulation": False}),
        {},
    ),
    "tp-size-mismatch": (
        c({"tensor_parallel": {"autotp_size": 4, "tp": {"tp_size": 2}}}),
        c({"tensor_parallel": {"autotp_size": 4, "tp": {"tp_size": 4}}}),
        {},
    ),
    "autoep-conflict": (
        c({"expert_parallel": {"enabled": True}, "tensor_parallel": {"autotp_size": 2}}),
        c({"expert_parallel": {"enabled": True, "autoep_size": 2}, "tensor_parallel": {"autotp_size": 2}}),
        {"world_size": 4},
    ),
    # AutoTP / AutoEP per release (dsgen/validate/rules/model_parallel.py; more in test_model_parallel_rules.py)
    "autotp-release": (c({"tensor_parallel": {"autotp_size": 2}}), c(), {"deepspeed_version": "0.14"}),
    "autotp-zero3-release": (
        c({"tensor_parallel": {"autotp_size": 2}}, z(3)),
        c({"tensor_parallel": {"autotp_size": 2}}, z(2)),
        {"deepspeed_version": "0.16"},
    ),
    "autoep-release": (
        c({"expert_parallel": {"enabled": True, "autoep_size": 2}}),
        c({"expert_parallel": {"enabled": False}}),
        {"deepspeed_version": "0.16"},
    ),
    "autotp-ulysses": (
        c({"tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 2}),
        c({"tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 1}),
        {},
    ),
    "autotp-batch-world": (
        c({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 2}}),
        c({"train_batch_size": 16, "tensor_parallel": {"autotp_size": 2}}),
        {"world_size": 8},
    ),
    "data-efficiency-incomplete": (
        c({"data_efficiency": {"data_sampling": {"curriculum_learning": {"enabled": True}}}}),
        c(
            {
                "data_efficiency": {
                    "data_sampling": {"curriculum_learning": {"enabled": True, "curriculum_metrics": {"seqlen": {}}}}
                }
            }
        ),
        {},
    ),
    "contiguous-checkpointing": (
        c({"activation_checkpointing": {"contiguous_memory_optimization": True}}),
        c({"activation_checkpointing": {"contiguous_memory_optimization": True, "number_checkpoints": 4}}),
        {},
    ),
    "aio-gds-cuda": (c({"aio": {"use_gds": True}}), c({"aio": {"use_gds": False}}), {}),
    "vocabulary-size-alignment": (c({"vocabulary_size": 50257}), c({"vocabulary_size": 50304}), {}),
    "zero-section-missing": (
        c({"bf16": {"enabled": True}}),
        c(z(0), {"bf16": {"enabled": True}}),
        {"target": "hf-trainer"},
    ),
}
# duplicate-key needs a file; see test_validate_loader.py and test_duplicate_key_rule below.
FILE_ONLY = {"duplicate-key"}


def ids(report: Report) -> set[str]:
    return {f.rule_id for f in report.findings}


def test_every_rule_has_a_case() -> None:
    assert set(RULES) - FILE_ONLY == set(CASES)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_triggers(rule_id: str) -> None:
    config, _, kwargs = CASES[rule_id]
    report = validate_config(config, **kwargs)
    hits = [f for f in report.findings if f.rule_id == rule_id]
    assert hits, f"{rule_id} did not fire; findings: {report.findings}"
    finding = hits[0]
    assert finding.message and finding.pointer is not None
    assert finding.severity == RULES[rule_id].severity or rule_id in ("offload-client-optimizer", "removed-key")


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_near_miss(rule_id: str) -> None:
    _, near_miss, kwargs = CASES[rule_id]
    report = validate_config(near_miss, **kwargs)
    assert rule_id not in ids(report), report.findings


def test_duplicate_key_rule(tmp_path: Any) -> None:
    from dsgen.validate import validate_file

    dup = tmp_path / "dup.json"
    dup.write_text('{"train_batch_size": 8,\n "fp16": {"enabled": true},\n "train_batch_size": 16}')
    findings = [f for f in validate_file(dup).findings if f.rule_id == "duplicate-key"]
    assert [(f.pointer, f.line, f.column) for f in findings] == [("/train_batch_size", 3, 2)]
    assert "line 1" in findings[0].message
    near = tmp_path / "near.json"
    near.write_text('{"fp16": {"enabled": true}, "bf16": {"enabled": false}, "train_batch_size": 8}')
    assert "duplicate-key" not in ids(validate_file(near))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def _schema_paths() -> list[tuple[str, ...]]:
    """Every top-level key of DeepSpeed's schema and every key one level inside a section."""
    paths: list[tuple[str, ...]] = []
    for key, sub in base_schema()["properties"].items():
        paths.append((key,))
        paths.extend((key, inner) for inner in sub.get("properties", {}))
    return paths


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.sampled_from(_schema_paths()), JSON_VALUES), min_size=1, max_size=4),
    st.sampled_from([1, 8]),
)
def test_no_value_of_any_key_makes_the_validator_raise(
    assignments: list[tuple[tuple[str, ...], Any]], world_size: int
) -> None:
    """Problems in a config are findings, never exceptions (a list where DeepSpeed wants a scheduler
    name once raised TypeError from a rule)."""
    config: dict[str, Any] = dict(MB)
    for path, value in assignments:
        if len(path) == 1:
            config[path[0]] = value
        else:
            parent = config.setdefault(path[0], {})
            if isinstance(parent, dict):
                parent[path[1]] = value
    report = validate_config(config, world_size=world_size)
    assert isinstance(report, Report)


def test_a_non_string_scheduler_type_is_a_finding() -> None:
    report = validate_config({"train_batch_size": 8, "scheduler": {"type": ["WarmupLR"]}})
    assert not report.ok and "/scheduler/type" in {f.pointer for f in report.errors}


# -- details of individual rules ---------------------------------------------------------------
def test_did_you_mean_for_top_level_typo() -> None:
    report = validate_config({"train_micro_batch_size_per_gpus": 2, "train_batch_size": 8})
    (finding,) = report.findings
    assert finding.severity == "warning" and report.ok
    assert finding.hint == "did you mean train_micro_batch_size_per_gpu?"


def test_strict_turns_warnings_into_errors() -> None:
    report = validate_config({"train_micro_batch_size_per_gpus": 2, "train_batch_size": 8}, strict=True)
    assert not report.ok and report.errors[0].rule_id == "ignored-key"


@pytest.mark.parametrize(
    ("config", "world", "expected"),
    [
        # every combination of given/missing keys, replayed exactly as DeepSpeed derives them
        ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}, 8, True),
        ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}, 8, False),
        ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2}, 8, True),  # GA = 64 // 2 // 8 = 4
        ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, 1, False),  # GA = 2, 10 != 8
        ({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 4}, 1, False),  # GA = 0
        ({"train_batch_size": 64, "gradient_accumulation_steps": 4}, 8, True),  # MB = 64 // 8 // 4 = 2
        ({"train_batch_size": 64, "gradient_accumulation_steps": 3}, 8, False),  # MB = 2, 64 != 48
        ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 8, True),
        ({"train_batch_size": 16}, 8, True),  # MB = 2
        ({"train_batch_size": 4}, 8, False),  # MB = 0
        ({"train_batch_size": 12}, 8, False),  # MB = 1, 12 != 8
        ({"train_micro_batch_size_per_gpu": 3}, 8, True),
    ],
)
def test_batch_combinations(config: dict[str, Any], world: int, expected: bool) -> None:
    report = validate_config(config, world_size=world)
    assert ("batch-mismatch" not in ids(report)) is expected, report.findings


def test_batch_message_names_deepspeeds_numbers() -> None:
    report = validate_config(
        {"train_batch_size": 17, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}, world_size=1
    )
    (finding,) = [f for f in report.findings if f.rule_id == "batch-mismatch"]
    assert "17 != 4 * 4 * 1" in finding.message and finding.phase == "config"
    assert "e.g. 16 = 4 x 4 x 1" in finding.hint


def test_batch_without_world_size_accepts_any_consistent_size() -> None:
    assert validate_config(
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}
    ).ok  # W = 8
    assert not validate_config({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}).ok


def test_batch_with_auto_keys_checks_only_the_fixed_factors() -> None:
    auto = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": "auto"}
    assert "batch-mismatch" in ids(validate_config(auto, target="hf-trainer"))
    fine = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": 4,
        "zero_optimization": {"stage": 2},
    }
    assert validate_config(fine, target="hf-trainer", world_size=8).ok
    # the fixed factors include the world size: 12 = 3 x GA x 2 has GA = 2, while 3 x 8 > 12
    twelve = {"train_batch_size": 12, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": "auto"}
    assert "batch-mismatch" not in ids(validate_config(twelve, target="hf-trainer", world_size=2))
    assert "batch-mismatch" in ids(validate_config(twelve, target="hf-trainer", world_size=8))


def test_auto_is_allowed_where_deepspeed_itself_accepts_the_literal() -> None:
    config = c(
        z(2, zenflow={"select_interval": "auto", "update_interval": "auto"}, **OFFLOAD_CPU),
        {"optimizer": ADAMW, "data_types": {"keep_in_fp32_modules": "auto"}},
    )
    assert "auto-value" not in ids(validate_config(config))


def test_auto_value_under_targets() -> None:
    config = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "zero_optimization": {"stage": "auto", "stage3_max_live_parameters": "auto"},
    }
    for target, flagged in (
        (
            "deepspeed",
            {
                "/train_batch_size",
                "/train_micro_batch_size_per_gpu",
                "/zero_optimization/stage",
                "/zero_optimization/stage3_max_live_parameters",
            },
        ),
        ("hf-trainer", {"/zero_optimization/stage3_max_live_parameters"}),
        ("accelerate", {"/zero_optimization/stage3_max_live_parameters"}),
    ):
        report = validate_config(config, target=target)
        assert {f.pointer for f in report.findings if f.rule_id == "auto-value"} == flagged, target
    batch = [f for f in validate_config(config).findings if f.pointer == "/train_batch_size"]
    assert batch[0].phase == "config"  # DeepSpeed's batch arithmetic crashes on the string


def test_unresolved_auto_stage_is_treated_as_deepspeeds_default() -> None:
    # DeepSpeed drops "auto" in pydantic sections: stage "auto" is ZeRO-0, so master weights fail.
    config = c(
        {"zero_optimization": {"stage": "auto"}, "fp16": {"enabled": True, "fp16_master_weights_and_grads": True}}
    )
    assert "master-weights-stage" in ids(validate_config(config))


def test_removed_key_names_version_and_replacement() -> None:
    (finding,) = [f for f in validate_config(c({"curriculum_learning": {"enabled": False}})).findings]
    assert finding.rule_id == "removed-key" and "removed in DeepSpeed 0.19.8" in finding.message
    assert "data_efficiency.data_sampling.curriculum_learning" in finding.hint


def test_removed_key_is_a_warning_for_older_releases() -> None:
    report = validate_config(c({"amp": {"enabled": True}}), deepspeed_version="0.16")
    (finding,) = report.findings
    assert report.ok and finding.severity == "warning" and "0.16.9" in finding.message


def test_one_bit_optimizers_are_only_errors_on_0_19() -> None:
    config = c({"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4}}})
    (finding,) = validate_config(config).findings
    assert finding.rule_id == "optimizer-unknown" and "removed in DeepSpeed 0.19.8" in finding.message
    assert validate_config(config, deepspeed_version="0.16").ok


def test_offload_client_optimizer_is_a_warning_for_plain_deepspeed() -> None:
    (finding,) = [
        f for f in validate_config(c(z(2, **OFFLOAD_CPU))).findings if f.rule_id == "offload-client-optimizer"
    ]
    assert finding.severity == "warning"


def test_nvme_without_path_only_at_stage_3() -> None:
    # DeepSpeed 0.19.8 accepts and trains this: ZeRO-1/2 run any offload device as CPU offload.
    config = {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}},
    }
    found = ids(validate_config(config))
    assert "nvme-without-path" not in found and "nvme-offload-below-stage3" in found
    assert "nvme-without-path" not in ids(validate_config(c(z(1, offload_param={"device": "nvme"}))))
    stage3 = c(z(3, offload_optimizer={"device": "nvme"}), {"optimizer": ADAMW})
    assert "nvme-without-path" in ids(validate_config(stage3))


def test_offload_client_optimizer_fires_at_stage_0() -> None:
    # engine.zero_use_cpu_optimizer() only reads the device, so ZeRO-0 rejects a client optimizer too.
    report = validate_config(c(z(0, **OFFLOAD_CPU)))
    (finding,) = [f for f in report.findings if f.rule_id == "offload-client-optimizer"]
    assert finding.severity == "warning"
    # accelerate (and the HF Trainer on it) swaps in DeepSpeed's CPU optimizer: it runs
    assert "offload-client-optimizer" not in ids(validate_config(c(z(0, **OFFLOAD_CPU)), target="hf-trainer"))
    assert "offload-client-optimizer" not in ids(validate_config(c(z(0, **OFFLOAD_CPU), {"optimizer": ADAMW})))


def test_offload_optimizer_without_zero_is_not_described_as_ignored() -> None:
    text = RULES["offload-optimizer-without-zero"].deepspeed
    assert "silently ignored" not in text.lower() and "ZeRORuntimeException" in text and "CPUAdam" in text
    (finding,) = [
        f
        for f in validate_config(c(z(0, **OFFLOAD_CPU), {"optimizer": ADAMW})).findings
        if f.rule_id == "offload-optimizer-without-zero"
    ]
    assert "no effect" not in finding.message


def test_zenflow_auto_counts_as_unset() -> None:
    # DeepSpeed's pydantic model drops "auto": zenflow is None and DeepSpeedConfig accepts this.
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 8,
        "gradient_allreduce_op": "sum",
        "zero_optimization": {"stage": 2, "zenflow": "auto"},
    }
    for target in ("deepspeed", "hf-trainer"):
        assert "allreduce-sum-conflict" not in ids(validate_config(config, target=target))
    zenflow = {**config, "zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.05}}}
    assert "allreduce-sum-conflict" in ids(validate_config(zenflow))
    grad_norm = c(z(2, compute_grad_norm=False, zenflow="auto"), {"gradient_clipping": 0.0})
    assert "compute-grad-norm" not in ids(validate_config(grad_norm))


AUTOEP_TP = {"expert_parallel": {"enabled": True, "autoep_size": 2}, "tensor_parallel": {"autotp_size": 2}}


@pytest.mark.parametrize(
    ("extra", "pointer"),
    [
        ({"expert_parallel": {"autoep_size": 1}}, "/expert_parallel/autoep_size"),
        ({"compile": {"deepcompile": True}}, "/compile/deepcompile"),
        ({"pipeline": {"activation_checkpoint_interval": 1}}, "/pipeline"),
        ({"use_data_before_expert_parallelism": True}, "/use_data_before_expert_parallelism"),
        (z(1, offload_optimizer={"device": "none"}), "/zero_optimization/offload_optimizer"),
        (z(3, offload_param={"device": "cpu"}), "/zero_optimization/offload_param"),
        (z(2, cpu_offload=True), "/zero_optimization/cpu_offload"),
        ({"expert_parallel": {"async_split_plan": True}}, "/expert_parallel/async_split_plan"),
        ({"expert_parallel": {"combine_impl": "fused_weighted_sum"}}, "/expert_parallel/combine_impl"),
    ],
)
def test_autoep_autotp_folding_conflicts(extra: dict[str, Any], pointer: str) -> None:
    report = validate_config(c(AUTOEP_TP, extra), world_size=4)
    assert pointer in {f.pointer for f in report.findings if f.rule_id == "autoep-conflict"}, report.findings


@pytest.mark.parametrize(
    "config",
    [
        c(AUTOEP_TP),
        c(AUTOEP_TP, z(2), {"bf16": {"enabled": True}}),
        c(AUTOEP_TP, z(2, offload_optimizer=None)),  # null is no offload block
        # without AutoTP the folding checks do not apply
        c({"expert_parallel": {"enabled": True, "async_split_plan": True}}, z(2, **OFFLOAD_CPU), {"optimizer": ADAMW}),
    ],
)
def test_autoep_with_autotp_is_supported(config: dict[str, Any]) -> None:
    # 0.19.8 folds AutoTP into AutoEP; only autoep_size 1 and the combinations above are rejected.
    assert "autoep-conflict" not in ids(validate_config(config, world_size=4))


@pytest.mark.parametrize(
    ("config", "rule_id"),
    [
        # pydantic lax mode: "true" is True, "0" is 0 (DeepSpeedConfig rejects all four)
        (c({"fp16": {"enabled": "true"}, "bf16": {"enabled": True}}), "fp16-bf16-both"),
        (c({"fp16": {"enabled": 1}, "bf16": {"enabled": "yes"}}), "fp16-bf16-both"),
        (c({"fp16": {"enabled": True, "min_loss_scale": "0"}}), "fp16-dynamic-loss-scale"),
        (c({"fp16": {"enabled": True, "loss_scale": "0", "loss_scale_window": "0"}}), "fp16-dynamic-loss-scale"),
        (c({"gradient_allreduce_op": "sum", "compile": {"deepcompile": "true"}}), "allreduce-sum-conflict"),
        # get_scalar_param + truthiness: 1 enables curriculum learning
        (
            c({"data_efficiency": {"data_sampling": {"curriculum_learning": {"enabled": 1}}}}),
            "data-efficiency-incomplete",
        ),
    ],
)
def test_values_deepspeed_converts_count(config: dict[str, Any], rule_id: str) -> None:
    assert rule_id in ids(validate_config(config)), validate_config(config).findings


@pytest.mark.parametrize(
    ("config", "rule_id"),
    [
        (c({"fp16": {"enabled": "no"}, "bf16": {"enabled": True}}), "fp16-bf16-both"),
        (c({"fp16": {"enabled": "false"}, "bf16": {"enabled": "1"}}), "fp16-bf16-both"),
        (c({"fp16": {"enabled": True, "min_loss_scale": "2"}}), "fp16-dynamic-loss-scale"),
        (c({"fp16": {"enabled": True, "loss_scale": "128", "loss_scale_window": "0"}}), "fp16-dynamic-loss-scale"),
        (c({"gradient_allreduce_op": "sum", "compile": {"deepcompile": "off"}}), "allreduce-sum-conflict"),
        (
            c({"data_efficiency": {"data_sampling": {"curriculum_learning": {"enabled": 0}}}}),
            "data-efficiency-incomplete",
        ),
    ],
)
def test_values_deepspeed_converts_to_off(config: dict[str, Any], rule_id: str) -> None:
    assert rule_id not in ids(validate_config(config))


def test_bf16_null_falls_back_to_bfloat16() -> None:
    # precision_config.py: param_dict.get("bf16") is None -> the bfloat16 block is read.
    config = c({"bf16": None, "bfloat16": {"enabled": True}, "fp16": {"enabled": True}})
    report = validate_config(config)
    (finding,) = [f for f in report.findings if f.rule_id == "fp16-bf16-both"]
    assert finding.pointer == "/bfloat16/enabled"
    (renamed,) = [f for f in report.findings if f.rule_id == "renamed-key"]
    assert "ignores bfloat16 entirely" not in renamed.message


def test_renamed_key_bfloat16_shadowed_by_bf16() -> None:
    config = c({"bf16": {"enabled": False}, "bfloat16": {"enabled": True}})
    (finding,) = validate_config(config).findings
    assert finding.rule_id == "renamed-key" and "ignores bfloat16 entirely" in finding.message


def test_misplaced_keys_get_a_specific_hint() -> None:
    report = validate_config(c(z(3, aio={"block_size": 1048576})))
    (finding,) = report.findings
    assert finding.rule_id == "unknown-key" and "top-level section" in finding.hint
    report = validate_config(c({"aio": {"thread_count": 2}}))
    assert report.findings[0].hint.endswith("intra_op_parallelism")


def test_findings_without_positions_sort_by_pointer() -> None:
    report = validate_config(c(z(2, offload_param={"device": "cpu"}, stage3_max_live_parameters=1)))
    assert [f.pointer for f in report.findings] == sorted(f.pointer for f in report.findings)


def test_non_object_config() -> None:
    report = validate_config([1, 2])  # type: ignore[arg-type]
    assert [f.rule_id for f in report.findings] == ["type-mismatch"]


@pytest.mark.parametrize("kwargs", [{"world_size": 0}, {"target": "slurm"}, {"deepspeed_version": "0.10"}])
def test_bad_settings_raise_dsgen_error(kwargs: dict[str, Any]) -> None:
    from dsgen.errors import DsgenError

    with pytest.raises(DsgenError):
        validate_config(MB, **kwargs)


def test_catalogue_documents_every_rule() -> None:
    """docs/validation.md lists each rule id once, with the registry's severity and phase."""
    import re

    from tests.conftest import REPO_ROOT

    text = (REPO_ROOT / "docs" / "validation.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (error|warning) \| (config load|engine start|never) \|", text, re.M)
    phases = {"config load": "config", "engine start": "engine", "never": "lint"}
    documented = {rule_id: (severity, phases[phase]) for rule_id, severity, phase in rows}
    assert len(rows) == len(documented)
    assert documented == {r.rule_id: (r.severity, r.phase) for r in RULES.values()}


def deepspeed_offloads_parameters_under_deepcompile(config: dict[str, Any]) -> bool:
    """What DeepSpeed itself decides: its ``DeepSpeedEngine.get_deepcompile_backend`` run on the
    ``DeepSpeedConfig`` it builds from ``config``, on a stand-in engine (the attributes that method
    reads) with the ZeRO initialisers it hands off to replaced, then its
    ``compile_config.offload_parameters`` read back."""
    from unittest import mock

    from deepspeed.runtime.engine import DeepSpeedEngine

    from tests.ds_oracle import parse_with_deepspeed

    class Engine:
        zero_optimization_stage = DeepSpeedEngine.zero_optimization_stage

        def __init__(self) -> None:
            self.config = config  # the dict deepspeed.initialize(config=...) hands the engine
            self._config = parse_with_deepspeed(config, dp_size=1)

    engine = Engine()
    with (
        mock.patch("deepspeed.compile.init_z1_and_2.init_z1_and_2", return_value="backend"),
        mock.patch("deepspeed.compile.init_z3.init_z3", return_value="backend"),
    ):
        DeepSpeedEngine.get_deepcompile_backend(engine, "inductor", {}, None)  # type: ignore[arg-type]
    return bool(engine._config.compile_config.offload_parameters)


DEEPCOMPILE_OFFLOADS = [
    (stage, param, optimizer)
    for stage in (1, 2)
    for param in ({"offload_param": {"device": "cpu"}}, {"offload_param": {"device": "nvme", "nvme_path": "/n"}})
    for optimizer in (
        {},
        {"offload_optimizer": {"device": "none"}},
        {"offload_optimizer": {"device": "cpu"}},
        {"offload_optimizer": {"device": "nvme", "nvme_path": "/n"}},
        {"cpu_offload": True},
    )
]


@pytest.mark.parametrize(("stage", "param", "optimizer"), DEEPCOMPILE_OFFLOADS)
def test_offload_param_below_stage3_under_deepcompile_follows_deepspeed(
    stage: int, param: dict[str, Any], optimizer: dict[str, Any]
) -> None:
    """Under DeepCompile, offload_param below stage 3 is flagged unless DeepSpeed hands it to
    DeepCompile (both offloads on the cpu): the expectation is DeepSpeed's own decision."""
    require_module("deepspeed")
    config = c(z(stage, **param, **optimizer), {"optimizer": ADAMW, "compile": {"deepcompile": True}})
    taken = deepspeed_offloads_parameters_under_deepcompile(config)
    flagged = "offload-param-below-stage3" in ids(validate_config(config))
    assert flagged is not taken, (taken, config)


def test_deepcompile_takes_only_the_cpu_pair() -> None:
    """The cases above are not all one way: DeepSpeed takes exactly the cpu/cpu pair among them."""
    require_module("deepspeed")
    taken = [
        (stage, param, optimizer)
        for stage, param, optimizer in DEEPCOMPILE_OFFLOADS
        if deepspeed_offloads_parameters_under_deepcompile(
            c(z(stage, **param, **optimizer), {"optimizer": ADAMW, "compile": {"deepcompile": True}})
        )
    ]
    assert [(s, p["offload_param"]["device"], o) for s, p, o in taken] == [
        (1, "cpu", {"offload_optimizer": {"device": "cpu"}}),
        (2, "cpu", {"offload_optimizer": {"device": "cpu"}}),
    ]
