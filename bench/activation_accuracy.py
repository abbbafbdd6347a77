"""Accuracy of dsgen's activation-memory model against what autograd actually saves.

For each family (llama, mistral, qwen2, gemma2, phi3, gpt2, gpt_neox, bert, mixtral) a tiny and a
mid-size model is built with ``transformers`` from a config (random weights, nothing downloaded),
in bf16 and fp32, with eager and sdpa attention, with no, full and selective checkpointing, and
run forward through the HF loss (``labels=input_ids``) at several (micro-batch, sequence) points.
Full checkpointing is transformers' ``gradient_checkpointing_enable()``; selective recomputation
(Korthikanti et al. 2022) runs each attention function - the family's ``eager_attention_forward``
or transformers' sdpa function - under non-reentrant ``torch.utils.checkpoint``.

Measured: the bytes autograd holds for backward at the end of the forward pass. Every tensor
passed to ``torch.autograd.graph.saved_tensors_hooks``' pack hook is recorded; those whose graph
node is still alive after the forward are counted, each storage once (by
``untyped_storage().data_ptr()``, its full ``nbytes``), leaving out the model's parameters and
buffers. With checkpointing (transformers' default, non-reentrant ``torch.utils.checkpoint``),
a checkpointed layer saves its positional inputs through the same hooks and holds its keyword
tensors (rotary cos/sin, the attention mask) in the recompute closure; those are counted too, as
are the keyword tensors a selectively recomputed attention call holds.

Predicted: ``dsgen.estimate.activations.estimate_activations(...).total`` for the
:class:`ModelShape` that ``dsgen.catalog.hf_config.shape_from_hf_config`` reads from the very
``config.json`` the model was built from (so the reader is exercised too). One point is also run
through ``dsgen solve --json`` with every dimension pinned, to check the CLI reports the same
figure (``memory.gpu.activations``).

Dropout: the main grid sets every dropout probability in the configs to 0 (``p = 0`` also keeps
sdpa on PyTorch's fused CPU kernel). A second grid (tiny models, eager attention) sets the
families' own dropout keys to 0.1, with ``F.dropout`` routed through ``native_dropout`` as on CUDA
(a bool mask saved; CPU's unfused dropout would save an input-dtype noise tensor and its input).
On CPU, ``sdpa`` runs PyTorch's fused flash-attention CPU kernel, which saves what the CUDA flash
kernel saves (q, k, v, output, fp32 log-sum-exp). Models run with their config's ``use_cache``
(the HF default), as a training script that does not change it would. bf16 matmuls are computed
in fp32 and rounded back (``Fp32Matmul``): same ops and saved tensors, far faster on CPUs without
bf16 units.

Alongside, the same points are estimated with ``llm-analysis`` (``pip install --no-deps
llm-analysis fire``: its pinned ``transformers<5`` would otherwise be downgraded), fed a
``ModelConfig`` built from the same numbers.

Targets: median absolute error <= 3 %, worst <= 8 %. Run: python bench/activation_accuracy.py
(``--quick`` for the tiny models only, ``--explain FAMILY`` for one model's saved-tensor inventory).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from dsgen.catalog.hf_config import shape_from_hf_config  # noqa: E402
from dsgen.catalog.model_shape import ModelShape  # noqa: E402
from dsgen.estimate.activations import estimate_activations  # noqa: E402

MEDIAN_TARGET = 3.0  # percent
WORST_TARGET = 8.0

# ---- the models --------------------------------------------------------------------------------
# model_type -> size -> config keys. Dropout is zero in this grid (see module docstring).
_NO_DROP = {"attention_dropout": 0.0}
FAMILIES: dict[str, dict[str, dict[str, Any]]] = {
    "llama": {
        "tiny": dict(
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=8000,
            **_NO_DROP,
        ),
    },
    "mistral": {
        "tiny": dict(
            hidden_size=128,
            intermediate_size=352,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            vocab_size=1000,
            sliding_window=4096,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=512,
            intermediate_size=1792,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=6000,
            sliding_window=4096,
            **_NO_DROP,
        ),
    },
    "qwen2": {
        "tiny": dict(
            hidden_size=128,
            intermediate_size=320,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1200,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=448,
            intermediate_size=1216,
            num_hidden_layers=4,
            num_attention_heads=7,
            num_key_value_heads=1,
            vocab_size=8000,
            **_NO_DROP,
        ),
    },
    "gemma2": {
        "tiny": dict(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=128,
            vocab_size=1000,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=384,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            query_pre_attn_scalar=128,
            sliding_window=256,
            vocab_size=6000,
            **_NO_DROP,
        ),
    },
    "phi3": {
        "tiny": dict(
            hidden_size=128,
            intermediate_size=352,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=1000,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=8,
            vocab_size=6000,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            **_NO_DROP,
        ),
    },
    "gpt2": {
        "tiny": dict(
            n_embd=128,
            n_layer=2,
            n_head=4,
            vocab_size=1000,
            n_positions=512,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        ),
        "mid": dict(
            n_embd=512,
            n_layer=3,
            n_head=8,
            vocab_size=6000,
            n_positions=1024,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        ),
    },
    "gpt_neox": {
        "tiny": dict(
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=1000,
            rotary_pct=0.25,
            hidden_dropout=0.0,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=512,
            intermediate_size=2048,
            num_hidden_layers=3,
            num_attention_heads=8,
            vocab_size=6000,
            rotary_pct=0.25,
            hidden_dropout=0.0,
            **_NO_DROP,
        ),
    },
    "bert": {
        "tiny": dict(
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=1000,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        ),
        "mid": dict(
            hidden_size=512,
            intermediate_size=2048,
            num_hidden_layers=3,
            num_attention_heads=8,
            vocab_size=6000,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        ),
    },
    "mixtral": {
        "tiny": dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
            num_local_experts=4,
            num_experts_per_tok=2,
            router_jitter_noise=0.0,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=384,
            intermediate_size=768,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            vocab_size=6000,
            num_local_experts=8,
            num_experts_per_tok=2,
            router_jitter_noise=0.0,
            **_NO_DROP,
        ),
    },
    # ---- today's decoders (issue 17): one tiny and one mid config per trait ----
    "qwen3": {  # q/k RMSNorm over head_dim
        "tiny": dict(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            vocab_size=1000,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=64,
            vocab_size=6000,
            **_NO_DROP,
        ),
    },
    "olmo2": {  # q/k RMSNorm over all heads, norms after attention and MLP
        "tiny": dict(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
            pad_token_id=0,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=8,
            vocab_size=6000,
            pad_token_id=0,
            **_NO_DROP,
        ),
    },
    "gemma3_text": {  # sandwich norms, q/k norms, sliding-window layer_types
        "tiny": dict(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=64,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            vocab_size=1000,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=384,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=128,
            query_pre_attn_scalar=128,
            sliding_window=128,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
            vocab_size=6000,
            **_NO_DROP,
        ),
    },
    "olmo3": {  # sliding-window layer_types on olmo2
        "tiny": dict(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
            sliding_window=64,
            pad_token_id=0,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=6000,
            sliding_window=128,
            pad_token_id=0,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
            **_NO_DROP,
        ),
    },
    "qwen3_moe": {  # top-k routed experts
        "tiny": dict(
            hidden_size=128,
            intermediate_size=384,
            moe_intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_experts=8,
            num_experts_per_tok=2,
            vocab_size=1000,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=384,
            intermediate_size=1024,
            moe_intermediate_size=192,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=64,
            num_experts=16,
            num_experts_per_tok=4,
            vocab_size=6000,
            **_NO_DROP,
        ),
    },
    "qwen2_moe": {  # top-k routed experts plus a gated shared expert
        "tiny": dict(
            hidden_size=128,
            intermediate_size=384,
            moe_intermediate_size=96,
            shared_expert_intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=8,
            num_experts_per_tok=2,
            vocab_size=1000,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=384,
            intermediate_size=1024,
            moe_intermediate_size=192,
            shared_expert_intermediate_size=768,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            num_experts=16,
            num_experts_per_tok=4,
            vocab_size=6000,
            **_NO_DROP,
        ),
    },
    "deepseek_v3": {  # MLA (q LoRA), MoE with a shared expert, a dense first layer
        "tiny": dict(
            hidden_size=128,
            intermediate_size=384,
            moe_intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            q_lora_rank=64,
            num_key_value_heads=4,
            kv_lora_rank=32,
            qk_nope_head_dim=32,
            qk_rope_head_dim=16,
            v_head_dim=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            vocab_size=1000,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=384,
            intermediate_size=1024,
            moe_intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=6,
            q_lora_rank=192,
            num_key_value_heads=6,
            kv_lora_rank=128,
            qk_nope_head_dim=64,
            qk_rope_head_dim=32,
            v_head_dim=64,
            n_routed_experts=16,
            num_experts_per_tok=4,
            n_shared_experts=2,
            n_group=4,
            topk_group=2,
            first_k_dense_replace=1,
            vocab_size=6000,
            **_NO_DROP,
        ),
    },
    "gpt_oss": {  # attention sinks, alternating sliding windows, biased experts
        "tiny": dict(
            hidden_size=128,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=64,
            layer_types=["sliding_attention", "full_attention"],
            vocab_size=1000,
            **_NO_DROP,
        ),
        "mid": dict(
            hidden_size=384,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=64,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=128,
            layer_types=["sliding_attention", "full_attention"],
            vocab_size=6000,
            **_NO_DROP,
        ),
    },
}
# The dropout grid: the tiny configs with the families' own dropout keys at 0.1, eager attention only
# (sdpa with dropout > 0 leaves PyTorch's fused CPU kernel for the math path; the CUDA flash and
# memory-efficient kernels drop in-kernel and keep only an RNG state).
DROPOUT = 0.1
DROPOUT_KEYS: dict[str, tuple[str, ...]] = {
    "gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
    "bert": ("hidden_dropout_prob", "attention_probs_dropout_prob"),
    "llama": ("attention_dropout",),
    "gpt_neox": ("attention_dropout", "hidden_dropout"),
    "phi3": ("attention_dropout", "resid_pdrop"),
}
# (micro-batch, sequence) points per size
POINTS = {"tiny": [(1, 128), (2, 256), (1, 512)], "mid": [(1, 256), (2, 512)]}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ATTENTIONS = ("eager", "sdpa")


def hf_config(family: str, size: str, dropout: float = 0.0) -> transformers.PretrainedConfig:
    keys = dict(FAMILIES[family][size])
    if dropout:
        keys.update({key: dropout for key in DROPOUT_KEYS[family]})
    return transformers.AutoConfig.for_model(family, **keys)


def build_model(config: transformers.PretrainedConfig, dtype: torch.dtype, attention: str) -> torch.nn.Module:
    cls = transformers.AutoModelForMaskedLM if config.model_type == "bert" else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls.from_config(config, attn_implementation=attention, dtype=dtype)
    return model


def checkpointed(model: torch.nn.Module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


CKPT_MODES = ("none", "full", "selective")


def set_checkpointing(model: torch.nn.Module, mode: str) -> None:
    """``full``: transformers' layer checkpointing; ``none`` and ``selective`` turn it off (selective
    recomputation is applied around the forward pass by :func:`selective_recompute`)."""
    enabled = mode == "full"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gradient_checkpointing_enable is a deprecated alias in transformers 5
        if enabled:
            model.gradient_checkpointing_enable()
        else:
            model.gradient_checkpointing_disable()
    model.train()


# ---- measurement --------------------------------------------------------------------------------
_MATMULS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
}


class Fp32Matmul(TorchDispatchMode):
    """Computes bf16 matmuls in fp32 and rounds the result back to bf16.

    CPUs without bf16 units run bf16 ``addmm`` tens of times slower than fp32. A dispatch mode
    sits below autograd: the op autograd records, the tensors it saves and the output's dtype,
    shape and (contiguous) layout are exactly those of the bf16 op; only the arithmetic differs.
    ``--native-bf16-matmul`` turns it off (the byte counts are the same, only slower).
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _MATMULS and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args):
            upcast = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
            return func(*upcast, **kwargs).to(torch.bfloat16)
        return func(*args, **kwargs)


FAST_BF16_MATMUL = True


def _fused_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """``F.dropout`` as it runs on CUDA: ``native_dropout``, which saves only a bool mask. On CPU,
    ``F.dropout`` multiplies by a noise tensor of the input's dtype and saves it and the input."""
    if not training or p == 0:
        return input
    return torch.native_dropout(input, p, True)[0]


@contextlib.contextmanager
def cuda_like_dropout() -> Iterator[None]:
    original = torch.nn.functional.dropout
    torch.nn.functional.dropout = _fused_dropout  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.nn.functional.dropout = original


class _Saved:
    """What the pack hook returns: autograd keeps it exactly as long as it keeps the saved tensor."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _storage(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


@contextlib.contextmanager
def selective_recompute(model: torch.nn.Module, held: list[torch.Tensor]) -> Iterator[None]:
    """Run every attention function of ``model`` under non-reentrant ``torch.utils.checkpoint``.

    The modeling module's ``eager_attention_forward`` (looked up at call time) and the global sdpa
    entry of ``ALL_ATTENTION_FUNCTIONS`` are replaced for the duration. Positional tensors (q, k,
    v, mask) are saved by the checkpoint through the saved-tensor hooks; keyword tensors live in
    its recompute closure and are appended to ``held``.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    modeling = sys.modules[type(model).__module__]
    eager = modeling.eager_attention_forward
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    had_local_sdpa = "sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping

    def checkpointed_call(function: Any) -> Any:
        def call(module: Any, *args: Any, **kwargs: Any) -> Any:
            held.extend(_tensors(list(kwargs.values())))
            return torch.utils.checkpoint.checkpoint(function, module, *args, use_reentrant=False, **kwargs)

        return call

    modeling.eager_attention_forward = checkpointed_call(eager)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = checkpointed_call(sdpa)
    try:
        yield
    finally:
        modeling.eager_attention_forward = eager
        if had_local_sdpa:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa
        else:
            del ALL_ATTENTION_FUNCTIONS["sdpa"]


def measure_saved_bytes(
    model: torch.nn.Module, batch: int, seq: int, explain: bool = False, selective: bool = False
) -> int:
    """Bytes of the distinct storages autograd holds for backward after one forward through the loss."""
    excluded = {_storage(t)[0] for t in (*model.parameters(), *model.buffers())}
    saved: list[weakref.ref[_Saved]] = []
    held_by_checkpoint: list[torch.Tensor] = []
    labels: dict[int, str] = {}

    def pack(t: torch.Tensor) -> _Saved:
        holder = _Saved(t.detach())  # detached: no reference cycle through the output's grad_fn
        saved.append(weakref.ref(holder))
        return holder

    def unpack(holder: _Saved) -> torch.Tensor:
        return holder.tensor

    wrapped = []
    for module in model.modules():
        func = module.__dict__.get("_gradient_checkpointing_func")
        if func is None or not getattr(module, "gradient_checkpointing", False):
            continue

        def recording(function: Any, *args: Any, _inner: Any = func, **kwargs: Any) -> Any:
            # transformers passes partial(forward, self, **layer_kwargs); the partial lives in the
            # checkpoint's recompute closure until backward, and with it every tensor it binds.
            bound = getattr(function, "keywords", {}) or {}
            held_by_checkpoint.extend(_tensors(list(bound.values())))
            return _inner(function, *args, **kwargs)

        module._gradient_checkpointing_func = recording
        wrapped.append((module, func))

    generator = torch.Generator().manual_seed(1234)
    vocab = model.config.vocab_size
    input_ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    try:
        fast = FAST_BF16_MATMUL and next(model.parameters()).dtype == torch.bfloat16
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, unpack),
            cuda_like_dropout(),
            Fp32Matmul() if fast else _nothing(),
            selective_recompute(model, held_by_checkpoint) if selective else _nothing(),
        ):
            output = model(input_ids=input_ids, labels=input_ids)
        gc.collect()
        storages: dict[int, int] = {}
        shapes: dict[int, str] = {}
        live = [holder.tensor for ref in saved if (holder := ref()) is not None]
        for t in [*live, *held_by_checkpoint]:
            ptr, nbytes = _storage(t)
            if ptr in excluded or nbytes == 0:
                continue
            storages[ptr] = nbytes
            shapes.setdefault(ptr, f"{tuple(t.shape)} {str(t.dtype)[6:]}")
        if explain:
            recomputes = checkpointed(model) or selective
            labels = {} if recomputes else _graph_labels(output.loss)  # unpacking would recompute
            for ptr, nbytes in sorted(storages.items(), key=lambda kv: labels.get(kv[0], shapes[kv[0]])):
                print(f"  {nbytes:>10} B  {nbytes / (batch * seq):>9.1f} B/token  {labels.get(ptr, shapes[ptr])}")
        total = sum(storages.values())
        del output
        return total
    finally:
        for module, func in wrapped:
            module._gradient_checkpointing_func = func


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a value, looking into tuples, lists and dicts (e.g. position_embeddings=(cos, sin))."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return _tensors(list(value.values()))
    return []


def _graph_labels(loss: torch.Tensor) -> dict[int, str]:
    """Storage -> the first autograd node (and attribute) found saving it; for --explain only."""
    labels: dict[int, str] = {}
    stack, seen = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except RuntimeError:
                continue
            for t in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(t, torch.Tensor):
                    desc = f"{node.name()}.{attr[7:]} {tuple(t.shape)} {str(t.dtype)[6:]}"
                    labels.setdefault(_storage(t)[0], desc)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return labels


# ---- predictions ---------------------------------------------------------------------------------
def dsgen_prediction(shape: ModelShape, batch: int, seq: int, dtype: str, attention: str, ckpt: str) -> int:
    return estimate_activations(
        shape,
        micro_batch_size=batch,
        sequence_length=seq,
        dtype_bytes=2 if dtype == "bf16" else 4,
        attention=attention,
        checkpointing=ckpt == "full",
        selective=ckpt == "selective",
    ).total


def dsgen_cli_prediction(config_dir: Path, batch: int, seq: int, dtype: str, attention: str, ckpt: str) -> int:
    """``memory.gpu.activations`` from ``dsgen solve --json`` with every dimension pinned."""
    spec = (
        f"model: {{hf_config: {json.dumps(str(config_dir / 'config.json'))}}}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 1, nodes: 1}\n"
        f"training: {{sequence_length: {seq}, global_batch_size: {batch}, precision: {dtype}, "
        f"attention: {attention}}}\n"
        "constraints: {zero_stage: 0, offload_optimizer: none, offload_param: none, "
        f"activation_checkpointing: {SPEC_CHECKPOINTING[ckpt]}, micro_batch_size: {batch}, "
        "gradient_accumulation_steps: 1}\n"
    )
    spec_path = config_dir / "spec.yaml"
    spec_path.write_text(spec)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-m", "dsgen", "solve", str(spec_path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    if done.returncode != 0:
        raise SystemExit(f"dsgen solve failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return int(json.loads(done.stdout)["memory"]["gpu"]["activations"])


SPEC_CHECKPOINTING = {"none": "false", "full": "true", "selective": "selective"}


class LlmAnalysis:
    """llm-analysis's training activation memory for the same points, or why it cannot run."""

    def __init__(self) -> None:
        self.error: str | None = None
        try:
            import logging

            from llm_analysis import analysis, config

            logging.getLogger("llm_analysis").setLevel(logging.ERROR)
            analysis.logger.setLevel(logging.ERROR)
            self.analysis, self.config = analysis, config
        except Exception as exc:  # any import failure is reported, not raised
            self.error = (
                f"llm-analysis cannot be imported ({type(exc).__name__}: {exc}); "
                "install it with: pip install --no-deps llm-analysis fire"
            )

    def predict(self, shape: ModelShape, batch: int, seq: int, dtype: str, attention: str, ckpt: str) -> int | None:
        if self.error:
            return None
        a, c = self.analysis, self.config
        bits = 16 if dtype == "bf16" else 32
        model = c.ModelConfig(
            name=shape.name,
            num_layers=shape.num_layers,
            n_head=shape.num_attention_heads,
            hidden_dim=shape.hidden_size,
            vocab_size=shape.vocab_size,
            max_seq_len=max(seq, 1),
            num_key_value_heads=shape.num_key_value_heads,
            ffn_embed_dim=shape.intermediate_size,
            expansion_ratio=shape.intermediate_size / shape.hidden_size,
            model_type=shape.family,
            moe_num_experts=max(shape.num_experts, 1),
            moe_top_k=max(shape.experts_per_token, 1),
        )
        gpu = c.GPUConfig(
            name="h100",
            mem_per_GPU_in_GB=80,
            hbm_bandwidth_in_GB_per_sec=3350,
            intra_node_bandwidth_in_GB_per_sec=450,
            intra_node_min_message_latency=8e-6,
            peak_fp16_TFLOPS=989,
        )
        dtypes = c.DtypeConfig(
            name=f"w{bits}a{bits}e{bits}", weight_bits=bits, activation_bits=bits, embedding_bits=bits
        )
        llm = a.LLMAnalysis(model, gpu, dtypes)
        recompute = {
            "none": a.ActivationRecomputation.NONE,
            "full": a.ActivationRecomputation.FULL,
            "selective": a.ActivationRecomputation.SELECTIVE,
        }[ckpt]
        # the sum LLMAnalysis.training() reports as activation_memory_per_gpu, without its batch search
        per_layer = llm.get_activation_memory_per_layer(
            batch,
            seq,
            is_inference=False,
            activation_recomputation=recompute,
            flash_attn=attention != "eager",
            mlp_gated_linear_units=shape.gated_mlp,
        )
        total = shape.num_layers * per_layer
        total += llm.get_activation_memory_output_embedding(batch, seq)
        total += llm.get_activation_memory_per_layernorm(batch, seq, recompute)
        return int(total)


# ---- the bench -------------------------------------------------------------------------------------
@dataclass
class Row:
    family: str
    size: str
    dropout: float
    dtype: str
    attention: str
    ckpt: str  # none | full | selective
    batch: int
    seq: int
    measured: int
    predicted: int
    llm_analysis: int | None

    @staticmethod
    def error(predicted: int | None, measured: int) -> float | None:
        return None if predicted is None else 100.0 * (predicted - measured) / measured


def supports(config: transformers.PretrainedConfig, attention: str) -> bool:
    cls = transformers.AutoModelForMaskedLM if config.model_type == "bert" else transformers.AutoModelForCausalLM
    model_cls = cls._model_mapping[type(config)]
    return attention == "eager" or bool(getattr(model_cls, "_supports_sdpa", False))


def run(
    families: list[str], sizes: list[str], llm: LlmAnalysis, tmp: Path, with_dropout: bool = True
) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = []
    grids = [(family, size, 0.0, ATTENTIONS) for family in families for size in sizes]
    if with_dropout:
        grids += [(family, "tiny", DROPOUT, ("eager",)) for family in families if family in DROPOUT_KEYS]
    for family, size, dropout, attentions in grids:
        config = hf_config(family, size, dropout)
        config_dir = tmp / f"{family}-{size}-p{dropout:g}"
        config.save_pretrained(config_dir)
        shape = shape_from_hf_config(config_dir)  # the lead's reader, on the file the model was built from
        for attention in attentions:
            if attention == "sdpa" and getattr(config, "kv_lora_rank", None):
                note = (
                    f"{family}: MLA (qk head dim != v head dim) under sdpa runs PyTorch's math fallback on CPU, "
                    "which upcasts to fp32 (GPU kernels do not); measured with eager only"
                )
                if note not in notes:
                    notes.append(note)
                continue
            if not supports(config, attention):
                note = f"{family}: transformers {transformers.__version__} has no {attention} attention"
                if note not in notes:
                    notes.append(note)
                continue
            for dtype in DTYPES:
                model = build_model(config, DTYPES[dtype], attention)
                for ckpt in CKPT_MODES:
                    set_checkpointing(model, ckpt)
                    for batch, seq in POINTS[size]:
                        measured = measure_saved_bytes(model, batch, seq, selective=ckpt == "selective")
                        predicted = dsgen_prediction(shape, batch, seq, dtype, attention, ckpt)
                        other = llm.predict(shape, batch, seq, dtype, attention, ckpt)
                        rows.append(
                            Row(family, size, dropout, dtype, attention, ckpt, batch, seq, measured, predicted, other)
                        )
                del model
                gc.collect()
    return rows, notes


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}"


def report(rows: list[Row]) -> tuple[float, float]:
    header = (
        f"{'family':<9} {'size':<4} {'drop':<4} {'dtype':<5} {'attn':<5} {'ckpt':<9} {'b':>2} {'s':>4} "
        f"{'measured':>11} {'dsgen':>11} {'err %':>6} {'llm-an.':>11} {'err %':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        other = "n/a" if r.llm_analysis is None else f"{r.llm_analysis:>11}"
        print(
            f"{r.family:<9} {r.size:<4} {r.dropout:<4g} {r.dtype:<5} {r.attention:<5} {r.ckpt:<9} "
            f"{r.batch:>2} {r.seq:>4} {r.measured:>11} {r.predicted:>11} "
            f"{_pct(Row.error(r.predicted, r.measured)):>6} {other:>11} "
            f"{_pct(Row.error(r.llm_analysis, r.measured)):>7}"
        )
    errors = [abs(Row.error(r.predicted, r.measured) or 0.0) for r in rows]
    return statistics.median(errors), max(errors)


def summary(rows: list[Row], label: str, pick: Any) -> str:
    errors = [abs(e) for r in rows if (e := Row.error(pick(r), r.measured)) is not None]
    if not errors:
        return f"{label:<13} no figures"
    worst = max(rows, key=lambda r: abs(Row.error(pick(r), r.measured) or 0.0))
    where = f"{worst.family}/{worst.size} p={worst.dropout:g} {worst.dtype} {worst.attention} ckpt={worst.ckpt} b={worst.batch} s={worst.seq}"
    return (
        f"{label:<13} median |error| {statistics.median(errors):5.2f} %   worst {max(errors):6.2f} % ({where})"
        f"   over {len(errors)} points"
    )


def cli_consistency(tmp: Path) -> str:
    family, size, batch, seq, dtype, attention, ckpt = "llama", "tiny", 2, 256, "bf16", "eager", "selective"
    config_dir = tmp / f"{family}-{size}-p0"
    if not (config_dir / "config.json").exists():
        hf_config(family, size).save_pretrained(config_dir)
    cli = dsgen_cli_prediction(config_dir, batch, seq, dtype, attention, ckpt)
    direct = dsgen_prediction(shape_from_hf_config(config_dir), batch, seq, dtype, attention, ckpt)
    status = "ok" if cli == direct else "MISMATCH"
    return (
        f"dsgen solve --json consistency ({family}/{size} {dtype} {attention} b={batch} s={seq}): "
        f"CLI memory.gpu.activations {cli} vs in-process {direct}: {status}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models only")
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES), help="only these families")
    parser.add_argument(
        "--explain",
        metavar="FAMILY",
        choices=sorted(FAMILIES),
        help="print the saved-tensor inventory of one FAMILY model (see --size, --point, --dtype, --attention)",
    )
    parser.add_argument("--attention", default="sdpa", help="attention for --explain")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="dtype for --explain")
    parser.add_argument("--ckpt", default="none", choices=CKPT_MODES, help="checkpointing for --explain")
    parser.add_argument("--point", default="2x64", help="micro-batch x sequence for --explain (default 2x64)")
    parser.add_argument("--size", default="tiny", choices=("tiny", "mid"), help="model size for --explain")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: these small ops only lose from threading, "
        "badly so on a shared machine)",
    )
    parser.add_argument(
        "--native-bf16-matmul",
        action="store_true",
        help="run bf16 matmuls in bf16 (same bytes; slow on CPUs without bf16 units)",
    )
    args = parser.parse_args(argv)
    global FAST_BF16_MATMUL
    FAST_BF16_MATMUL = not args.native_bf16_matmul
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # "use_cache=True is incompatible with gradient checkpointing"
    gc.freeze()  # the imported modules' objects: keeps the per-point gc.collect() cheap

    if args.explain:
        batch, seq = (int(n) for n in args.point.split("x"))
        config = hf_config(args.explain, args.size)
        model = build_model(config, DTYPES[args.dtype], args.attention)
        set_checkpointing(model, args.ckpt)
        total = measure_saved_bytes(model, batch, seq, explain=True, selective=args.ckpt == "selective")
        with tempfile.TemporaryDirectory() as tmp:
            config.save_pretrained(tmp)
            shape = shape_from_hf_config(Path(tmp))
            predicted = dsgen_prediction(shape, batch, seq, args.dtype, args.attention, args.ckpt)
        print(f"measured {total} B, dsgen {predicted} B ({100 * (predicted - total) / total:+.2f} %)")
        return 0

    start = time.perf_counter()
    llm = LlmAnalysis()
    families = args.family or list(FAMILIES)
    sizes = ["tiny"] if args.quick else ["tiny", "mid"]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rows, notes = run(families, sizes, llm, tmp)
        median, worst = report(rows)
        print()
        print(cli_consistency(tmp))
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, CPU; "
        f"{len(rows)} points in {time.perf_counter() - start:.0f} s"
    )
    for note in notes:
        print(f"note: {note}")
    print("per family (median / worst |error| %):")
    for family in dict.fromkeys(r.family for r in rows):
        mine = [abs(Row.error(r.predicted, r.measured) or 0.0) for r in rows if r.family == family]
        theirs = [
            abs(e) for r in rows if r.family == family and (e := Row.error(r.llm_analysis, r.measured)) is not None
        ]
        other = f"{statistics.median(theirs):6.2f} / {max(theirs):6.2f}" if theirs else "n/a"
        print(f"  {family:<9} dsgen {statistics.median(mine):5.2f} / {max(mine):5.2f}   llm-analysis {other}")
    print(summary(rows, "dsgen", lambda r: r.predicted))
    if llm.error:
        print(f"{'llm-analysis':<13} {llm.error}")
    else:
        print(summary(rows, "llm-analysis", lambda r: r.llm_analysis))
        print(
            "  (llm-analysis: Korthikanti et al.'s per-layer formula with fp32 layernorm inputs, the 16/32-bit "
            "logits, no loss internals; fed a ModelConfig built from the same numbers)"
        )
    ok = median <= MEDIAN_TARGET and worst <= WORST_TARGET
    print(f"targets: median <= {MEDIAN_TARGET:g} %, worst <= {WORST_TARGET:g} %: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
