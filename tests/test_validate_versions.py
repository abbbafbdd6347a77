"""--deepspeed-version: what DeepSpeed 0.14, 0.16 and 0.19 read differently."""

from __future__ import annotations

from typing import Any

import pytest

from dsgen.facts.release import normalize_version
from dsgen.validate import validate_config

MB = {"train_micro_batch_size_per_gpu": 2}


def rules(config: dict[str, Any], version: str) -> dict[str, str]:
    return {f.rule_id: f.severity for f in validate_config({**MB, **config}, deepspeed_version=version).findings}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.19", "0.19"),
        ("0.19.8", "0.19"),
        ("v0.16.9", "0.16"),
        ("0.14", "0.14"),
        (" 0.16 ", "0.16"),
        ("0.14.5", "0.14"),
        ("0.15.4", "0.16"),  # the nearest profile read from a wheel
        ("0.17.0", "0.16"),  # fp16/bf16 still dict-based
        ("0.17.1", "0.19"),
        ("0.18.5", "0.19"),
    ],
)
def test_normalize_version(text: str, expected: str) -> None:
    assert normalize_version(text) == expected


@pytest.mark.parametrize("text", ["0.15", "0.18", "0.13.1", "0.20.0", "1.0", "latest", "0.19.8.1", ""])
def test_unsupported_versions(text: str) -> None:
    with pytest.raises(ValueError, match=r"0\.14, 0\.16 or 0\.19"):
        normalize_version(text)


def test_fp16_bf16_were_dict_based_before_0_17() -> None:
    config = {"bf16": {"enabled": True, "loss_scale": 0}, "fp16": {"min_loss_scale": 0.5}}
    assert rules(config, "0.19") == {"unknown-key": "error", "non-integer": "error"}
    assert rules(config, "0.16") == {"ignored-key": "warning"}


def test_newer_keys_are_unknown_to_older_releases() -> None:
    zenflow = {
        "zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.1}, "offload_optimizer": {"device": "cpu"}},
        "optimizer": {"type": "AdamW"},
    }
    assert "unknown-key" not in rules(zenflow, "0.19")
    assert rules(zenflow, "0.16")["unknown-key"] == "error"  # ZeRO was strict already
    autocast = {"torch_autocast": {"enabled": True, "dtype": "bf16"}}
    assert rules(autocast, "0.19") == {}
    assert rules(autocast, "0.16") == {"ignored-key": "warning"}
    compile_section = {"compile": {"deepcompile": True}}
    assert rules(compile_section, "0.16") == {}
    assert rules(compile_section, "0.14") == {"ignored-key": "warning"}


def test_removed_features_were_valid_before_0_19() -> None:
    config = {"zero_optimization": {"stage": 3, "mics_shard_size": 8}, "sparse_gradients": True}
    assert rules(config, "0.19") == {"removed-key": "error"}
    assert rules(config, "0.16") == {"removed-key": "warning"}
    assert rules({"zero_optimization": {"stage": 3, "zeropp_loco_param": {"err_beta": 0.8}}}, "0.14") == {
        "unknown-key": "error"
    }  # LoCo only existed in 0.15-0.19.6


def test_rules_for_newer_features_only_apply_where_they_exist() -> None:
    config = {"zero_optimization": {"stage": 3}, "gradient_allreduce_op": "sum"}
    assert rules(config, "0.19") == {"allreduce-sum-conflict": "error"}
    assert rules(config, "0.16") == {"ignored-key": "warning"}
    assert rules({"zero_optimization": {"stage": 1, "reduce_bucket_size": 0}}, "0.16") == {}
    assert rules({"zero_optimization": {"stage": 1, "reduce_bucket_size": 0}}, "0.19") == {"out-of-range": "error"}
