"""Today's decoders (issue 17): every supported model_type, read from a ``config.json`` that
``transformers`` itself writes (its class defaults, and a small variant that switches the traits
on and off), has exactly the parameter count of the model transformers builds from it on the meta
device, the same largest layer and the same largest module. Nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import require_module

from dsgen.catalog.hf_config import SUPPORTED_MODEL_TYPES, AssumptionWarning, shape_from_hf_config
from dsgen.catalog.model_shape import ModelShape
from dsgen.errors import DsgenError

MODERN = (
    "qwen3",
    "qwen3_moe",
    "qwen2_moe",
    "gemma3_text",
    "llama4_text",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "glm4_moe",
    "olmo2",
    "olmo3",
    "smollm3",
    "granite",
    "starcoder2",
    "cohere2",
    "falcon",
    "olmoe",
    "internlm3",
    "seed_oss",
    "ernie4_5",
)
_SMALL = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 1000}
_SMALL_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 96}
# A size variant per model_type that also flips its optional traits (biases, q/k norms, dense
# leading layers, shared experts, no q LoRA, sliding-window layer patterns ...).
VARIANTS: dict[str, dict[str, Any]] = {
    "qwen3": {**_SMALL, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "attention_bias": True},
    "qwen3_moe": {
        **_SMALL,
        **_SMALL_MOE,
        "num_key_value_heads": 4,
        "intermediate_size": 512,
        "num_experts": 8,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "tie_word_embeddings": True,
    },
    "qwen2_moe": {
        **_SMALL,
        **_SMALL_MOE,
        "intermediate_size": 512,
        "num_key_value_heads": 4,
        "num_experts": 6,
        "shared_expert_intermediate_size": 384,
        "mlp_only_layers": [0],
        "qkv_bias": False,
    },
    "gemma3_text": {
        **_SMALL,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 512,
        "attention_bias": True,
    },
    "llama4_text": {
        **_SMALL,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 128,
        "intermediate_size_mlp": 512,
        "num_local_experts": 4,
        "interleave_moe_layer_step": 2,
    },
    "deepseek_v2": {
        **_SMALL,
        **_SMALL_MOE,
        "intermediate_size": 512,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "q_lora_rank": None,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "mlp_bias": True,
    },
    "deepseek_v3": {
        **_SMALL,
        **_SMALL_MOE,
        "intermediate_size": 512,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "first_k_dense_replace": 2,
        "n_group": 2,
        "topk_group": 1,
        "q_lora_rank": 96,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 24,
        "attention_bias": True,
    },
    "gpt_oss": {
        **_SMALL,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 128,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
    "glm4_moe": {
        **_SMALL,
        **_SMALL_MOE,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "first_k_dense_replace": 2,
        "use_qk_norm": True,
        "attention_bias": True,
    },
    "olmo2": {**_SMALL, "num_key_value_heads": 4, "intermediate_size": 512, "attention_bias": True},
    "olmo3": {
        **_SMALL,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "sliding_window": 64,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    },
    "smollm3": {
        **_SMALL,
        "pad_token_id": None,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "mlp_bias": True,
        "attention_bias": True,
    },
    "granite": {**_SMALL, "num_key_value_heads": 2, "intermediate_size": 512, "attention_bias": True},
    "starcoder2": {**_SMALL, "num_key_value_heads": 2, "intermediate_size": 1024, "use_bias": False},
    "cohere2": {**_SMALL, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 512, "attention_bias": True},
    "falcon": {**_SMALL, "new_decoder_architecture": True, "num_kv_heads": 2, "bias": True, "ffn_hidden_size": 640},
    "olmoe": {**_SMALL, "num_key_value_heads": 4, "intermediate_size": 96, "num_experts": 8, "num_experts_per_tok": 2},
    "internlm3": {
        **_SMALL,
        "num_key_value_heads": 2,
        "head_dim": 48,
        "intermediate_size": 512,
        "qkv_bias": True,
        "bias": True,
    },
    "seed_oss": {
        **_SMALL,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 512,
        "attention_out_bias": True,
        "mlp_bias": True,
    },
    "ernie4_5": {**_SMALL, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 512, "use_bias": True},
}
# DeepseekV2Config leaves num_experts_per_tok null (the model cannot route without it); the released
# DeepSeek-V2 configs set 6.
_DEFAULT_OVERRIDES: dict[str, dict[str, Any]] = {"deepseek_v2": {"num_experts_per_tok": 6}}


def _transformers_config(model_type: str, overrides: dict[str, Any]) -> Any:
    transformers = require_module("transformers")
    transformers.logging.set_verbosity_error()
    return transformers.CONFIG_MAPPING[model_type](**overrides)


def _write(config: Any, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(config.to_json_string(), encoding="utf-8")
    return directory


def _built(directory: Path) -> tuple[int, int, int]:
    """(parameters, largest module's own parameters, largest layer) of the model transformers builds."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    config = transformers.AutoConfig.from_pretrained(str(directory))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    stack = next(
        m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == config.num_hidden_layers
    )
    layer = max(sum(p.numel() for p in layer.parameters()) for layer in stack)
    return total, largest, layer


def _counts(shape: ModelShape) -> tuple[int, int, int]:
    return shape.parameter_count(), shape.largest_module_parameters(), shape.layer_parameters()


def test_every_listed_model_type_is_supported() -> None:
    assert set(MODERN) <= set(SUPPORTED_MODEL_TYPES)
    assert set(VARIANTS) == set(MODERN)


@pytest.mark.parametrize("model_type", MODERN)
def test_transformers_defaults_count_exactly(model_type: str, tmp_path: Path) -> None:
    directory = _write(_transformers_config(model_type, _DEFAULT_OVERRIDES.get(model_type, {})), tmp_path / model_type)
    assert _counts(shape_from_hf_config(directory)) == _built(directory)


@pytest.mark.parametrize("model_type", MODERN)
def test_size_variant_counts_exactly(model_type: str, tmp_path: Path) -> None:
    directory = _write(_transformers_config(model_type, VARIANTS[model_type]), tmp_path / model_type)
    shape = shape_from_hf_config(directory)
    assert _counts(shape) == _built(directory)
    assert shape.num_layers == 4 and shape.hidden_size == 256


@pytest.mark.parametrize("model_type", MODERN)
def test_parameter_tensors_are_those_transformers_builds(model_type: str, tmp_path: Path) -> None:
    """ZeRO-3 partitions (and keeps persistent) each tensor on its own: the tensor sizes, not just
    their sum, must be transformers'."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    directory = _write(_transformers_config(model_type, VARIANTS[model_type]), tmp_path / model_type)
    shape = shape_from_hf_config(directory)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(directory))
    built = sorted(p.numel() for p in model.parameters())
    assert sorted(math.prod(s) for s in shape.parameter_shapes()) == built


def test_traits_read_from_the_keys(tmp_path: Path) -> None:
    def read(model_type: str) -> ModelShape:
        return shape_from_hf_config(
            _write(_transformers_config(model_type, VARIANTS[model_type]), tmp_path / model_type)
        )

    qwen3_moe = read("qwen3_moe")  # sparse step 2: layers 1 and 3, but 3 is mlp-only
    assert (qwen3_moe.num_experts, qwen3_moe.moe_layers, qwen3_moe.dense_layers) == (8, 1, 3)
    assert qwen3_moe.qk_norm == "head"
    v3 = read("deepseek_v3")
    assert (v3.is_mla, v3.q_lora_rank, v3.kv_lora_rank, v3.dense_layers, v3.shared_expert_intermediate_size) == (
        True,
        96,
        64,
        2,
        96,
    )
    assert read("gpt_oss").attention_sinks and read("gpt_oss").sliding_window_layers == 2
    assert read("olmo3").sliding_window_layers == 3
    assert read("olmo2").qk_norm == "full"
    assert read("cohere2").parallel_block and not read("cohere2").norm_bias
    assert read("llama4_text").moe_layers == 2


def test_active_parameters_count_only_routed_experts(tmp_path: Path) -> None:
    """Active parameters: everything but the routed experts a token does not use."""
    shape = shape_from_hf_config(_write(_transformers_config("qwen3_moe", VARIANTS["qwen3_moe"]), tmp_path / "m"))
    unused = shape.moe_layers * (shape.num_experts - shape.experts_per_token) * shape.expert_mlp_parameters()
    assert shape.parameter_count() - shape.active_parameter_count() == unused
    assert shape.expert_mlp_parameters() == 3 * 256 * 96


def test_unknown_model_type_is_read_by_traits_with_a_warning(tmp_path: Path) -> None:
    """A model_type dsgen has never seen, with llama keys: read as a llama decoder, saying so; the
    count is that of transformers' llama built from the same numbers."""
    llama = _transformers_config("llama", {**_SMALL, "num_key_value_heads": 2, "intermediate_size": 512})
    data = llama.to_dict()
    _write(llama, tmp_path / "llama")
    mystery = tmp_path / "mystery"
    mystery.mkdir()
    import json

    (mystery / "config.json").write_text(json.dumps({**data, "model_type": "my_new_decoder"}), encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shape = shape_from_hf_config(mystery)
    messages = [str(w.message) for w in caught if issubclass(w.category, AssumptionWarning)]
    assert len(messages) == 1 and "'my_new_decoder'" in messages[0] and "SwiGLU" in messages[0]
    assert _counts(shape) == _built(tmp_path / "llama")


def test_what_the_reader_assumed_is_a_note_in_the_plan_not_a_python_warning(tmp_path: Path) -> None:
    """The CLI and --json users see the assumption as one of the plan's notes, not as a Python
    warning with a source line."""
    from dsgen.api import load_spec, solve_spec
    from dsgen.reporting.report import result_dict

    data = _transformers_config("llama", {**_SMALL, "num_key_value_heads": 2, "intermediate_size": 512}).to_dict()
    (tmp_path / "config.json").write_text(json.dumps({**data, "model_type": "my_new_decoder"}), encoding="utf-8")
    spec_data = {
        "model": {"hf_config": "config.json"},
        "hardware": {"gpu": "a100-80gb", "gpus_per_node": 2},
        "training": {"sequence_length": 128, "global_batch_size": 8},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning escaping the loader fails the test
        spec = load_spec(spec_data, base_dir=tmp_path)
    notes = result_dict(solve_spec(spec))["notes"]
    assert any("'my_new_decoder' is not one dsgen knows" in note for note in notes), notes


def test_unreadable_model_type_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"model_type": "my_encoder", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}',
        encoding="utf-8",
    )
    with pytest.raises(DsgenError) as info:
        shape_from_hf_config(tmp_path)
    assert info.value.path == "intermediate_size"
    assert "'my_encoder'" in info.value.message


_SMALL_TEXT = {"hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 1000}
MULTIMODAL: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma3-defaults": ("gemma3", {}),
    "gemma3-small": (
        "gemma3",
        {
            "text_config": {**_SMALL_TEXT, "hidden_size": 640},
            "vision_config": {
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
            },
        },
    ),
    "qwen3_vl-defaults": ("qwen3_vl", {}),
    "llama4-defaults": ("llama4", {}),
    "llama4-small": (
        "llama4",
        {
            "text_config": {
                **_SMALL_TEXT,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 64,
                "intermediate_size": 128,
                "intermediate_size_mlp": 512,
                "num_local_experts": 4,
                "interleave_moe_layer_step": 2,
            },
            "vision_config": {
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "vision_output_dim": 256,
                "projector_input_dim": 256,
                "projector_output_dim": 256,
                "image_size": 112,
            },
        },
    ),
    "qwen3_vl-small": (
        "qwen3_vl",
        {
            "text_config": {**_SMALL_TEXT, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64},
            "vision_config": {
                "hidden_size": 128,
                "intermediate_size": 256,
                "depth": 3,
                "num_heads": 2,
                "out_hidden_size": 256,
                "deepstack_visual_indexes": [1],
            },
        },
    ),
}


@pytest.mark.parametrize("case", sorted(MULTIMODAL))
def test_multimodal_counts_the_whole_model(case: str, tmp_path: Path) -> None:
    """Gemma 3 (SigLIP tower) and Qwen3-VL: the count is the whole model's, the language model's
    part is the text model's; the warning says the activations are the language model's."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    model_type, overrides = MULTIMODAL[case]
    directory = _write(_transformers_config(model_type, overrides), tmp_path / case)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shape = shape_from_hf_config(directory)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.from_pretrained(directory))
    assert shape.parameter_count() == sum(p.numel() for p in model.parameters())
    inner = model.model if hasattr(model, "model") else model  # Llama4ForConditionalGeneration has no .model
    language = {id(p): p.numel() for p in inner.language_model.parameters()}
    language.update({id(p): p.numel() for p in model.get_output_embeddings().parameters()})
    assert shape.text_parameter_count() == sum(language.values())
    assert any("activations are those of the language model" in str(w.message) for w in caught)


def test_unknown_vision_tower_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"model_type": "my_vlm", "text_config": {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,'
        ' "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}, "vision_config": {}}',
        encoding="utf-8",
    )
    with pytest.raises(DsgenError) as info:
        shape_from_hf_config(tmp_path)
    assert info.value.path == "vision_config" and "'my_vlm'" in info.value.message


# ---- presets of today's models: their published config.json numbers -------------------------------
# (model_type and the architecture keys of each published config.json; the count is the preset's
# published_parameters, checked here against transformers' own model)
_QWEN3 = dict(model_type="qwen3", vocab_size=151936, head_dim=128, max_position_embeddings=40960)
PRESET_CONFIGS = {
    "qwen3-0.6b": (
        dict(
            _QWEN3,
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            intermediate_size=3072,
            tie_word_embeddings=True,
        ),
        596049920,
    ),
    "qwen3-1.7b": (
        dict(
            _QWEN3,
            hidden_size=2048,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            intermediate_size=6144,
            tie_word_embeddings=True,
        ),
        1720574976,
    ),
    "qwen3-4b": (
        dict(
            _QWEN3,
            hidden_size=2560,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=9728,
            tie_word_embeddings=True,
        ),
        4022468096,
    ),
    "qwen3-8b": (
        dict(
            _QWEN3,
            hidden_size=4096,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=12288,
            tie_word_embeddings=False,
        ),
        8190735360,
    ),
    "qwen3-14b": (
        dict(
            _QWEN3,
            hidden_size=5120,
            num_hidden_layers=40,
            num_attention_heads=40,
            num_key_value_heads=8,
            intermediate_size=17408,
            tie_word_embeddings=False,
        ),
        14768307200,
    ),
    "qwen3-32b": (
        dict(
            _QWEN3,
            hidden_size=5120,
            num_hidden_layers=64,
            num_attention_heads=64,
            num_key_value_heads=8,
            intermediate_size=25600,
            tie_word_embeddings=False,
        ),
        32762123264,
    ),
    "qwen3-30b-a3b": (
        dict(
            _QWEN3,
            model_type="qwen3_moe",
            hidden_size=2048,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_experts=128,
            num_experts_per_tok=8,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            tie_word_embeddings=False,
        ),
        30532122624,
    ),
    "gemma-3-1b": (
        dict(
            model_type="gemma3_text",
            hidden_size=1152,
            num_hidden_layers=26,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            intermediate_size=6912,
            vocab_size=262144,
            sliding_window=512,
            sliding_window_pattern=6,
            max_position_embeddings=32768,
        ),
        999885952,
    ),
    "gpt-oss-20b": (
        dict(
            model_type="gpt_oss",
            hidden_size=2880,
            num_hidden_layers=24,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            intermediate_size=2880,
            num_local_experts=32,
            num_experts_per_tok=4,
            vocab_size=201088,
            sliding_window=128,
            layer_types=["sliding_attention", "full_attention"] * 12,
            max_position_embeddings=131072,
        ),
        20914757184,
    ),
    "gpt-oss-120b": (
        dict(
            model_type="gpt_oss",
            hidden_size=2880,
            num_hidden_layers=36,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            intermediate_size=2880,
            num_local_experts=128,
            num_experts_per_tok=4,
            vocab_size=201088,
            sliding_window=128,
            layer_types=["sliding_attention", "full_attention"] * 18,
            max_position_embeddings=131072,
        ),
        116829156672,
    ),
    "deepseek-v3": (
        dict(
            model_type="deepseek_v3",
            hidden_size=7168,
            num_hidden_layers=61,
            num_attention_heads=128,
            num_key_value_heads=128,
            intermediate_size=18432,
            moe_intermediate_size=2048,
            n_routed_experts=256,
            num_experts_per_tok=8,
            n_shared_experts=1,
            first_k_dense_replace=3,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            vocab_size=129280,
            max_position_embeddings=163840,
        ),
        671026404352,
    ),
    "olmo-2-1b": (
        dict(
            model_type="olmo2",
            hidden_size=2048,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=16,
            intermediate_size=8192,
            vocab_size=100352,
            max_position_embeddings=4096,
        ),
        1484916736,
    ),
    "olmo-2-7b": (
        dict(
            model_type="olmo2",
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            intermediate_size=11008,
            vocab_size=100352,
            max_position_embeddings=4096,
        ),
        7298617344,
    ),
    "olmo-2-13b": (
        dict(
            model_type="olmo2",
            hidden_size=5120,
            num_hidden_layers=40,
            num_attention_heads=40,
            num_key_value_heads=40,
            intermediate_size=13824,
            vocab_size=100352,
            max_position_embeddings=4096,
        ),
        13716198400,
    ),
    "smollm3-3b": (
        dict(
            model_type="smollm3",
            hidden_size=2048,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=4,
            intermediate_size=11008,
            vocab_size=128256,
            tie_word_embeddings=True,
            max_position_embeddings=65536,
        ),
        3075098624,
    ),
    "mistral-small-24b": (
        dict(
            model_type="mistral",
            hidden_size=5120,
            num_hidden_layers=40,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=32768,
            vocab_size=131072,
            max_position_embeddings=32768,
        ),
        23572403200,
    ),
    "phi-4": (
        dict(
            model_type="phi3",
            hidden_size=5120,
            num_hidden_layers=40,
            num_attention_heads=40,
            num_key_value_heads=10,
            intermediate_size=17920,
            vocab_size=100352,
            max_position_embeddings=16384,
        ),
        14659507200,
    ),
}
_GEMMA3 = dict(
    model_type="gemma3",
    vision_config=dict(
        hidden_size=1152,
        intermediate_size=4304,
        num_hidden_layers=27,
        num_attention_heads=16,
        patch_size=14,
        image_size=896,
        vision_use_head=False,
    ),
)
for name, text, count in [
    (
        "gemma-3-4b",
        dict(
            hidden_size=2560,
            num_hidden_layers=34,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            intermediate_size=10240,
        ),
        4300079472,
    ),
    (
        "gemma-3-12b",
        dict(
            hidden_size=3840,
            num_hidden_layers=48,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            intermediate_size=15360,
        ),
        12187325040,
    ),
    (
        "gemma-3-27b",
        dict(
            hidden_size=5376,
            num_hidden_layers=62,
            num_attention_heads=32,
            num_key_value_heads=16,
            head_dim=128,
            intermediate_size=21504,
        ),
        27432406640,
    ),
]:
    PRESET_CONFIGS[name] = (
        dict(
            _GEMMA3,
            text_config=dict(
                text,
                model_type="gemma3_text",
                vocab_size=262208,
                sliding_window=1024,
                sliding_window_pattern=6,
                max_position_embeddings=131072,
            ),
        ),
        count,
    )

PRESET_CONFIGS["llama-4-scout"] = (
    {
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            "hidden_size": 5120,
            "num_hidden_layers": 48,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 8192,
            "intermediate_size_mlp": 16384,
            "num_local_experts": 16,
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 1,
            "vocab_size": 202048,
            "max_position_embeddings": 262144,
            "tie_word_embeddings": False,
            "attention_chunk_size": 8192,
        },
        "vision_config": {
            "hidden_size": 1408,
            "intermediate_size": 5632,
            "num_hidden_layers": 34,
            "num_attention_heads": 16,
            "image_size": 336,
            "patch_size": 14,
            "projector_input_dim": 4096,
            "projector_output_dim": 4096,
            "vision_output_dim": 4096,
            "pixel_shuffle_ratio": 0.5,
        },
    },
    108641793536,
)


@pytest.mark.parametrize("name", sorted(PRESET_CONFIGS))
def test_preset_is_its_published_config_and_transformers_count(name: str, tmp_path: Path) -> None:
    torch = require_module("torch")
    transformers = require_module("transformers")
    import json
    from dataclasses import replace

    from dsgen.catalog.presets import get_model, published_parameter_counts

    config, published = PRESET_CONFIGS[name]
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AssumptionWarning)
        shape = shape_from_hf_config(directory)
    assert shape == replace(get_model(name), name=name)
    assert published_parameter_counts()[name] == published
    auto = transformers.AutoModelForImageTextToText if "text_config" in config else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(transformers.AutoConfig.from_pretrained(directory))
    assert sum(p.numel() for p in model.parameters()) == published


def test_a_spec_may_point_hf_config_at_a_model_folder(tmp_path: Path) -> None:
    """``model.hf_config`` names a local snapshot folder holding config.json, as a user has it."""
    from dsgen.intake.loader import load_spec_text

    _write(_transformers_config("qwen3_moe", VARIANTS["qwen3_moe"]), tmp_path / "Qwen3-MoE-tiny")
    spec_text = (
        "model: {hf_config: Qwen3-MoE-tiny}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
        "training: {sequence_length: 512, global_batch_size: 8}\n"
    )
    spec = load_spec_text(spec_text, file="<spec>", base_dir=tmp_path)
    assert spec.model.name == "Qwen3-MoE-tiny" and spec.model.num_experts == 8
    missing = spec_text.replace("Qwen3-MoE-tiny", "nowhere")
    with pytest.raises(DsgenError) as info:
        load_spec_text(missing, file="<spec>", base_dir=tmp_path)
    assert "file not found" in info.value.message
