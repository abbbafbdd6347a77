"""dsgen's GRPO terms against one real TRL GRPO step with transformers generation (2 CPU ranks, gloo).

``tests/grpo_worker.py`` runs ``trl.GRPOTrainer`` (``use_vllm=False``) on a tiny Llama with LoRA under
DeepSpeed ZeRO-2 and ZeRO-3, and measures per rank what generation holds (the KV cache at its
largest, the fp32 logits the sampler keeps, under ZeRO-3 the parameters gathered to generate) and
what training holds (model states; the bytes autograd saves in the loss forward of a micro-batch).
The records are compared with ``estimate_memory`` for the same plan: model states exactly,
generation (KV cache + logits) within 3 %, the saved activations within the activation bench's bar
(3 % median, 8 % worst).

The saved activations disagree and are a strict xfail (numbers in its reason): TRL 1.16's GRPO loss
runs a fused, chunked LM head that keeps no vocabulary-wide logits, which dsgen does not price yet.
ZeRO-3's generation gather, which once priced the tensors ZeRO-3 already keeps whole a second time
(+37.8 %), is now exact.

The measured and predicted numbers: ``python bench/finetune_state_accuracy.py`` (its GRPO section).
"""

from __future__ import annotations

import json
import statistics
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import require_module

from dsgen.catalog.hf_config import shape_from_hf_config
from dsgen.catalog.model_shape import ModelShape
from dsgen.catalog.presets import get_gpu
from dsgen.estimate.memory import MemoryEstimate, estimate_memory
from dsgen.estimate.optimizers import flat_state_bytes
from dsgen.plan import Plan
from dsgen.spec.types import FineTuning, Generation, Hardware, Lora, Training
from tests.grpo_worker import DEFAULT_CASE, measure_grpo
from tests.tiny_models import TINY_MODELS

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]

RANKS = 2
CASES: dict[str, dict[str, Any]] = {
    "llama-lora-z2": {"zero_stage": 2},
    "llama-lora-z3": {"zero_stage": 3},
}


def _case(name: str) -> dict[str, Any]:
    return {**DEFAULT_CASE, **CASES[name]}


@cache
def _shape(tmp: str) -> ModelShape:
    path = Path(tmp) / "llama.json"
    path.write_text(json.dumps({**TINY_MODELS["llama"], "model_type": "llama", "max_position_embeddings": 2048}))
    return shape_from_hf_config(path)


@cache
def _measured(name: str) -> tuple[dict[str, Any], ...]:
    require_module("peft")
    require_module("trl")
    return tuple(measure_grpo(CASES[name], ranks=RANKS))


def _predicted(name: str, shape: ModelShape) -> MemoryEstimate:
    case = _case(name)
    lora = case["lora"]
    generation = Generation(
        num_generations=case["num_generations"],
        max_prompt_length=case["prompt_length"],
        max_completion_length=case["completion_length"],
        engine="transformers",
    )
    finetuning = FineTuning(
        method="lora",
        lora=Lora(rank=lora["r"], alpha=lora["lora_alpha"], dropout=lora["lora_dropout"]),
        objective="grpo",
        generation=generation,
    )
    micro, accumulation = case["micro_batch"], case["gradient_accumulation_steps"]
    training = Training(
        sequence_length=generation.sequence_length,
        global_batch_size=micro * accumulation * RANKS,
        precision=case["dtype"],
        attention="sdpa",
        finetuning=finetuning,
    )
    plan = Plan(
        precision=case["dtype"],
        zero_stage=case["zero_stage"],
        offload_optimizer="none",
        offload_param="none",
        checkpointing="full" if case["gradient_checkpointing"] else "none",
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        data_parallel_size=RANKS,
    )
    return estimate_memory(shape, plan, Hardware(gpu=get_gpu("a100-80gb"), gpus_per_node=RANKS), training)


def _generate_call(record: dict[str, Any]) -> dict[str, Any]:
    (call,) = record["generate_calls"]  # one generation per optimizer step (steps_per_generation = accumulation)
    return call


def comparison(name: str, tmp: str) -> dict[str, dict[str, int]]:
    """Measured (largest over the ranks) and predicted bytes per term, for the bench and the report."""
    predicted = _predicted(name, _shape(tmp))
    records = _measured(name)
    calls = [_generate_call(r) for r in records]
    measured = {
        "kv_cache": max(c["kv_cache_bytes"] for c in calls),
        "sampler_logits": max(c["sampler_logits_bytes"] for c in calls),
        "saved_activations": max(r["saved_activation_bytes"] for r in records),
    }
    measured["generation"] = measured["kv_cache"] + measured["sampler_logits"]
    if "zero3_materialised_bytes" in calls[0]:  # gathered to generate: the tensors not kept whole anyway
        measured["generation_gather"] = max(
            c["zero3_materialised_bytes"] - c["zero3_persistent_bytes_in_generation"] for c in calls
        )
    return {
        "measured": measured,
        "predicted": {
            "generation": predicted.gpu.generation,
            "saved_activations": predicted.gpu.activations,
            "generation_gather": predicted.gpu.generation_gather,
        },
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_run_is_the_one_dsgen_prices(name: str) -> None:
    case = _case(name)
    micro, accumulation = case["micro_batch"], case["gradient_accumulation_steps"]
    for record in _measured(name):
        call = _generate_call(record)
        assert record["zero_stage"] == case["zero_stage"]
        assert (record["micro_batch"], record["gradient_accumulation_steps"]) == (micro, accumulation)
        assert record["steps_per_generation"] == accumulation  # GRPOConfig's default
        assert call["use_cache"] is True and call["cache_class"] == "DynamicCache"
        assert call["rows"] == micro * accumulation  # the rank's whole generation batch at once
        assert call["prompt_width"] == case["prompt_length"]
        assert call["output_width"] == case["prompt_length"] + case["completion_length"]
        assert record["activation_rows"] == micro
        assert record["activation_prompt_width"] == case["prompt_length"]
        assert record["activation_completion_width"] == case["completion_length"]
        assert record["attention_mask_all_ones"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_model_states_equal_what_each_rank_holds(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    predicted = _predicted(name, _shape(str(tmp_path_factory.getbasetemp())))
    states = predicted.model_states
    parts = states.partitioning
    for record in _measured(name):
        if _case(name)["zero_stage"] == 3:
            layout = parts.zero3
            assert layout is not None
            assert record["trainable_elements"] == layout.partition
            assert record["frozen_bytes"] == states.frozen.partitions
            assert record["zero3_persistent_bytes"] == 4 * layout.persistent + states.frozen.resident
        else:
            padding = parts.zero12_slice * parts.ranks - parts.parameters
            assert sum(record["zero12_bit16_groups_flat_elements"]) == parts.zero12_slice * RANKS - padding
            assert sum(record["zero12_single_partition_of_fp32_groups_elements"]) <= parts.zero12_slice
            assert record["frozen_bytes"] == states.frozen.resident
        stepped = parts.zero3.partition if parts.zero3 else parts.zero12_slice
        assert record["optimizer_state_bytes"] == flat_state_bytes("adamw", (stepped,))


@pytest.mark.parametrize("name", sorted(CASES))
def test_generation_kv_cache_and_sampler_logits_within_3_percent(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The cache holds prompt + completion - 1 tokens at its largest (the last sampled token is never
    run through the model); dsgen prices prompt + completion: 1/64 over here."""
    result = comparison(name, str(tmp_path_factory.getbasetemp()))
    measured, predicted = result["measured"]["generation"], result["predicted"]["generation"]
    assert abs(predicted / measured - 1) <= 0.03, result


def test_trl_fused_lm_head_keeps_its_input_not_the_logits(tmp_path_factory: pytest.TempPathFactory) -> None:
    """What the activation mismatch below comes from, read off the records (TRL 1.16, no Triton):
    ``ChunkedLogProbFunction`` saves the head's input (hidden states of every position but the last,
    b·(s-1)·h in the training dtype), the int64 targets and fp32 ``log_z`` and entropy, and no
    vocabulary-wide tensor at all."""
    case = _case("llama-lora-z2")
    rows, positions = case["micro_batch"], case["prompt_length"] + case["completion_length"] - 1
    hidden = TINY_MODELS["llama"]["hidden_size"]
    for record in _measured("llama-lora-z2"):
        assert record["saved_by_fused_lm_head_bytes"] == rows * positions * (4 * hidden + 8 + 4 + 4)
        vocab_wide = [r for r in record["saved_activation_breakdown"] if r["shape"].endswith("x1000")]
        assert not vocab_wide, vocab_wide


@pytest.mark.xfail(
    strict=True,
    reason=(
        "dsgen prices GRPO's loss like the next-token loss: the fp32 log-softmax over the vocabulary, 4·V "
        "bytes per token (activations._outside_modern). TRL 1.16's GRPOTrainer scores tokens through a fused "
        "LM head (trl/trainer/utils.py add_fused_lm_head, called with fused_lm_head=True in "
        "_get_per_token_logps_and_entropies) whose ChunkedLogProbFunction (trl/kernels/chunked_logprob.py) "
        "saves the head's input, targets, log_z and entropy: e·h + 16 bytes per scored position. Measured "
        "8,148,850 B per rank (ZeRO-2 and ZeRO-3), predicted 8,530,432 B (+4.7 %); dsgen less its 512,000 B "
        "of log-softmax plus the 131,040 B the fused head saved is 8,149,472 B (+0.01 %)"
    ),
)
def test_saved_activations_within_the_activation_benchs_bar(tmp_path_factory: pytest.TempPathFactory) -> None:
    errors = {}
    for name in CASES:
        result = comparison(name, str(tmp_path_factory.getbasetemp()))
        errors[name] = result["predicted"]["saved_activations"] / result["measured"]["saved_activations"] - 1
    assert statistics.median(abs(e) for e in errors.values()) <= 0.03, errors
    assert max(abs(e) for e in errors.values()) <= 0.08, errors


def test_zero3_generation_gathers_what_the_rank_does_not_hold_whole(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    result = comparison("llama-lora-z3", str(tmp_path_factory.getbasetemp()))
    assert result["predicted"]["generation_gather"] == result["measured"]["generation_gather"], result
