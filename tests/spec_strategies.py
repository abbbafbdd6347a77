"""Hypothesis strategies that produce random *valid* spec documents (plain dicts, as YAML would)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

MODEL_PRESETS = [
    "gpt2",
    "gpt2-xl",
    "bert-base",
    "llama-3.2-1b",
    "llama-3.1-8b",
    "mistral-7b",
    "qwen2.5-7b",
    "gemma-2-2b",
    "phi-3-mini",
    "llama-2-13b",
    "qwen2.5-0.5b",
    "mixtral-8x7b",
]
GPU_PRESETS = ["a100-80gb", "a100-40gb", "h100-80gb", "h200", "v100-32gb", "l4", "rtx-4090", "mi300x", "a10g"]


@st.composite
def architectures(draw: st.DrawFn) -> dict[str, Any]:
    heads = draw(st.sampled_from([4, 8, 16, 32]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    family = draw(st.sampled_from(["llama", "mistral", "qwen2", "gpt2"]))
    arch: dict[str, Any] = {
        "family": family,
        "num_layers": draw(st.integers(2, 48)),
        "hidden_size": heads * head_dim,
        "num_attention_heads": heads,
        "num_key_value_heads": kv if family != "gpt2" else heads,
        "vocab_size": draw(st.sampled_from([32000, 50257, 128256, 151936])),
    }
    if draw(st.booleans()):
        arch["intermediate_size"] = draw(st.integers(1, 6)) * heads * head_dim
    return arch


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec dict the loader accepts; sized so most draws have a feasible plan."""
    gpus_per_node = draw(st.sampled_from([1, 2, 4, 8]))
    nodes = draw(st.sampled_from([1, 1, 2, 4]))
    dp = gpus_per_node * nodes
    model: dict[str, Any]
    if draw(st.integers(0, 3)) == 0:
        model = {"architecture": draw(architectures())}
    else:
        model = {"preset": draw(st.sampled_from(MODEL_PRESETS))}
    gpu = draw(st.sampled_from(GPU_PRESETS))
    # FlashAttention-2 needs compute capability 8.0: the loader refuses it on a V100
    attentions = ["sdpa", "eager"] if gpu == "v100-32gb" else ["flash", "sdpa", "eager"]
    spec: dict[str, Any] = {
        "model": model,
        "hardware": {
            "gpu": gpu,
            "gpus_per_node": gpus_per_node,
            "nodes": nodes,
            "cpu_memory_gib": draw(st.sampled_from([256, 1024, 2048])),
        },
        "training": {
            "sequence_length": draw(st.sampled_from([128, 512, 1024, 2048, 4096])),
            "global_batch_size": dp * draw(st.sampled_from([1, 2, 3, 4, 8, 16])),
            "attention": draw(st.sampled_from(attentions)),
            "optimizer": {
                "type": draw(st.sampled_from(["adamw", "adam", "lion", "sgd", "adagrad", "adafactor", "adamw-8bit"])),
                "lr": draw(st.sampled_from([1e-5, 3e-4])),
            },
            "scheduler": {"type": draw(st.sampled_from(["none", "warmup", "warmup_decay", "warmup_cosine"]))},
        },
    }
    if draw(st.booleans()):
        spec["hardware"]["nvme"] = {"path": "/local_nvme", "capacity_gib": 4000}
    constraints: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        constraints["zero_stage"] = draw(st.sampled_from([0, 1, 2, 3]))
    if draw(st.integers(0, 4)) == 0:
        constraints["activation_checkpointing"] = draw(st.sampled_from([False, True, "selective"]))
    if constraints:
        spec["constraints"] = constraints
    return spec
