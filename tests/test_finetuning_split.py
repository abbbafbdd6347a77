"""The fine-tuning split against the libraries that make it: PEFT's adapters and bitsandbytes' 4-bit packing.

What trains and what is frozen is counted by PEFT itself: each preset's real transformers model
is built on the meta device, wrapped with ``peft.get_peft_model`` and its ``requires_grad``
parameters counted, as ``print_trainable_parameters`` does. The packed bytes of a quantized
weight are what ``bitsandbytes.functional.quantize_4bit`` returns for a real tensor on the CPU.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import require_module
from hf_configs import hf_config_dict

from dsgen.catalog.presets import get_model
from dsgen.estimate.trainable import (
    QuantizedWeight,
    frozen_bytes,
    parameter_split,
    quantized_weight_bytes,
)
from dsgen.spec.types import FineTuning, Freeze, Lora, Quantization

LORA_CASES = [
    # (preset, rank, target_modules): the families' module layouts, fused ones included
    ("llama-2-7b", 8, ("q_proj", "v_proj")),
    ("llama-3.1-8b", 16, "all-linear"),
    ("qwen2.5-7b", 32, "attention"),
    ("mistral-7b", 16, "all-linear"),
    ("mixtral-8x7b", 8, "all-linear"),
    ("gpt2-xl", 8, "all-linear"),
    ("pythia-1b", 16, "all-linear"),
    ("phi-3-mini", 16, "all-linear"),
    ("gemma-2-2b", 8, "all-linear"),
    ("olmo-2-1b", 8, ("q_proj", "down_proj")),
    ("qwen3-30b-a3b", 8, "all-linear"),  # router and stacked experts too (PEFT's MoE conversion)
    ("qwen3-30b-a3b", 8, ("q_proj", "gate_proj", "up_proj")),
    ("qwen3-8b", 16, "attention"),
    ("deepseek-v3", 4, "all-linear"),  # MLA projections, shared experts, dense first layers
]


def _peft_counts(preset: str, lora: Lora, tmp_path: Path) -> tuple[int, int]:
    """(trainable, frozen) parameters of the preset's model under PEFT's LoRA, built on the meta device."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    peft = require_module("peft")
    shape = get_model(preset)
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(shape)), encoding="utf-8")
    config = transformers.AutoConfig.from_pretrained(str(tmp_path))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    targets: Any = lora.target_modules
    if targets == "attention":
        targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    elif not isinstance(targets, str):
        targets = list(targets)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=lora.rank, target_modules=targets, task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in wrapped.parameters() if not p.requires_grad)
    return trainable, frozen


@pytest.mark.parametrize(("preset", "rank", "targets"), LORA_CASES)
def test_lora_trained_and_frozen_counts_match_peft(preset: str, rank: int, targets: Any, tmp_path: Path) -> None:
    lora = Lora(rank=rank, target_modules=targets)
    split = parameter_split(get_model(preset), FineTuning(method="lora", lora=lora))
    assert (split.trainable_count, split.frozen_count) == _peft_counts(preset, lora, tmp_path)


def test_qlora_freezes_the_whole_base_and_quantizes_only_decoder_linears() -> None:
    shape = get_model("llama-3.1-8b")
    lora = Lora(rank=16)
    qlora = parameter_split(shape, FineTuning(method="qlora", lora=lora))
    plain = parameter_split(shape, FineTuning(method="lora", lora=lora))
    assert qlora.trainable_count == plain.trainable_count
    assert qlora.frozen_count == plain.frozen_count == shape.parameter_count()
    # embeddings, the untied head and the norms stay 16-bit: bitsandbytes replaces nn.Linear layers
    # of the decoder and skips the output embedding (modules_to_not_convert)
    unquantized = 2 * shape.vocab_size * shape.hidden_size + (2 * shape.num_layers + 1) * shape.hidden_size
    assert sum(qlora.frozen) == unquantized


@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize(("fan_out", "fan_in"), [(384, 256), (1000, 320)])
def test_quantized_weight_bytes_match_bitsandbytes(fan_out: int, fan_in: int, double_quant: bool) -> None:
    torch = require_module("torch")
    functional = require_module("bitsandbytes.functional")
    weight = torch.randn(fan_out, fan_in, dtype=torch.bfloat16)
    packed, state = functional.quantize_4bit(weight, blocksize=64, compress_statistics=double_quant, quant_type="nf4")
    measured = packed.numel() * packed.element_size() + state.absmax.numel() * state.absmax.element_size()
    tables = state.code.numel() * state.code.element_size()  # the 16-value code book: left out
    if state.nested:
        measured += state.state2.absmax.numel() * state.state2.absmax.element_size()
        tables += state.state2.code.numel() * state.state2.code.element_size()
    quantization = Quantization(bits=4, type="nf4", double_quant=double_quant, block_size=64)
    assert quantized_weight_bytes(QuantizedWeight(fan_in, fan_out, 1), quantization) == measured
    assert tables <= 1088  # what is left out: at most 1.1 KiB of code books per weight


def test_zero3_partitions_4bit_weights_as_their_storage_elements() -> None:
    """With bnb_4bit_quant_storage=bfloat16 a 4-bit weight is a bf16 tensor of n/4 elements, and
    ZeRO-3 partitions it like any parameter; its constants are not parameters and stay whole."""
    torch = require_module("torch")
    functional = require_module("bitsandbytes.functional")
    packed, _ = functional.quantize_4bit(
        torch.randn(1024, 512, dtype=torch.bfloat16), blocksize=64, quant_type="nf4", quant_storage=torch.bfloat16
    )
    shape = get_model("llama-3.2-1b")
    split = parameter_split(shape, FineTuning(method="qlora"))
    one = QuantizedWeight(512, 1024, 1)
    lone = replace(split, trainable_shapes=(), frozen=(), quantized=(one,))
    constants = quantized_weight_bytes(one, Quantization()) - 1024 * 512 // 2
    held = frozen_bytes(lone, 2, 3, 4, 0)
    assert held.partitions == 2 * -(-packed.numel() // 4)
    assert held.resident == constants
    assert frozen_bytes(lone, 2, 2, 4, 0).resident == quantized_weight_bytes(one, Quantization())


def test_freeze_trains_the_last_layers_as_llamafactory_selects_them(tmp_path: Path) -> None:
    """LLaMA-Factory's freeze-tuning: the last N decoder layers (and named extra modules) train."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    shape = get_model("qwen2.5-1.5b")
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(shape)), encoding="utf-8")
    config = transformers.AutoConfig.from_pretrained(str(tmp_path))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    layers = model.model.layers
    expected = sum(p.numel() for layer in layers[-3:] for p in layer.parameters())
    expected += model.model.norm.weight.numel()
    freeze = Freeze(trainable_layers=3, trainable=("norm",))
    split = parameter_split(shape, FineTuning(method="freeze", freeze=freeze))
    assert split.trainable_count == expected
    assert split.frozen_count == shape.parameter_count() - expected


def test_generation_kv_cache_is_the_cache_transformers_generate_holds(tmp_path: Path) -> None:
    """GRPO's transformers engine: the KV cache model.generate builds for a batch of completions
    (a DynamicCache: keys and values per layer for prompt + generated - 1 positions; dsgen prices
    prompt + completion, one position more)."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    from dsgen.catalog.hf_config import shape_from_hf_config
    from dsgen.estimate.objectives import kv_cache_bytes
    from dsgen.plan import Plan

    sizes = {"vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4}
    config = transformers.LlamaConfig(**sizes, num_attention_heads=8, num_key_value_heads=4)
    model = transformers.LlamaForCausalLM(config).eval()
    prompts, prompt_length, new = 3, 20, 12
    ids = torch.randint(0, 1000, (prompts, prompt_length))
    out = model.generate(
        ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, return_dict_in_generate=True, pad_token_id=0
    )
    held = sum(layer.keys.nbytes + layer.values.nbytes for layer in out.past_key_values.layers)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**sizes, "model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 4}))
    shape = shape_from_hf_config(path)
    plan = Plan("fp32", 0, "none", "none", "none", 1, 1, 1)
    assert kv_cache_bytes(shape, plan, prompts, prompt_length + new - 1) == held
