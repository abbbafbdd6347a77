"""The tiny models the torchrun workers build, and the ``--case`` argument they all take.

Each model is built from a transformers config with random weights, nothing downloaded, small
enough for a 2-core machine: GQA attention and an untied LM head throughout; Qwen3 with its own
head width (its q/k norms are per head); the MoE ones with 8 experts, top-2, in every layer.
``tests/finetune_worker.py``, ``tests/mp_worker.py`` and ``tests/grpo_worker.py`` build from here,
and the tests that predict their runs read the same sizes.

A worker runs as a script (``torchrun tests/X_worker.py``), where ``tests/`` and not the checkout
is on ``sys.path``; it imports this module as ``tiny_models`` then (see the workers' imports).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

TINY_MODELS: dict[str, dict[str, Any]] = {
    "llama": {
        "vocab_size": 1000,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
    "qwen3_moe": {
        "vocab_size": 1000,
        "hidden_size": 256,
        "intermediate_size": 512,  # a dense MLP's width (no layer is dense here: mlp_only_layers=[])
        "moe_intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
    "mixtral": {
        "vocab_size": 1000,
        "hidden_size": 256,
        "intermediate_size": 128,  # Mixtral's per-expert width
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
}
# the llama sizes with Qwen3's own head width (its q/k norms are per head)
TINY_MODELS["qwen3"] = {**TINY_MODELS["llama"], "head_dim": 32}

#: transformers' (config, causal-LM) class names of each family
_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
}


def model_classes(model: str) -> tuple[Any, Any]:
    """transformers' config and causal-LM classes of ``model``. A worker imports them before any
    ``zero.Init`` (see tests/ds_train_worker.py)."""
    if model not in _CLASSES:
        raise ValueError(f"unknown model {model!r}; expected one of {sorted(_CLASSES)}")
    import transformers

    config_name, model_name = _CLASSES[model]
    return getattr(transformers, config_name), getattr(transformers, model_name)


def hf_config(case: dict[str, Any]) -> Any:
    """The transformers config of a case: its model's tiny sizes with the case's
    ``model_overrides``, positions for its sequence length, no KV cache (training)."""
    config_cls, _ = model_classes(case["model"])
    keys = {**TINY_MODELS[case["model"]], **case.get("model_overrides", {})}
    return config_cls(**keys, max_position_embeddings=max(int(case["seq_len"]), 128), use_cache=False)


def parse_case_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """A worker's command line: ``--case CASE.json``, the case its launcher wrote."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--case", type=Path, required=True, help="the case JSON its launcher wrote")
    return parser.parse_args(argv)
