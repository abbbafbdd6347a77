"""The preset catalog and the config.json reader, checked against published counts and transformers.

Three independent sources must agree on every model: the count dsgen derives from the architecture
(``ModelShape.parameter_count``), the number published for the checkpoint, and the model that
``transformers`` actually builds (on the meta device, so even Llama-3.1-405B costs no memory and
about a tenth of a second). The config.json reader is checked the same way, on real published
config files and on small configs that lean on transformers' per-family defaults.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict, make_dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO_ROOT, require_module
from hf_configs import hf_config_dict

from dsgen.catalog.gpu import GpuSpec
from dsgen.catalog.hf_config import SUPPORTED_MODEL_TYPES, shape_from_hf_config
from dsgen.catalog.model_shape import FAMILIES, TRAIT_FAMILIES, ModelShape
from dsgen.catalog.presets import (
    get_gpu,
    get_model,
    gpu_presets,
    model_presets,
    normalize_name,
    published_parameter_counts,
)
from dsgen.errors import DsgenError, Location

MODELS = model_presets()
GPUS = gpu_presets()


# ---- transformers oracle ------------------------------------------------------------------------
def _transformers_counts(config_dir: Path) -> tuple[int, int, int]:
    """(total unique parameters, largest module's own parameters, parameters of layer 0).

    The model is built by transformers from ``config_dir/config.json`` on the meta device. Shared
    (tied) parameters are counted once, as ``Module.parameters()`` de-duplicates them.
    """
    torch = require_module("torch")
    transformers = require_module("transformers")
    config = transformers.AutoConfig.from_pretrained(str(config_dir))
    auto = transformers.AutoModel if config.model_type == "bert" else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == config.num_hidden_layers]
    layer = sum(p.numel() for p in stacks[0][0].parameters())
    return total, largest, layer


def _assert_matches_transformers(shape: ModelShape, config_dir: Path) -> None:
    total, largest, layer = _transformers_counts(config_dir)
    assert shape.parameter_count() == total
    assert shape.layer_parameters() == layer
    assert shape.largest_module_parameters() == largest


def _write_config(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


# ---- (a) published counts ------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(MODELS))
def test_preset_matches_published_parameter_count(name: str) -> None:
    assert MODELS[name].parameter_count() == published_parameter_counts()[name]


def test_published_counts_cover_every_preset_and_stay_out_of_model_shape() -> None:
    assert set(published_parameter_counts()) == set(MODELS)
    assert not hasattr(MODELS["gpt2"], "published_parameters")
    assert {shape.family for shape in MODELS.values()} <= set(FAMILIES)


def test_required_model_presets_exist() -> None:
    required = {
        "gpt2",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
        "bert-base",
        "bert-large",
        "llama-2-7b",
        "llama-2-13b",
        "llama-2-70b",
        "llama-3.1-8b",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "llama-3.2-1b",
        "llama-3.2-3b",
        "mistral-7b",
        "qwen2.5-0.5b",
        "qwen2.5-1.5b",
        "qwen2.5-3b",
        "qwen2.5-7b",
        "qwen2.5-14b",
        "qwen2.5-32b",
        "qwen2.5-72b",
        "gemma-2-2b",
        "gemma-2-9b",
        "gemma-2-27b",
        "phi-3-mini",
        "mixtral-8x7b",
        "pythia-1b",
    }
    assert required <= set(MODELS)
    assert all(shape.name == name for name, shape in MODELS.items())


# ---- (b) presets against transformers, via the config.json they correspond to --------------------
# today's decoders (TRAIT_FAMILIES) are checked from their published config.json in test_modern_configs.py
@pytest.mark.parametrize("name", sorted(n for n, shape in MODELS.items() if shape.family not in TRAIT_FAMILIES))
def test_preset_round_trips_through_config_json_and_matches_transformers(name: str, tmp_path: Path) -> None:
    shape = MODELS[name]
    path = _write_config(tmp_path / name, hf_config_dict(shape))
    assert shape_from_hf_config(path, name=name) == shape
    _assert_matches_transformers(shape, path.parent)


# Published config.json files (verbatim but for auto_map entries), keyed by the preset they describe.
REAL_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-2-7b": {
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 11008,
        "max_position_embeddings": 4096,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.31.0.dev0",
        "use_cache": True,
        "vocab_size": 32000,
    },
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    },
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    },
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "model_type": "mistral",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0",
        "use_cache": True,
        "vocab_size": 32000,
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "model_type": "mixtral",
        "num_attention_heads": 32,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.36.0.dev0",
        "use_cache": True,
        "vocab_size": 32000,
    },
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": 896,
        "initializer_range": 0.02,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "model_type": "qwen2",
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "initializer_range": 0.02,
        "intermediate_size": 18944,
        "max_position_embeddings": 131072,
        "max_window_layers": 28,
        "model_type": "qwen2",
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1",
        "use_cache": True,
        "use_mrope": False,
        "use_sliding_window": False,
        "vocab_size": 152064,
    },
    "gemma-2-9b": {
        "architectures": ["Gemma2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": 50.0,
        "bos_token_id": 2,
        "cache_implementation": "hybrid",
        "eos_token_id": 1,
        "final_logit_softcapping": 30.0,
        "head_dim": 256,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 3584,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 8192,
        "model_type": "gemma2",
        "num_attention_heads": 16,
        "num_hidden_layers": 42,
        "num_key_value_heads": 8,
        "pad_token_id": 0,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "sliding_window_size": 4096,
        "torch_dtype": "float32",
        "transformers_version": "4.42.0.dev0",
        "use_cache": True,
        "vocab_size": 256000,
    },
    "phi-3-mini": {
        "_name_or_path": "Phi-3-mini-4k-instruct",
        "architectures": ["Phi3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "embd_pdrop": 0.0,
        "eos_token_id": 32000,
        "hidden_act": "silu",
        "hidden_size": 3072,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 4096,
        "model_type": "phi3",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096,
        "pad_token_id": 32000,
        "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": 2047,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.2",
        "use_cache": True,
        "vocab_size": 32064,
    },
    "gpt2": {
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1,
        "bos_token_id": 50256,
        "embd_pdrop": 0.1,
        "eos_token_id": 50256,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2",
        "n_ctx": 1024,
        "n_embd": 768,
        "n_head": 12,
        "n_layer": 12,
        "n_positions": 1024,
        "resid_pdrop": 0.1,
        "summary_activation": None,
        "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True,
        "summary_type": "cls_index",
        "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257,
    },
    "pythia-1b": {
        "architectures": ["GPTNeoXForCausalLM"],
        "bos_token_id": 0,
        "classifier_dropout": 0.1,
        "eos_token_id": 0,
        "hidden_act": "gelu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048,
        "model_type": "gpt_neox",
        "num_attention_heads": 8,
        "num_hidden_layers": 16,
        "rotary_emb_base": 10000,
        "rotary_pct": 0.25,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.24.0",
        "use_cache": True,
        "use_parallel_residual": True,
        "vocab_size": 50304,
    },
    "bert-base": {
        "architectures": ["BertForMaskedLM"],
        "attention_probs_dropout_prob": 0.1,
        "gradient_checkpointing": False,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 768,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "model_type": "bert",
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "transformers_version": "4.6.0.dev0",
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": 30522,
    },
}


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_published_config_json_reads_as_the_preset(preset: str, tmp_path: Path) -> None:
    path = _write_config(tmp_path / preset, REAL_CONFIGS[preset])
    shape = shape_from_hf_config(path)
    assert shape == replace(MODELS[preset], name=preset)  # named after its folder
    _assert_matches_transformers(shape, path.parent)


def test_real_configs_cover_every_supported_model_type() -> None:
    # the model types of today's decoders are covered by tests/test_modern_configs.py
    assert {c["model_type"] for c in REAL_CONFIGS.values()} <= set(SUPPORTED_MODEL_TYPES)


# Small configs that omit optional keys (so transformers' per-family defaults apply), switch on
# optional biases, and use tiny vocabularies so a layer's projections, not the embedding table,
# are the largest module.
DEFAULTS_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-biases": {
        "model_type": "llama",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "intermediate_size": 1376,
        "vocab_size": 100,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "llama-head-dim": {
        "model_type": "llama",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 160,
        "intermediate_size": 256,
        "vocab_size": 100,
        "tie_word_embeddings": True,
    },
    "mistral-defaults": {
        "model_type": "mistral",
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "intermediate_size": 2048,
        "vocab_size": 100,
        "head_dim": None,
    },
    "mixtral-defaults": {
        "model_type": "mixtral",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "intermediate_size": 512,
        "vocab_size": 1000,
    },
    "qwen2-defaults": {
        "model_type": "qwen2",
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 32,
        "intermediate_size": 2816,
        "vocab_size": 100,
        "tie_word_embeddings": True,
    },
    "gemma2-defaults": {
        "model_type": "gemma2",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 2048,
        "vocab_size": 100,
        "attention_bias": True,
    },
    "phi3-defaults": {
        "model_type": "phi3",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "intermediate_size": 1024,
        "vocab_size": 100,
        "pad_token_id": None,
    },
    "gpt2-untied": {
        "model_type": "gpt2",
        "n_embd": 256,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": None,
        "vocab_size": 100,
        "n_positions": 64,
        "tie_word_embeddings": False,
    },
    "gpt-neox-no-bias": {
        "model_type": "gpt_neox",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "intermediate_size": 2048,
        "vocab_size": 100,
        "attention_bias": False,
        "tie_word_embeddings": True,
    },
    "bert-defaults": {
        "model_type": "bert",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "vocab_size": 100,
    },
}


@pytest.mark.parametrize("case", sorted(DEFAULTS_CONFIGS))
def test_config_json_defaults_match_transformers(case: str, tmp_path: Path) -> None:
    path = _write_config(tmp_path / case, DEFAULTS_CONFIGS[case])
    _assert_matches_transformers(shape_from_hf_config(path, name=case), path.parent)


def test_family_defaults_are_transformers_defaults(tmp_path: Path) -> None:
    """The defaults that differ by family (read without transformers; the test above cross-checks)."""

    def read(case: str) -> ModelShape:
        return shape_from_hf_config(_write_config(tmp_path / case, DEFAULTS_CONFIGS[case]))

    assert read("llama-biases").num_key_value_heads == 8  # = num_attention_heads
    assert read("mistral-defaults").num_key_value_heads == 8  # MistralConfig's default
    mixtral = read("mixtral-defaults")
    assert (mixtral.num_experts, mixtral.experts_per_token, mixtral.num_key_value_heads) == (8, 2, 8)
    assert read("qwen2-defaults").num_key_value_heads == 32  # Qwen2Config's default
    gemma = read("gemma2-defaults")
    assert (gemma.head_dim, gemma.num_key_value_heads, gemma.tie_word_embeddings) == (256, 4, True)
    gpt2 = read("gpt2-untied")
    assert (gpt2.intermediate_size, gpt2.dropout) == (1024, 0.1)
    bert = read("bert-defaults")
    assert (bert.token_type_embeddings, bert.learned_position_embeddings, bert.pooler) == (2, 512, True)


def test_config_directory_and_explicit_name(tmp_path: Path) -> None:
    _write_config(tmp_path / "my-llama", REAL_CONFIGS["llama-2-7b"])
    assert shape_from_hf_config(tmp_path / "my-llama").name == "my-llama"
    assert shape_from_hf_config(tmp_path / "my-llama" / "config.json", name="x").name == "x"


def test_a_named_config_file_names_its_model_by_its_stem(tmp_path: Path) -> None:
    """Issue 22: ``models/llama-33b.json`` is "llama-33b", not "models" (the folder)."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "llama-33b.json").write_text(json.dumps(REAL_CONFIGS["llama-2-7b"]), encoding="utf-8")
    assert shape_from_hf_config(folder / "llama-33b.json").name == "llama-33b"
    _write_config(tmp_path / "Llama-2-7b-hf", REAL_CONFIGS["llama-2-7b"])
    assert shape_from_hf_config(tmp_path / "Llama-2-7b-hf" / "config.json").name == "Llama-2-7b-hf"


# ---- (c) GPU presets -------------------------------------------------------------------------------
REQUIRED_GPUS = {
    "v100-16gb",
    "v100-32gb",
    "t4",
    "a10",
    "a10g",
    "l4",
    "l40s",
    "a100-40gb",
    "a100-80gb",
    "a100-40gb-pcie",
    "a100-80gb-pcie",
    "h100-80gb",
    "h100-pcie",
    "h200",
    "b200",
    "rtx-3090",
    "rtx-4090",
    "mi250x",
    "mi300x",
}


def test_required_gpu_presets_exist() -> None:
    assert set(GPUS) >= REQUIRED_GPUS
    assert all(gpu.name == name == normalize_name(name) for name, gpu in GPUS.items())


@pytest.mark.parametrize("name", sorted(GPUS))
def test_gpu_preset_is_self_consistent(name: str) -> None:
    gpu = GPUS[name]
    assert isinstance(gpu, GpuSpec)
    assert 10 < gpu.memory_gib < 200
    assert gpu.fp16
    assert (gpu.peak_tflops_bf16 > 0) == gpu.bf16
    assert gpu.peak_tflops_fp16 >= gpu.peak_tflops_fp32 > 0
    assert gpu.memory_bandwidth_gbps > gpu.interconnect_bandwidth_gbps >= gpu.pcie_bandwidth_gbps >= 16
    assert gpu.vendor in ("nvidia", "amd")
    assert gpu.compute_capability
    assert gpu.description


def test_bf16_support() -> None:
    no_bf16 = {"v100-16gb", "v100-32gb", "t4"}  # Volta and Turing
    assert not any(GPUS[name].bf16 for name in no_bf16)
    for name in sorted(REQUIRED_GPUS - no_bf16):  # Ampere and later, CDNA 2/3
        assert GPUS[name].bf16, name


def test_memory_is_what_the_runtime_reports() -> None:
    """Below the marketing size (the driver keeps some), ordered as the products are."""

    def mem(name: str) -> float:
        return GPUS[name].memory_gib

    assert 78.5 < mem("a100-80gb") < 80 and 78.5 < mem("h100-80gb") < 80
    assert 39 < mem("a100-40gb") < 40
    assert mem("t4") < mem("v100-16gb") < mem("a10") < mem("rtx-4090") < mem("v100-32gb") < mem("a100-40gb")
    assert mem("a100-40gb") < mem("l40s") < mem("mi250x") < mem("a100-80gb") < mem("h200") < mem("b200")
    assert mem("b200") < mem("mi300x")
    assert mem("a100-40gb") == mem("a100-40gb-pcie") and mem("a100-80gb") == mem("a100-80gb-pcie")


def test_sxm_parts_have_a_faster_gpu_link_than_pcie_parts() -> None:
    for sxm, pcie in (("a100-80gb", "a100-80gb-pcie"), ("h100-80gb", "h100-pcie")):
        assert GPUS[sxm].interconnect_bandwidth_gbps > GPUS[pcie].interconnect_bandwidth_gbps


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"tflops": 1.0}, "unknown keys"),
        ({"memory_gib": "lots"}, "memory_gib: 'lots' is not a valid"),
        ({"bf16": 1}, "bf16: 1 is not a valid"),
        ({"memory_gib": None}, "memory_gib: None is not a valid"),
    ],
)
def test_broken_preset_data_is_a_packaging_error(
    change: dict[str, Any], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsgen.catalog import presets

    entry = {"memory_gib": 10.0, "bf16": True, **change}
    (tmp_path / "test-gpu.yaml").write_text(json.dumps(entry), encoding="utf-8")  # JSON is YAML
    monkeypatch.setattr(presets, "GPUS_DIR", tmp_path)
    presets._forget_loaded()
    try:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            presets.gpu_presets()
    finally:
        presets._forget_loaded()  # the next caller reloads the real file


def test_preset_field_types_resolve_as_typing_does() -> None:
    """The loader resolves annotation strings by name instead of compiling them; the result must
    be what ``typing.get_type_hints`` gives, or a wrong type check would slip through."""
    import typing

    from dsgen.catalog import presets

    for cls in (GpuSpec, ModelShape):
        assert presets._type_hints(cls) == typing.get_type_hints(cls)

    odd = make_dataclass("Odd", [("shape", "tuple[int, ...]")])
    with pytest.raises(TypeError, match=re.escape("Odd.shape: preset fields must be")):
        presets._type_hints(odd)


def test_a_lookup_reads_only_the_file_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsgen.catalog import presets

    good = {k: v for k, v in asdict(GPUS["t4"]).items() if k != "name"}
    (tmp_path / "good-gpu.yaml").write_text(json.dumps(good), encoding="utf-8")
    (tmp_path / "broken-gpu.yaml").write_text("memory_gib: [unclosed", encoding="utf-8")
    monkeypatch.setattr(presets, "GPUS_DIR", tmp_path)
    presets._forget_loaded()
    try:
        assert get_gpu("good-gpu") == replace(GPUS["t4"], name="good-gpu")
        with pytest.raises(DsgenError, match="did you mean 'broken-gpu'"):
            get_gpu("broken")
        with pytest.raises(yaml.YAMLError):
            get_gpu("broken-gpu")
    finally:
        presets._forget_loaded()


@pytest.mark.parametrize(
    ("file_name", "text", "fragment"),
    [
        ("odd-family.yaml", "family: nonesuch\npublished_parameters: 1\n", "family: 'nonesuch' is not a family"),
        ("no-count.yaml", "hf_id: acme/x\nfamily: llama\n", "published_parameters must be a positive integer"),
        (
            "no-id.yaml",
            "family: llama\npublished_parameters: 1\n",
            "hf_id must name the model's Hugging Face repository",
        ),
        ("Upper_Case.yaml", "family: llama\n", "preset names must be lowercase and hyphenated"),
    ],
)
def test_broken_model_files_name_the_file(
    file_name: str, text: str, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsgen.catalog import presets

    (tmp_path / file_name).write_text(text, encoding="utf-8")
    monkeypatch.setattr(presets, "MODELS_DIR", tmp_path)
    presets._forget_loaded()
    try:
        with pytest.raises(ValueError, match=re.escape(fragment)) as info:
            presets.model_presets()
        assert file_name.removesuffix(".yaml") in str(info.value)
    finally:
        presets._forget_loaded()


def test_preset_files_have_no_duplicate_keys() -> None:
    """PyYAML keeps the last of two equal keys without a word; in a preset that hides a typo."""
    from dsgen.catalog import presets

    files = [presets.FAMILIES_FILE, *presets.GPUS_DIR.glob("*.yaml"), *presets.MODELS_DIR.glob("*.yaml")]
    assert len(files) == 1 + len(GPUS) + len(MODELS)
    for file in files:
        for node in _mappings(yaml.compose(file.read_text(encoding="utf-8"))):
            keys = [key.value for key, _ in node.value if key.value != "<<"]
            assert len(keys) == len(set(keys)), f"{file}: duplicate keys {sorted(k for k in keys if keys.count(k) > 1)}"


def _mappings(node: yaml.Node) -> list[yaml.MappingNode]:
    if isinstance(node, yaml.MappingNode):
        return [node] + [m for _, value in node.value for m in _mappings(value)]
    return []


# ---- (d) lookups ----------------------------------------------------------------------------------
def test_lookup_normalises_what_people_type() -> None:
    assert get_gpu("A100_80GB") == GPUS["a100-80gb"]
    assert get_gpu(" H100-80GB ") == GPUS["h100-80gb"]
    assert get_model("Llama-3.1-8B") == MODELS["llama-3.1-8b"]


def test_unknown_gpu_suggests_close_names_and_lists_all() -> None:
    where = Location("spec.yaml", 3)
    with pytest.raises(DsgenError) as info:
        get_gpu("a100-80", location=where)
    err = info.value
    assert err.path == "hardware.gpu" and err.location == where
    assert "did you mean 'a100-80gb'" in err.message
    assert all(name in (err.hint or "") for name in GPUS)
    assert str(err).startswith("spec.yaml:3: hardware.gpu: unknown GPU preset 'a100-80'")


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("llama2-7b", "llama-2-7b"),
        ("qwen-2.5-7b", "qwen2.5-7b"),
        ("mistral", "mistral-7b"),
        ("gemma2-9b", "gemma-2-9b"),
        ("mixtral", "mixtral-8x7b"),
    ],
)
def test_unknown_model_suggests_close_names(typed: str, expected: str) -> None:
    with pytest.raises(DsgenError) as info:
        get_model(typed, path="model.preset")
    assert f"'{expected}'" in info.value.message
    assert info.value.path == "model.preset"
    assert "hf_config" in (info.value.hint or "")


def test_unknown_name_without_close_match_still_lists_presets() -> None:
    with pytest.raises(DsgenError) as info:
        get_gpu("tpu-v5")
    assert "did you mean" not in info.value.message
    assert "h100-80gb" in (info.value.hint or "")


# ---- (e) config.json errors ---------------------------------------------------------------------
def _error(path: Path) -> DsgenError:
    with pytest.raises(DsgenError) as info:
        shape_from_hf_config(path)
    return info.value


def test_missing_file(tmp_path: Path) -> None:
    err = _error(tmp_path / "nope" / "config.json")
    assert err.location.file == str(tmp_path / "nope" / "config.json")
    assert "cannot read" in err.message


def test_folder_without_config_json(tmp_path: Path) -> None:
    assert _error(tmp_path).location.file == str(tmp_path / "config.json")


def test_invalid_json_reports_the_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}\n', encoding="utf-8")
    err = _error(path)
    assert err.location == Location(str(path), 3)
    assert err.message.startswith("invalid JSON")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "\xff"}')
    assert "UTF-8" in _error(path).message


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[1, 2]", encoding="utf-8")
    assert "JSON object" in _error(path).message


def test_missing_model_type_lists_supported(tmp_path: Path) -> None:
    err = _error(_write_config(tmp_path, {"hidden_size": 4096}))
    assert (err.path, err.message) == ("model_type", "missing")
    assert "gpt_neox" in (err.hint or "")


def test_unknown_model_type_without_decoder_keys_names_the_missing_key(tmp_path: Path) -> None:
    err = _error(_write_config(tmp_path, {"model_type": "mystery", "hidden_size": 4544}))
    assert err.path == "num_hidden_layers"
    assert "'mystery'" in err.message
    assert all(model_type in (err.hint or "") for model_type in SUPPORTED_MODEL_TYPES)


def test_missing_required_field_names_file_and_field(tmp_path: Path) -> None:
    config = dict(REAL_CONFIGS["llama-3.1-8b"])
    del config["hidden_size"]
    path = _write_config(tmp_path, config)
    assert str(_error(path)) == f"{path}: hidden_size: missing"


def test_null_required_field(tmp_path: Path) -> None:
    path = _write_config(tmp_path, {**REAL_CONFIGS["gpt2"], "n_layer": None})
    err = _error(path)
    assert (err.path, err.message) == ("n_layer", "is null")


def test_wrong_type_reports_the_line(tmp_path: Path) -> None:
    path = _write_config(tmp_path, {**REAL_CONFIGS["mistral-7b"], "num_hidden_layers": "32"})
    err = _error(path)
    assert err.path == "num_hidden_layers"
    assert "expected an integer" in err.message
    lines = path.read_text(encoding="utf-8").splitlines()
    assert err.location.line is not None and '"num_hidden_layers"' in lines[err.location.line - 1]


@pytest.mark.parametrize(
    ("change", "key", "fragment"),
    [
        ({"num_key_value_heads": 5}, "num_key_value_heads", "does not divide num_attention_heads"),
        ({"hidden_size": 4100}, "num_attention_heads", "does not divide hidden_size"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok", "exceeds num_local_experts"),
        ({"vocab_size": 0}, "vocab_size", "at least 1"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings", "true or false"),
        ({"attention_dropout": 1.5}, "attention_dropout", "probability"),
    ],
)
def test_inconsistent_values(change: dict[str, Any], key: str, fragment: str, tmp_path: Path) -> None:
    err = _error(_write_config(tmp_path, {**REAL_CONFIGS["mixtral-8x7b"], **change}))
    assert err.path == key
    assert fragment in err.message


# ---- startup cost ---------------------------------------------------------------------------------
def test_catalog_imports_stay_light() -> None:
    """Loading every preset and reading a config must not pull in torch or transformers."""
    code = (
        "import sys\n"
        "from dsgen.catalog import presets, hf_config\n"
        "presets.gpu_presets(); presets.model_presets()\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)
