"""An inline ``model.architecture`` block with a published model's config.json numbers must count
that model's published parameters: the per-family layout defaults (biases, norms per layer,
tying, learned positions) are what the block leaves out, so this checks them."""

from __future__ import annotations

import pytest

from dsgen.catalog.presets import model_presets, published_parameter_counts
from dsgen.estimate.throughput import model_flops_per_token
from dsgen.intake.loader import load_spec_text
from tests.conftest import EXAMPLES_DIR

# one preset per family the architecture block accepts (mixtral has no preset)
PRESETS = {
    "llama": "llama-3.1-8b",
    "mistral": "mistral-7b",
    "qwen2": "qwen2.5-7b",
    "gemma2": "gemma-2-9b",
    "phi3": "phi-3-mini",
    "gpt2": "gpt2-xl",
    "bert": "bert-large",
}
NUMBERS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "sliding_window",
    "sliding_window_layers",
)


@pytest.mark.parametrize("family", sorted(PRESETS))
def test_config_json_numbers_give_the_published_parameter_count(family: str) -> None:
    preset = PRESETS[family]
    shape = model_presets()[preset]
    numbers = ", ".join(f"{key}: {getattr(shape, key)}" for key in NUMBERS)
    text = (
        f"model: {{architecture: {{family: {family}, {numbers}}}}}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
        "training: {sequence_length: 512, global_batch_size: 64}\n"
    )
    inline = load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR).model
    assert inline.parameter_count() == published_parameter_counts()[preset]


# every family with a preset, and for bert the preset of the issue-16 drift (tie_word_embeddings)
SAME_AS_PRESET = {**PRESETS, "bert": "bert-base", "gpt_neox": "pythia-1b"}


@pytest.mark.parametrize("family", sorted(SAME_AS_PRESET))
def test_inline_numbers_build_the_presets_model(family: str) -> None:
    """Both read the family's layout from model-families.yaml, so the same numbers give the same
    model: not just the parameter count (bert's excludes the tied MLM head) but every field."""
    preset = model_presets()[SAME_AS_PRESET[family]]
    numbers = ", ".join(f"{key}: {getattr(preset, key)}" for key in NUMBERS)
    text = (
        f"model: {{architecture: {{family: {family}, {numbers}}}, name: {preset.name}}}\n"
        "hardware: {gpu: h100-80gb}\n"
        "training: {sequence_length: 512, global_batch_size: 64}\n"
    )
    inline = load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR).model
    assert inline == preset
    assert model_flops_per_token(inline, 512) == model_flops_per_token(preset, 512)
