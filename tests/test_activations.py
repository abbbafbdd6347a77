"""dsgen's activation-memory model: hand-computed pins per family, and measured against transformers.

The pins write out the formulas of docs/memory-model.md ("Activations by family") for real
presets, so a change to the code that is not also a change to the documented formula fails here.
The measured tests build tiny models with transformers and count what autograd saves for
backward (bench/activation_accuracy.py's measurement), so a change to transformers that the
inventory no longer matches fails here too.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from dsgen.catalog.presets import get_model
from dsgen.estimate.activations import estimate_activations
from tests.conftest import single_threaded_bench


def per_layer(preset: str, *, b: int, s: int, dtype_bytes: int, attention: str) -> int:
    shape = get_model(preset)
    return estimate_activations(
        shape, micro_batch_size=b, sequence_length=s, dtype_bytes=dtype_bytes, attention=attention, checkpointing=False
    ).per_layer


# ---- pins: the documented formula, by hand -----------------------------------------------------
def test_llama_3_1_8b_bf16_flash() -> None:
    # h 4096, q 32x128 = 4096, kv 8x128 = 1024, f 14336, nh 32, e 2
    rmsnorm = 4 * 4096 + 4 + 2 * 4096 + 2 * 4096  # fp32 x, rsqrt, normed cast back, output
    attention = 2 * 4096 + 2 * 2 * 1024 + 2 * 4096 + 4 * 32  # q, k, v, output, fp32 LSE
    mlp = 4 * 2 * 14336  # gate, SiLU output, up, product
    per_token = 2 * rmsnorm + attention + mlp
    assert per_token == 200_840
    assert per_layer("llama-3.1-8b", b=1, s=4096, dtype_bytes=2, attention="flash") == 1 * 4096 * per_token


def test_llama_3_1_8b_sdpa_equals_flash() -> None:
    # the fused sdpa kernels save what flash saves; llama's rotary leaves q laid out (b, s, nh, d): no output copy
    flash = per_layer("llama-3.1-8b", b=2, s=2048, dtype_bytes=2, attention="flash")
    assert per_layer("llama-3.1-8b", b=2, s=2048, dtype_bytes=2, attention="sdpa") == flash


def test_llama_3_1_8b_bf16_eager() -> None:
    rmsnorm = 4 * 4096 + 4 + 2 * 4096 + 2 * 4096
    linear = 2 * 4096 + 2 * (2 * 4096) + 2 * 4096  # q, k and v repeated to 32 heads, merged output
    quadratic = 32 * (4 + 2)  # fp32 softmax and its bf16 copy, per key position
    per_token = 2 * rmsnorm + linear + 4 * 2 * 14336 + quadratic * 4096
    assert per_layer("llama-3.1-8b", b=1, s=4096, dtype_bytes=2, attention="eager") == 4096 * per_token


def test_llama_3_1_8b_totals_outside_layers_and_checkpointing() -> None:
    shape = get_model("llama-3.1-8b")
    b, s = 1, 4096
    rmsnorm = 4 * 4096 + 4 + 2 * 4096 + 2 * 4096
    per_token = 2 * rmsnorm + (2 * 4096 + 2 * 2 * 1024 + 2 * 4096 + 4 * 32) + 4 * 2 * 14336
    # ids and shifted labels, final norm, fp32 log-softmax of the 128256-entry vocabulary; cos/sin per position
    outside = b * s * (8 + 8 + rmsnorm + 4 * 128256) + s * 2 * 2 * 128
    full = estimate_activations(
        shape, micro_batch_size=b, sequence_length=s, dtype_bytes=2, attention="flash", checkpointing=False
    )
    assert full.total == 32 * b * s * per_token + outside
    ckpt = estimate_activations(
        shape, micro_batch_size=b, sequence_length=s, dtype_bytes=2, attention="flash", checkpointing=True
    )
    # each layer's input, plus the position ids the checkpoints hold
    assert ckpt.total == 32 * b * s * 2 * 4096 + outside + s * 8
    # one layer rebuilt in backward, plus its output, which the reentrant checkpoint holds while
    # autograd runs backward through it (in bf16 the first norm's fp32 upcast is a real copy)
    assert ckpt.recompute_working_set == b * s * (per_token + 2 * 4096)
    eager_ckpt = estimate_activations(
        shape, micro_batch_size=b, sequence_length=s, dtype_bytes=2, attention="eager", checkpointing=True
    )
    assert eager_ckpt.total == ckpt.total + b * s * s * 2  # the 4-D causal mask the checkpoints hold


def test_llama_3_1_8b_selective_recomputation() -> None:
    """Selective recomputation keeps the attention function's inputs (q, and k and v at kv size: the
    repeat happens inside) and its output, drops the s x s terms, and keeps the shared 4-D mask and
    position ids the checkpointed attention calls hold."""
    b, s = 2, 4096

    def estimate(attention: str, checkpointing: bool = False, selective: bool = False):
        return estimate_activations(
            get_model("llama-3.1-8b"),
            micro_batch_size=b,
            sequence_length=s,
            dtype_bytes=2,
            attention=attention,
            checkpointing=checkpointing,
            selective=selective,
        )

    rmsnorm = 4 * 4096 + 4 + 2 * 4096 + 2 * 4096
    kept = 2 * rmsnorm + (2 * 4096 + 2 * 2 * 1024 + 2 * 4096) + 4 * 2 * 14336
    none, selective = estimate("eager"), estimate("eager", selective=True)
    assert selective.layers == 32 * b * s * kept
    assert selective.outside_layers == none.outside_layers + b * s * s * 2 + s * 8
    assert selective.recompute_working_set == none.per_layer - b * s * kept  # one layer's attention, rebuilt
    # with flash attention only the fp32 log-sum-exp goes
    assert estimate("flash").layers - estimate("flash", selective=True).layers == 32 * b * s * 4 * 32
    # full checkpointing wins over selective
    assert estimate("eager", checkpointing=True, selective=True) == estimate("eager", checkpointing=True)


def test_mistral_7b_fp32_sdpa() -> None:
    rmsnorm = 4 * 4096 + 4 + 4 * 4096 + 4 * 4096  # e = 4: the casts are no-ops, the storages remain
    attention = 4 * 4096 + 2 * 4 * 1024 + 4 * 4096 + 4 * 32
    per_token = 2 * rmsnorm + attention + 4 * 4 * 14336
    assert per_layer("mistral-7b", b=2, s=2048, dtype_bytes=4, attention="sdpa") == 2 * 2048 * per_token


def test_qwen2_5_7b_bf16_eager() -> None:
    # h 3584, q 28x128 = 3584, kv 4x128 = 512, f 18944, nh 28
    rmsnorm = 4 * 3584 + 4 + 2 * 3584 + 2 * 3584
    linear = 4 * (2 * 3584)  # q, repeated k, repeated v, merged output
    per_token = 2 * rmsnorm + linear + 4 * 2 * 18944 + 28 * (4 + 2) * 1024
    assert per_layer("qwen2.5-7b", b=1, s=1024, dtype_bytes=2, attention="eager") == 1024 * per_token


def test_gemma_2_9b_bf16_eager() -> None:
    # h 3584, q 16x256 = 4096, kv 8x256 = 2048, f 14336, nh 16
    gemma_norm = 4 * 3584 + 4 + 4 * 3584  # fp32 x, rsqrt, fp32 normed
    norms = 2 * (gemma_norm + 2 * 3584) + 2 * gemma_norm  # input and pre-feedforward norms feed linears
    linear = 4 * (2 * 4096)
    quadratic = 16 * (4 + 2) + 16 * 2  # fp32 softmax + bf16 copy, soft-capping tanh output
    per_token = norms + linear + 4 * 2 * 14336 + quadratic * 4096
    assert per_layer("gemma-2-9b", b=1, s=4096, dtype_bytes=2, attention="eager") == 4096 * per_token


def test_phi_3_mini_bf16_flash() -> None:
    # h 3072, q = kv = 32x96 = 3072, f 8192, nh 32; the rotary's torch.cat makes the output projection copy
    rmsnorm = 4 * 3072 + 4 + 2 * 3072 + 2 * 3072
    attention = 2 * 3072 + 2 * 2 * 3072 + 2 * 3072 + 4 * 32 + 2 * 3072
    mlp = 2 * 2 * 8192 + 2 * 8192 + 2 * 8192  # fused gate_up storage, SiLU output, product
    per_token = 2 * rmsnorm + attention + mlp
    assert per_layer("phi-3-mini", b=1, s=4096, dtype_bytes=2, attention="flash") == 4096 * per_token


def test_mixtral_8x7b_bf16_flash() -> None:
    rmsnorm = 4 * 4096 + 4 + 2 * 4096 + 2 * 4096
    attention = 2 * 4096 + 2 * 2 * 1024 + 2 * 4096 + 4 * 32
    router = 4 * 8 + 8 * 2 + 4 * 2 + 4  # fp32 softmax, top-2 indices, renormalised weights and their sum
    expert = 2 * 4096 + 2 * 2 * 14336 + 2 * 2 * 14336 + 2 * 4096 + 4 + 3 * 8  # per routed copy
    per_token = 2 * rmsnorm + attention + router + 2 * expert
    assert per_layer("mixtral-8x7b", b=1, s=4096, dtype_bytes=2, attention="flash") == 4096 * per_token


def test_gpt2_bf16_sdpa_with_dropout() -> None:
    # h 768, f 3072, nh 12, dropout 0.1 (the preset's): two residual masks of one byte per element
    layernorm = 2 * 768 + 8
    attention = 3 * 2 * 768 + 2 * 2 * 768 + 2 * 768 + 4 * 12  # fused c_attn (q view), cached k and v, output, LSE
    per_token = (layernorm + 2 * 768) + attention + 768 + (layernorm + 2 * 768) + 4 * 2 * 3072 + 2 * 3072 + 768
    assert per_layer("gpt2", b=8, s=1024, dtype_bytes=2, attention="sdpa") == 8 * 1024 * per_token


def test_gpt2_bf16_eager_with_dropout() -> None:
    layernorm = 2 * 768 + 8
    linear = 4 * 2 * 768  # q copied for the batched matmul, k, v, merged output
    quadratic = 12 * (2 + 1 + 2)  # bf16 softmax, dropout mask, dropped probabilities
    per_token = (layernorm + 2 * 768) + linear + 768 + (layernorm + 2 * 768) + 5 * 2 * 3072 + 768
    per_token += quadratic * 1024
    assert per_layer("gpt2", b=8, s=1024, dtype_bytes=2, attention="eager") == 8 * 1024 * per_token


def test_pythia_1b_bf16_flash() -> None:
    # gpt_neox: h 2048, q = kv = 8x256 = 2048, f 8192, nh 8; parallel residual
    shared_input = 2 * 2048 + 8 + 8  # one LayerNorm input, two mean/rstd pairs
    attention = 2 * 2048 + 2 * 2 * 2048 + 2 * 2048 + 4 * 8 + 2 * 2048  # q, k, v, output, LSE, output copy
    per_token = shared_input + 2 * 2 * 2048 + attention + 2 * 2 * 8192
    assert per_layer("pythia-1b", b=4, s=2048, dtype_bytes=2, attention="flash") == 4 * 2048 * per_token


def test_bert_base_bf16_eager_with_dropout() -> None:
    # h 768, f 3072, nh 12, dropout 0.1
    layernorm = 2 * 768 + 8
    attention = 4 * 2 * 768  # q, k, v, output
    quadratic = 12 * (2 + 1 + 2)  # bf16 softmax, dropout mask, dropped probabilities
    per_token = 2 * 768 + attention + 768 + layernorm + 2 * 768 + 2 * 2 * 3072 + 768 + layernorm
    per_token += quadratic * 512
    assert per_layer("bert-base", b=32, s=512, dtype_bytes=2, attention="eager") == 32 * 512 * per_token


def test_checkpointing_keeps_layer_inputs_only() -> None:
    shape = get_model("qwen2.5-7b")
    kwargs = dict(micro_batch_size=2, sequence_length=4096, dtype_bytes=2, attention="flash")
    full = estimate_activations(shape, checkpointing=False, **kwargs)
    ckpt = estimate_activations(shape, checkpointing=True, **kwargs)
    assert ckpt.layers == 28 * 2 * 4096 * 2 * 3584
    assert full.layers == 28 * full.per_layer
    assert ckpt.per_layer == full.per_layer
    assert full.recompute_working_set == 0


# ---- measured against transformers ---------------------------------------------------------------
@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    yield from single_threaded_bench("activation_accuracy", "torch", "transformers")


# (family, dtype, attention, checkpointing, dropout, (micro-batch, sequence)): a spread over the code paths
MEASURED = [
    ("llama", "bf16", "sdpa", "none", 0.0, (2, 64)),
    ("llama", "fp32", "eager", "full", 0.0, (2, 64)),
    ("llama", "bf16", "eager", "selective", 0.0, (2, 64)),
    ("mistral", "bf16", "eager", "none", 0.0, (1, 96)),  # one kv head at micro-batch 1: k and v stay views
    ("gemma2", "bf16", "eager", "none", 0.0, (2, 64)),
    ("gemma2", "bf16", "eager", "selective", 0.0, (2, 64)),  # soft-capping and both masks recomputed/kept
    ("phi3", "fp32", "sdpa", "full", 0.0, (2, 64)),
    ("mixtral", "bf16", "sdpa", "none", 0.0, (2, 64)),
    ("gpt2", "bf16", "sdpa", "none", 0.0, (2, 64)),
    ("gpt2", "fp32", "eager", "none", 0.1, (2, 64)),
    ("gpt2", "bf16", "eager", "selective", 0.1, (2, 64)),  # attention dropout recomputed, c_attn output kept
    ("gpt_neox", "bf16", "sdpa", "none", 0.0, (2, 64)),
    ("bert", "bf16", "eager", "none", 0.1, (2, 64)),
    ("bert", "bf16", "sdpa", "selective", 0.0, (2, 64)),
    # today's decoders (issue 17), one case per trait
    ("qwen3", "bf16", "sdpa", "none", 0.0, (2, 64)),  # per-head q/k norms
    ("olmo2", "bf16", "eager", "full", 0.0, (2, 64)),  # all-heads q/k norms, post-norms, fp32 rotary
    ("gemma3_text", "bf16", "sdpa", "none", 0.0, (2, 96)),  # sandwich norms; sliding layers get a mask (s > 64)
    ("gemma3_text", "fp32", "sdpa", "full", 0.0, (1, 128)),  # the sliding mask held by the checkpoints
    ("olmo3", "bf16", "eager", "selective", 0.0, (2, 96)),  # sliding layer_types, two rotary tables
    ("qwen3_moe", "bf16", "sdpa", "none", 0.0, (2, 64)),  # top-k routed experts
    ("qwen2_moe", "bf16", "eager", "none", 0.0, (2, 64)),  # gated shared expert
    ("deepseek_v3", "bf16", "eager", "none", 0.0, (2, 64)),  # MLA, sigmoid router, shared expert, dense layer
    ("deepseek_v3", "fp32", "eager", "full", 0.0, (1, 64)),
    ("gpt_oss", "bf16", "eager", "none", 0.0, (2, 96)),  # attention sinks, clamped GLU experts
]


@pytest.mark.parametrize(
    ("family", "dtype", "attention", "ckpt", "dropout", "point"),
    MEASURED,
    ids=["-".join(str(part) for part in case[:5]) for case in MEASURED],
)
def test_measured_matches_prediction(
    bench: ModuleType, family: str, dtype: str, attention: str, ckpt: str, dropout: float, point: tuple[int, int]
) -> None:
    config = bench.hf_config(family, "tiny", dropout)
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        shape = bench.shape_from_hf_config(Path(tmp))
    assert shape.dropout == dropout
    model = bench.build_model(config, bench.DTYPES[dtype], attention)
    bench.set_checkpointing(model, ckpt)
    batch, seq = point
    measured = bench.measure_saved_bytes(model, batch, seq, selective=ckpt == "selective")
    predicted = bench.dsgen_prediction(shape, batch, seq, dtype, attention, ckpt)
    error = 100 * (predicted - measured) / measured
    assert abs(error) <= 8.0, f"b={batch} s={seq}: measured {measured}, dsgen {predicted} ({error:+.1f} %)"


def test_measurement_dedupes_storages_and_skips_parameters(bench: ModuleType) -> None:
    """A linear saves its input and its weight: only the input counts, once, however many ops save it."""
    torch = bench.torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = type("Config", (), {"vocab_size": 10})()
            self.embed = torch.nn.Embedding(10, 8)
            self.proj = torch.nn.Linear(8, 8, bias=False)
            self.other = torch.nn.Linear(8, 8, bias=False)

        def forward(self, input_ids, labels):  # the HF calling convention
            x = self.embed(input_ids) * 2.0  # the product is saved by both projections
            y = self.proj(x) + self.other(x)
            return type("Out", (), {"loss": y.sum()})()

    model = Tiny()
    saved = bench.measure_saved_bytes(model, 2, 3)
    assert saved == 2 * 3 * 8 * 4 + 2 * 3 * 8  # one fp32 (2, 3, 8) product, the int64 ids
