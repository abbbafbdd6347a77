"""AutoTP and AutoEP rules (dsgen/facts/model_parallel.py, dsgen/validate/rules/model_parallel.py) against
DeepSpeed's own code.

1. Per rule of the pure module, a layout that breaks it and a near miss that does not.
2. Where DeepSpeed 0.19.8 can be asked in-process, it is: ``build_folding_spec``,
   ``validate_folding_global``, ``validate_autoep_config``, ``validate_autoep_post_detection``,
   ``DeepSpeedEngine._validate_zero3_moe_compatibility``, ``TPPlanConverter.convert`` on tiny HF MoE
   models, the AutoEP preset registry and ``DeepSpeedConfig``'s batch assertion; each verdict must
   equal the pure module's.
3. The ``dsgen validate`` rules: a config that triggers each and one that does not.
4. Slow: 2 CPU ranks under torchrun with a tiny Llama and ``autotp_size`` 2 show the batch world
   DeepSpeed asserts under AutoTP (``micro x accumulation x 2`` trains, ``x 1`` is refused), that
   0.19.8 trains AutoTP with ZeRO-3, and that AutoTP with a Ulysses mpu fails at the first forward.

The release boundaries (0.16.4, 0.19.2, 0.19.3, 0.19.4) were read in DeepSpeed's git tags, which the
tests cannot install; they are pinned here as data (docs/model-parallel.md cites the tags).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dsgen.facts.model_parallel import (
    AUTOEP_PRESETS,
    Layout,
    ModelFacts,
    autoep_preset_for,
    batch_world,
    tp_batch,
    violations,
)
from dsgen.validate import RULES, validate_config
from tests.conftest import REPO_ROOT, require_module

MOE = ModelFacts(moe_experts=(8, 8), model_type="mixtral", kv_heads=8)


def rules_of(layout: Layout) -> set[str]:
    return {v.rule for v in violations(layout)}


# -- 1. the pure module ---------------------------------------------------------------------------
# rule id -> (a layout that breaks it, a near miss)
PURE_CASES: dict[str, tuple[Layout, Layout]] = {
    "autotp-release": (Layout(tp=2, release="0.16.3"), Layout(tp=2, release="0.16.4")),
    "autotp-zero3-release": (
        Layout(tp=2, zero_stage=3, release="0.19.3"),
        Layout(tp=2, zero_stage=3, release="0.19.4"),
    ),
    "autoep-release": (Layout(autoep=True, ep=2, release="0.19.1"), Layout(autoep=True, ep=2, release="0.19.2")),
    "autoep-zero3-release": (
        Layout(autoep=True, ep=2, zero_stage=3, release="0.19.2"),
        Layout(autoep=True, ep=2, zero_stage=3, release="0.19.3"),
    ),
    "autoep-autotp-release": (
        Layout(autoep=True, ep=2, tp=2, release="0.19.2"),
        Layout(autoep=True, ep=2, tp=2, release="0.19.3"),
    ),
    "autoep-autotp-zero3-release": (
        Layout(autoep=True, ep=2, tp=2, zero_stage=3, release="0.19.5"),
        Layout(autoep=True, ep=2, tp=2, zero_stage=3, release="0.19.8"),
    ),
    "autotp-world": (Layout(world=6, tp=4), Layout(world=8, tp=4)),
    "autotp-ulysses": (Layout(world=4, tp=2, sp=2), Layout(world=4, tp=2)),
    "autotp-moe-partition": (Layout(tp=2, model=MOE), Layout(tp=2, partition_config=True, model=MOE)),
    "autotp-kv-heads": (Layout(tp=8, model=ModelFacts(kv_heads=4)), Layout(tp=4, model=ModelFacts(kv_heads=4))),
    "autoep-size-world": (Layout(world=6, autoep=True, ep=4), Layout(world=6, autoep=True, ep=2)),
    "autoep-size-experts": (
        Layout(autoep=True, ep=4, model=ModelFacts(moe_experts=(8, 6))),
        Layout(autoep=True, ep=2, model=ModelFacts(moe_experts=(8, 6))),
    ),
    "autoep-model-type": (
        Layout(autoep=True, ep=2, model=ModelFacts(moe_experts=(16,), model_type="llama4_text")),
        Layout(autoep=True, ep=2, model=ModelFacts(moe_experts=(16,), model_type="qwen2_moe")),
    ),
    "autoep-zero3-conflict": (
        Layout(autoep=True, ep=2, zero_stage=3, quantized_gradients=True),
        Layout(autoep=True, ep=2, zero_stage=2, quantized_gradients=True),
    ),
    "autoep-autotp-conflict": (Layout(autoep=True, ep=1, tp=2), Layout(autoep=True, ep=2, tp=2)),
}


def documented_rules() -> dict[str, str]:
    """docs/model-parallel.md's rules table: rule id -> the 'DeepSpeed raises' column."""
    text = (REPO_ROOT / "docs" / "model-parallel.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|(.*)$", text, re.M)
    return {rule_id: rest for rule_id, rest in rows}


def test_every_documented_rule_has_a_case() -> None:
    """docs/model-parallel.md lists the pure module's rules and the validate-only batch rule, each once."""
    assert set(documented_rules()) == set(PURE_CASES) | {"autotp-batch-world"}


@pytest.mark.parametrize("rule_id", sorted(PURE_CASES))
def test_pure_rule_fires_and_near_miss_does_not(rule_id: str) -> None:
    bad, near = PURE_CASES[rule_id]
    found = [v for v in violations(bad) if v.rule == rule_id]
    assert found, violations(bad)
    assert found[0].message and found[0].source and found[0].field
    assert rule_id not in rules_of(near), violations(near)


def test_a_plain_layout_breaks_nothing() -> None:
    assert violations(Layout(world=8, tp=2, zero_stage=2, model=ModelFacts(kv_heads=8))) == ()
    mixtral = ModelFacts((8, 8), "mixtral")
    assert (
        violations(Layout(world=8, autoep=True, ep=4, tp=2, zero_stage=3, partition_config=True, model=mixtral)) == ()
    )


def test_release_violations_name_the_release_that_supports_them() -> None:
    since = {v.rule: v.since for v in violations(Layout(tp=2, zero_stage=3, release="0.18.5"))}
    assert since == {"autotp-zero3-release": "0.19.4"}
    older = violations(Layout(tp=2, autoep=True, ep=2, release="0.16.9"))
    assert {(v.rule, v.since, v.raises) for v in older} == {("autoep-release", "0.19.2", False)}


def test_autoep_presets_follow_the_release() -> None:
    assert autoep_preset_for("qwen2_moe", "0.19.2") == "qwen3_moe"
    assert autoep_preset_for("minimax_m3_vl_text", "0.19.5") is None
    assert autoep_preset_for("minimax_m3_vl_text", "0.19.8") == "minimax_m3"
    later = violations(Layout(autoep=True, ep=2, release="0.19.5", model=ModelFacts((8,), "minimax_m3_vl_text")))
    assert [(v.rule, v.since) for v in later] == [("autoep-model-type", "0.19.8")]


def test_autoep_on_a_dense_model_warns_and_with_a_preset_raises() -> None:
    dense = ModelFacts(moe_experts=None, model_type="llama")
    (plain,) = violations(Layout(autoep=True, ep=2, model=dense))
    assert (plain.rule, plain.raises) == ("autoep-model-type", False)
    (preset,) = violations(Layout(autoep=True, ep=2, ep_preset="mixtral", model=dense))
    assert preset.raises


def test_tp_batch_counts_each_sample_once_per_tp_rank() -> None:
    batch = tp_batch(micro=2, accumulation=4, world=16, tp=4)
    assert (batch.asserted_world, batch.train_batch_size, batch.data_parallel) == (16, 128, 4)
    assert (batch.samples_per_step, batch.overcount) == (32, 4)
    assert batch_world(8, sp=2) == 4.0 and batch_world(8) == 8
    with pytest.raises(ValueError):
        tp_batch(1, 1, world=6, tp=4)


# -- 2. DeepSpeed's own code gives the same verdicts ----------------------------------------------
@pytest.fixture(scope="module")
def ds() -> SimpleNamespace:
    require_module("deepspeed")
    from tests import ds_oracle

    ds_oracle.deepspeed_verdict({"train_micro_batch_size_per_gpu": 1}, 1)  # imports deepspeed with DS_ACCELERATOR=cpu
    from deepspeed.module_inject import auto_ep_config, auto_ep_folding
    from deepspeed.module_inject.auto_ep_presets.registry import PRESET_MODELS
    from deepspeed.runtime.engine import DeepSpeedEngine

    return SimpleNamespace(
        config=auto_ep_config, folding=auto_ep_folding, presets=PRESET_MODELS, engine=DeepSpeedEngine, oracle=ds_oracle
    )


def _raises(call: Callable[[], object], kind: type[BaseException] = ValueError) -> str | None:
    try:
        call()
    except kind as exc:
        return str(exc)
    return None


def _autoep_engine_check(ds: SimpleNamespace, lay: Layout) -> str | None:
    """engine.py _configure_expert_parallel's two calls, on the layout's sizes (pp 1, no mpu)."""
    assert lay.world is not None
    config = ds.config.parse_autoep_config({"enabled": True, "autoep_size": lay.ep})

    def run() -> None:
        ds.config.validate_autoep_config(config, lay.world, 1, lay.tp, lay.sp)
        spec = ds.folding.build_folding_spec(
            world_size=lay.world,
            pp_size=1,
            tp_size=max(lay.tp, 1),
            ep_size=lay.ep,
            mp_mode="tp" if lay.tp > 1 else "sp",
        )
        ds.folding.validate_folding_global(
            spec,
            zero_stage=lay.zero_stage,
            sp_size=lay.sp,
            zero_offload_optimizer=lay.offload_optimizer,
            zero_offload_param=lay.offload_param,
        )

    return _raises(run)


AUTOEP_LAYOUTS = [
    Layout(world=8, autoep=True, ep=2, tp=2),
    Layout(world=8, autoep=True, ep=1, tp=2),
    Layout(world=8, autoep=True, ep=4, tp=2, offload_optimizer=True),
    Layout(world=8, autoep=True, ep=2, tp=2, offload_param=True, zero_stage=3),
    Layout(world=8, autoep=True, ep=2, tp=2, sp=2),
    Layout(world=8, autoep=True, ep=2, tp=2, zero_stage=3),
    Layout(world=6, autoep=True, ep=4),
    Layout(world=6, autoep=True, ep=3, tp=2),
    Layout(world=6, autoep=True, ep=2, tp=4),
    Layout(world=8, autoep=True, ep=8, sp=2, zero_stage=2),
]
ENGINE_START_RULES = {"autotp-world", "autotp-ulysses", "autoep-size-world", "autoep-autotp-conflict"}


@pytest.mark.deepspeed
@pytest.mark.parametrize("lay", AUTOEP_LAYOUTS, ids=str)
def test_autoep_engine_checks_agree(ds: SimpleNamespace, lay: Layout) -> None:
    message = _autoep_engine_check(ds, lay)
    found = [v for v in violations(lay) if v.rule in ENGINE_START_RULES]
    assert (message is not None) == bool(found), (message, found)
    if found:
        assert found[0].message.split(" (")[0].rstrip(".") in message, (message, found)


def _zero3_check(ds: SimpleNamespace, lay: Layout) -> str | None:
    """DeepSpeedEngine._validate_zero3_moe_compatibility on an engine stand-in with one AutoEP layer."""
    import torch
    from deepspeed.module_inject.auto_ep_layer import AutoEPMoELayer

    layer = AutoEPMoELayer.__new__(AutoEPMoELayer)
    torch.nn.Module.__init__(layer)
    engine = SimpleNamespace(
        has_moe_layers=True,
        module=torch.nn.Sequential(layer),
        sequence_parallel_size=lay.sp,
        zero_quantized_gradients=lambda: lay.quantized_gradients,
        _config=SimpleNamespace(
            zero_config=SimpleNamespace(zero_hpz_partition_size=lay.hpz),
            expert_parallel_config=SimpleNamespace(expert_tensor_parallel_size=1),
        ),
    )
    return _raises(lambda: ds.engine._validate_zero3_moe_compatibility(engine), AssertionError)


@pytest.mark.deepspeed
@pytest.mark.parametrize(
    "lay",
    [
        Layout(autoep=True, ep=2, zero_stage=3),
        Layout(autoep=True, ep=2, zero_stage=3, sp=2),
        Layout(autoep=True, ep=2, zero_stage=3, quantized_gradients=True),
        Layout(autoep=True, ep=2, zero_stage=3, hpz=2),
        Layout(autoep=True, ep=2, zero_stage=3, tp=2),
    ],
    ids=str,
)
def test_autoep_zero3_checks_agree(ds: SimpleNamespace, lay: Layout) -> None:
    message = _zero3_check(ds, lay)
    found = [v for v in violations(lay) if v.rule == "autoep-zero3-conflict"]
    assert (message is not None) == bool(found), (message, found)
    if found:
        assert found[0].message == message


@pytest.mark.deepspeed
@pytest.mark.parametrize("experts", [(8, 8), (8, 6), (2,), (12, 12, 4)])
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_autoep_expert_counts_agree(ds: SimpleNamespace, experts: tuple[int, ...], ep: int) -> None:
    config = ds.config.parse_autoep_config({"enabled": True, "autoep_size": ep})
    specs = [
        SimpleNamespace(
            moe_module_name=f"model.layers.{i}.mlp",
            num_experts=n,
            score_apply="post",
            num_expert_groups=None,
            num_limited_groups=None,
        )
        for i, n in enumerate(experts)
    ]
    message = _raises(lambda: ds.config.validate_autoep_post_detection(config, specs))
    found = [
        v for v in violations(Layout(autoep=True, ep=ep, model=ModelFacts(experts))) if v.rule == "autoep-size-experts"
    ]
    assert (message is not None) == bool(found), (message, found)


@pytest.mark.deepspeed
def test_autoep_presets_are_deepspeeds(ds: SimpleNamespace) -> None:
    assert {p.name: p.hf_model_types for p in AUTOEP_PRESETS} == {
        name: tuple(preset.hf_model_types) for name, preset in ds.presets.items()
    }
    config = ds.config.parse_autoep_config({"enabled": True, "autoep_size": 2, "preset_model": "llama"})
    message = _raises(lambda: ds.config.validate_autoep_config(config, 4, 1, 1, 1))
    (found,) = violations(Layout(world=4, autoep=True, ep=2, ep_preset="llama"))
    assert found.rule == "autoep-model-type" and message is not None
    assert message.startswith(found.message.split(" Available")[0])


@pytest.mark.deepspeed
@pytest.mark.parametrize("model", ["mixtral", "qwen3_moe", "llama"])
def test_autotp_refuses_an_moe_models_hf_plan(ds: SimpleNamespace, model: str) -> None:
    """What _apply_autotp_partitioning does without partition_config/preset_model: convert the HF plan."""
    require_module("transformers")
    import transformers
    from deepspeed.module_inject.tp_plan_converter import TPPlanConverter
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig, _get_hf_tp_plan

    small: dict[str, Any] = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    small |= {"num_attention_heads": 4, "num_key_value_heads": 2}
    built = {
        "mixtral": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(**small, num_local_experts=4)),
        "qwen3_moe": lambda: transformers.Qwen3MoeForCausalLM(
            transformers.Qwen3MoeConfig(**small, num_experts=4, moe_intermediate_size=32)
        ),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**small)),
    }[model]()
    message = _raises(lambda: TPPlanConverter.convert(_get_hf_tp_plan(built)))
    moe = ModelFacts(moe_experts=(4,)) if model != "llama" else ModelFacts()
    found = [v for v in violations(Layout(tp=2, model=moe)) if v.rule == "autotp-moe-partition"]
    assert (message is not None) == bool(found), (message, found)
    if found:
        assert message == found[0].message
    # A preset (or a partition_config) takes the engine's partition_config branch before the HF plan.
    assert TPTrainingConfig(autotp_size=2, preset_model="mixtral").get_partition_config_object() is not None
    assert not [
        v for v in violations(Layout(tp=2, partition_config=True, model=moe)) if v.rule == "autotp-moe-partition"
    ]


# -- 3. dsgen validate -----------------------------------------------------------------------------
MB = {"train_micro_batch_size_per_gpu": 1}
TP2 = {"tensor_parallel": {"autotp_size": 2}}
AUTOEP = {"expert_parallel": {"enabled": True, "autoep_size": 2}}
Z3 = {"zero_optimization": {"stage": 3}}

# rule id -> (config, near miss, validate_config keyword arguments)
VALIDATE_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "autotp-release": ({**MB, **TP2}, MB, {"deepspeed_version": "0.14"}),
    "autotp-zero3-release": ({**MB, **TP2, **Z3}, {**MB, **TP2, **Z3}, {"deepspeed_version": "0.16"}),
    "autoep-release": ({**MB, **AUTOEP}, {**MB, "expert_parallel": {"enabled": False}}, {"deepspeed_version": "0.16"}),
    "autotp-ulysses": ({**MB, **TP2, "sequence_parallel_size": 2}, {**MB, **TP2, "sequence_parallel_size": 1}, {}),
    "autotp-batch-world": (
        {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, **TP2},
        {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, **TP2},
        {"world_size": 8},
    ),
}
NEAR_MISS_OVERRIDES = {"autotp-zero3-release": {"deepspeed_version": "0.19"}}


def test_every_validate_rule_of_the_module_has_a_case() -> None:
    from dsgen.validate.rules import model_parallel
    from dsgen.validate.rules.registry import CHECKS

    mine = {info.rule_id for info, check in CHECKS if check.__module__ == model_parallel.__name__}
    assert mine == set(VALIDATE_CASES)
    assert mine <= set(documented_rules())


@pytest.mark.parametrize("rule_id", sorted(VALIDATE_CASES))
def test_validate_rule_fires_and_near_miss_does_not(rule_id: str) -> None:
    config, near, kwargs = VALIDATE_CASES[rule_id]
    hits = [f for f in validate_config(config, **kwargs).findings if f.rule_id == rule_id]
    assert hits and hits[0].severity == RULES[rule_id].severity, hits
    near_kwargs = {**kwargs, **NEAR_MISS_OVERRIDES.get(rule_id, {})}
    assert rule_id not in {f.rule_id for f in validate_config(near, **near_kwargs).findings}


def test_autotp_ulysses_with_autoep_is_autoep_conflicts() -> None:
    config = {**MB, **TP2, **AUTOEP, "sequence_parallel_size": 2}
    ids = {f.rule_id for f in validate_config(config).findings}
    assert "autoep-conflict" in ids and "autotp-ulysses" not in ids
    # 0.16 ignores expert_parallel, so it is AutoTP with Ulysses there.
    assert "autotp-ulysses" in {f.rule_id for f in validate_config(config, deepspeed_version="0.16").findings}


@pytest.mark.parametrize(
    ("batch", "world", "fires"),
    [
        ({"train_batch_size": 8, "gradient_accumulation_steps": 2}, 8, True),  # micro 1 x 2 x 4
        ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4}, 4, True),  # 4 x 1 x 2
        ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2}, 8, False),
        ({"train_batch_size": 9, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2}, 8, False),
        ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2}, 6, False),
        ({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 1}, 8, False),
    ],
)
def test_autotp_batch_world_is_deepspeeds_assertion(batch: dict[str, Any], world: int, fires: bool) -> None:
    config = {**batch, **TP2}
    found = [f for f in validate_config(config, world_size=world).findings if f.rule_id == "autotp-batch-world"]
    assert bool(found) == fires, found
    if fires:
        hinted = int(re.search(r"set train_batch_size to (\d+)", found[0].hint or "").group(1))  # type: ignore[union-attr]
        fixed = {**config, "train_batch_size": hinted}
        assert not [f for f in validate_config(fixed, world_size=world).errors if f.rule_id.startswith("batch")]


@pytest.mark.deepspeed
@pytest.mark.parametrize("tb", [4, 8, 16])
def test_autotp_batch_world_agrees_with_deepspeedconfig(ds: SimpleNamespace, tb: int) -> None:
    """DeepSpeedConfig on a simulated 8-rank world with autotp_size 2 (no mpu: the config path)."""
    config = {"train_batch_size": tb, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, **TP2}
    accepted, message = ds.oracle.deepspeed_verdict(config, 8, world_size=8)
    report = validate_config(config, world_size=8)
    assert accepted == report.ok, (message, report.findings)
    fired = "autotp-batch-world" in {f.rule_id for f in report.findings}
    assert fired == (tb == 4), report.findings  # 4 = 1 x 1 x (8 / 2)


# -- 4. real DeepSpeed on 2 CPU ranks ---------------------------------------------------------------
_WORKER = r'''
"""2-rank worker for tests/test_model_parallel_rules.py: deepspeed.initialize a tiny Llama per case."""
import gc
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed
import torch
from deepspeed import comm as dist
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, sys.argv[2])  # the checkout, for tests.rank_reports
from tests import rank_reports

SEQ = 16


def tiny():
    torch.manual_seed(0)  # the same weights on every rank
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                                        max_position_embeddings=64, attn_implementation="sdpa"))


def run(case, rank):
    record = {"name": case["name"], "rank": rank}
    model = tiny()
    mpu = None
    if case.get("ulysses"):
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
        mpu = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model, core_attn_implementation="sdpa", sequence_parallel_size=case["ulysses"],
            micro_batch_size=1, seq_length=SEQ, seq_length_is_variable=False)
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=case["config"],
                                          mpu=mpu)
        record.update(train_batch_size=engine.train_batch_size(), config_world=engine._config.world_size,
                      dp_world=engine.dp_world_size)
        data = torch.Generator().manual_seed(7)  # the same micro-batches on every rank: one TP group
        for _ in range(engine.gradient_accumulation_steps()):
            ids = torch.randint(0, 256, (engine.train_micro_batch_size_per_gpu(), SEQ), generator=data)
            if mpu is not None:  # Ulysses: each rank holds its shard of the sequence
                shard = SEQ // case["ulysses"]
                ids = ids[:, rank * shard:(rank + 1) * shard]
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        record.update(ok=True, global_steps=engine.global_steps, global_samples=engine.global_samples)
        del engine
    except Exception as exc:
        record.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    gc.collect()
    rank_reports.write("DSGEN_MP", rank, record)  # its own file: stdout lines from two ranks interleave


def main():
    cases = json.loads(open(sys.argv[1]).read())
    deepspeed.init_distributed(dist_backend="gloo")
    try:
        for case in cases:
            run(case, dist.get_rank())
    finally:
        gc.collect()
        dist.destroy_process_group()


main()
'''


def _run_cases(cases: list[dict[str, Any]], tmp_path: Path, timeout: float = 540) -> dict[str, list[dict[str, Any]]]:
    """Run ``cases`` in one 2-rank torchrun; each case's records (one per rank) by name."""
    require_module("deepspeed")
    require_module("transformers")
    from tests import rank_reports
    from tests.ds_oracle import _ops_for, prebuild_ops, run_torchrun

    for case in cases:
        prebuild_ops(_ops_for(case["config"]))
    worker = tmp_path / "mp_rules_worker.py"
    worker.write_text(_WORKER)
    cases_path = tmp_path / "cases.json"
    cases_path.write_text(json.dumps(cases))
    command = [str(worker), str(cases_path), str(REPO_ROOT)]
    _, log, timed_out, _ = run_torchrun(command, ranks=2, cwd=tmp_path, timeout=timeout)
    records: dict[str, list[dict[str, Any]]] = {}
    for record in rank_reports.read(tmp_path, "DSGEN_MP"):  # one file per rank
        records.setdefault(record["name"], []).append(record)
    assert not timed_out and all(len(records.get(c["name"], [])) == 2 for c in cases), log[-6000:]
    return records


ADAMW = {"type": "AdamW", "params": {"lr": 1e-3}}


def _tp_config(**extra: Any) -> dict[str, Any]:
    return {"optimizer": ADAMW, "tensor_parallel": {"autotp_size": 2}, "zero_optimization": {"stage": 1}, **extra}


@pytest.mark.slow
@pytest.mark.deepspeed
def test_autotp_batch_world_and_zero3_on_two_ranks(tmp_path: Path) -> None:
    """autotp_size 2 on 2 ranks: DeepSpeedConfig asserts train_batch_size over both ranks (x 2 trains,
    x 1 is refused, as autotp-batch-world says), though one micro-batch feeds both; ZeRO-3 trains."""
    batch = tp_batch(micro=1, accumulation=2, world=2, tp=2)
    keys = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2}
    cases: list[dict[str, Any]] = [
        {"name": "dp-count", "config": _tp_config(train_batch_size=batch.samples_per_step, **keys)},
        {"name": "all-ranks", "config": _tp_config(train_batch_size=batch.train_batch_size, **keys)},
        {"name": "zero3", "config": {**_tp_config(**keys), "zero_optimization": {"stage": 3}}},
    ]
    records = _run_cases(cases, tmp_path)

    refused = records["dp-count"]
    assert not any(r["ok"] for r in refused), refused
    assert (
        "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 2 != 1 * 2 * 2"
        in (refused[0]["error"])
    )
    found = [f for f in validate_config(cases[0]["config"], world_size=2).findings if f.rule_id == "autotp-batch-world"]
    assert found and "2 != 1 * 2 * 2" in found[0].message

    for record in records["all-ranks"]:
        assert record["ok"], record
        assert record["config_world"] == batch.asserted_world == 2 and record["dp_world"] == batch.data_parallel == 1
        assert record["global_samples"] == batch.train_batch_size == batch.overcount * batch.samples_per_step
    assert "autotp-batch-world" not in {f.rule_id for f in validate_config(cases[1]["config"], world_size=2).findings}

    assert all(r["ok"] for r in records["zero3"]), records["zero3"]
    assert not rules_of(Layout(world=2, tp=2, zero_stage=3, release="0.19.8"))


@pytest.mark.slow
@pytest.mark.deepspeed
def test_autotp_with_a_ulysses_mpu_fails_at_the_first_forward(tmp_path: Path) -> None:
    config = _tp_config(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, sequence_parallel_size=2)
    records = _run_cases([{"name": "ulysses", "config": config, "ulysses": 2}], tmp_path)
    (found,) = [v for v in violations(Layout(world=2, tp=2, sp=2)) if v.rule == "autotp-ulysses"]
    for record in records["ulysses"]:
        assert not record["ok"], record
        assert "Data inconsistency within the TP group" in record["error"]
        assert record["error"].split(": ", 1)[1] in found.message
    assert "autotp-ulysses" in {f.rule_id for f in validate_config(config).findings}
