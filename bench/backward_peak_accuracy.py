"""Accuracy of the rebuilt layer's backward working set against the bytes a real backward holds (CPU).

``bench/activation_accuracy.py`` and ``bench/long_context_accuracy.py`` measure what autograd holds
at the end of forward. The GPU's peak comes later, in backward: with activation checkpointing each
layer is rebuilt from its saved input and runs backward at once, and the rebuilt tensors plus the
gradients that backward forms are the step's largest short-lived allocation at long sequences
(``transient`` in docs/memory-model.md). This bench measures that working set.

For a tiny Llama (8 query heads, 2 key/value heads) and a tiny Qwen3 (8 query heads, 1 key/value
head, its own head_dim) at two sequence lengths, one process builds the model from its config
(fp32, sdpa, random weights), turns on transformers' gradient checkpointing (reentrant, its
default), and applies, as a user would:

- TiledMLP: the MLP class's forward patched to DeepSpeed's ``TiledMLP.apply`` with
  ``ceil(seqlen / hidden)`` shards (``bench/long_context_worker.py``'s ``patch_tiled_mlp``);
- checkpoint offload: each checkpoint's saved input packed to host memory outside torch's allocator
  and brought back (a new allocation) when its layer is rebuilt, as ArcticTraining's
  ``CheckpointFunctionWithCPUOffload`` does with ``.cpu()`` and ``.to(device)``.

Every tensor storage an operator creates, in forward and in backward, is counted while it lives
(a ``TorchDispatchMode`` with a weak reference per storage). Gradients of parameters are dropped
as soon as they are accumulated (``register_post_accumulate_grad_hook``): DeepSpeed moves them into
its own buffers, which dsgen prices with the model states, not here. Measured: the highest live
bytes from the moment the first checkpointed layer starts its backward, less the bytes live at
that moment other than the gradient it receives (what forward left and the loss backward did
not free).

Predicted: ``transient`` of :func:`dsgen.estimate.memory.estimate_memory` for the same plan (the
model's config read with :func:`dsgen.catalog.hf_config.shape_from_hf_config`); the vocabulary is
kept small so that the rebuilt layer, not the loss, is that term (checked per case).

What cannot run on CPU: FlashAttention-2 (its fp32 ``dq_accum`` and ``softmax_d`` are priced from
its source; sdpa's CPU kernel forms the same dq, dk, dv), Liger-Kernel (Triton), and the device
copy of checkpoint offload (emulated as above). Target: median absolute error <= 3 %, worst <= 8 %,
as the other memory benches. Run: .venv/bin/python bench/backward_peak_accuracy.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from live_bytes import LiveBytes  # noqa: E402  (bench/live_bytes.py)
from long_context_worker import patch_tiled_mlp  # noqa: E402  (bench/long_context_worker.py)

from dsgen.catalog.hf_config import shape_from_hf_config  # noqa: E402
from dsgen.catalog.model_shape import ModelShape  # noqa: E402
from dsgen.catalog.presets import get_gpu  # noqa: E402
from dsgen.estimate.layer_backward import loss_backward_bytes  # noqa: E402
from dsgen.estimate.memory import estimate_memory  # noqa: E402
from dsgen.estimate.sequence_parallel import long_context_memory  # noqa: E402
from dsgen.plan import LongContext, Plan  # noqa: E402
from dsgen.spec.types import Hardware, Training  # noqa: E402

MEDIAN_TARGET, WORST_TARGET = 3.0, 8.0
COMMON = dict(
    hidden_size=256, intermediate_size=688, num_hidden_layers=3, vocab_size=512, attention_dropout=0.0, use_cache=False
)
MODELS: dict[str, dict[str, Any]] = {
    "llama": dict(COMMON, num_attention_heads=8, num_key_value_heads=2),
    "qwen3": dict(COMMON, num_attention_heads=8, num_key_value_heads=1, head_dim=48),
}
VARIANTS = {
    "checkpointing": dict(tiled_mlp=False, checkpoint_offload=False),
    "+tiled-mlp": dict(tiled_mlp=True, checkpoint_offload=False),
    "+offload": dict(tiled_mlp=False, checkpoint_offload=True),
    "+tiled-mlp+offload": dict(tiled_mlp=True, checkpoint_offload=True),
}
SEQUENCES = (1024, 4096)
PRECISIONS = ("fp32", "bf16")  # bf16: transformers' RMSNorm upcasts to fp32, so the two differ
# the forward of a checkpointed layer: (family, sequence, TiledMLP, precision); checkpoint offload
# moves the saved input only, which the forward's working set does not include
FORWARD_CASES = [(f, s, t, p) for p in PRECISIONS for f in MODELS for s in SEQUENCES for t in (False, True)]


def _model(family: str, precision: str, tiled_mlp: bool) -> tuple[Any, Any, Any]:
    """The tiny model, checkpointed as transformers does it (reentrant), with TiledMLP patched in
    when asked; its config; and the MLP forward to put back (None when not patched)."""
    config = transformers.AutoConfig.for_model(family, **MODELS[family])
    torch.manual_seed(0)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    original_mlp = patch_tiled_mlp(model) if tiled_mlp else None
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    return model, config, original_mlp


def _ids(config: Any, sequence_length: int) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (1, sequence_length), generator=torch.Generator().manual_seed(1))


def measure(
    family: str, sequence_length: int, tiled_mlp: bool, checkpoint_offload: bool, precision: str = "fp32"
) -> int:
    """Peak bytes above what is live when the first rebuilt layer starts its backward."""
    model, config, original_mlp = _model(family, precision, tiled_mlp)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    checkpoint = torch.utils.checkpoint.CheckpointFunction
    original_apply, original_backward = checkpoint.apply, checkpoint.backward
    # the class's own attributes as they are (apply is inherited), to put back exactly
    descriptors = {name: checkpoint.__dict__.get(name) for name in ("apply", "backward")}
    tracker = LiveBytes()
    start: list[int] = []

    def backward(ctx: Any, *grads: Any) -> Any:
        if not start:  # the first rebuilt layer: the loss backward is over
            # its incoming gradient (from the final norm) is part of the layer's working set
            incoming = sum(g.untyped_storage().nbytes() for g in grads if isinstance(g, torch.Tensor))
            start.append(tracker.live - incoming)
            tracker.restart_peak()
        return original_backward(ctx, *grads)

    def to_host(t: torch.Tensor) -> np.ndarray:
        return t.detach().view(torch.int16).numpy().copy() if t.dtype == torch.bfloat16 else t.detach().numpy().copy()

    def to_device(a: np.ndarray) -> torch.Tensor:
        back = torch.from_numpy(a).clone()  # a new allocation: the copy back for its layer
        return back.view(torch.bfloat16) if back.dtype == torch.int16 else back

    def offloading_apply(*args: Any) -> Any:
        # the hooks pack what CheckpointFunction saves when apply() returns: its inputs
        with torch.autograd.graph.saved_tensors_hooks(to_host, to_device):
            return original_apply(*args)

    checkpoint.backward = staticmethod(backward)  # type: ignore[method-assign]
    if checkpoint_offload:
        checkpoint.apply = offloading_apply  # type: ignore[method-assign]
    try:
        ids = _ids(config, sequence_length)
        with tracker:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
    finally:
        for name, descriptor in descriptors.items():
            if descriptor is None:
                if name in checkpoint.__dict__:
                    delattr(checkpoint, name)
            else:
                setattr(checkpoint, name, descriptor)
        if original_mlp is not None:
            type(model.model.layers[0].mlp).forward = original_mlp
    return tracker.peak - start[0]


def measure_forward(family: str, sequence_length: int, tiled_mlp: bool, precision: str = "fp32") -> int:
    """The most bytes a checkpointed layer's forward holds at once: its input, and the peak of what
    its operators create beyond what was live when it started (parameters excluded: an operator
    returning a view of a weight would otherwise count it); the highest over the layers."""
    model, config, original_mlp = _model(family, precision, tiled_mlp)
    checkpoint = torch.utils.checkpoint.CheckpointFunction
    descriptor = checkpoint.__dict__["forward"]
    original_forward = checkpoint.forward
    tracker = LiveBytes()
    tracker.exclude(model.parameters())
    layers: list[int] = []

    def forward(ctx: Any, run_function: Any, preserve: bool, *args: Any) -> Any:
        entry = tracker.live
        tracker.restart_peak()
        out = original_forward(ctx, run_function, preserve, *args)
        layer_input = next(a for a in args if torch.is_tensor(a))
        layers.append(layer_input.untyped_storage().nbytes() + tracker.peak - entry)
        return out

    checkpoint.forward = staticmethod(forward)  # type: ignore[method-assign]
    try:
        with tracker:
            model(input_ids=_ids(config, sequence_length), labels=_ids(config, sequence_length), use_cache=False)
    finally:
        checkpoint.forward = descriptor  # type: ignore[method-assign]
        if original_mlp is not None:
            type(model.model.layers[0].mlp).forward = original_mlp
    return max(layers)


def _priced(
    family: str, sequence_length: int, tiled_mlp: bool, checkpoint_offload: bool, precision: str
) -> tuple[ModelShape, Plan, Training]:
    """The model's shape as dsgen reads its config.json, and the plan and training it prices."""
    with tempfile.TemporaryDirectory() as tmp:
        transformers.AutoConfig.for_model(family, **MODELS[family]).save_pretrained(tmp)
        shape = shape_from_hf_config(Path(tmp) / "config.json")
    plan = Plan(
        precision=precision,
        zero_stage=2,
        offload_optimizer="none",
        offload_param="none",
        checkpointing="full",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=1,
        long_context=LongContext(1, tiled_mlp, False, checkpoint_offload),
    )
    training = Training(sequence_length=sequence_length, global_batch_size=1, attention="sdpa", precision=precision)
    return shape, plan, training


def predict(
    family: str, sequence_length: int, tiled_mlp: bool, checkpoint_offload: bool, precision: str = "fp32"
) -> tuple[int, int]:
    """dsgen's transient for the plan, and its loss term (which must be the smaller)."""
    shape, plan, training = _priced(family, sequence_length, tiled_mlp, checkpoint_offload, precision)
    memory = estimate_memory(shape, plan, Hardware(gpu=get_gpu("h100-80gb")), training)
    return memory.gpu.transient, loss_backward_bytes(shape, plan.dtype_bytes, sequence_length, False)


def predict_forward(family: str, sequence_length: int, tiled_mlp: bool, precision: str = "fp32") -> int:
    """dsgen's checkpointed layer forward for the plan: its input and working set
    (``LongContextMemory.layer_forward``, which ``GpuMemory.first_layer_forward`` adds to the
    model states)."""
    shape, plan, training = _priced(family, sequence_length, tiled_mlp, False, precision)
    return long_context_memory(shape, plan, training).layer_forward


def main() -> int:
    torch.set_num_threads(1)
    errors: list[float] = []
    print(f"{'case':<44} {'measured':>12} {'predicted':>12} {'error':>8}")
    cases = [(f, s, v, p) for p in PRECISIONS for f in MODELS for s in SEQUENCES for v in VARIANTS]
    for family, sequence_length, variant, precision in cases:
        flags = VARIANTS[variant]
        measured = measure(family, sequence_length, **flags, precision=precision)
        predicted, loss_term = predict(family, sequence_length, **flags, precision=precision)
        name = f"{family} {precision} s={sequence_length} {variant}"
        if loss_term >= predicted:
            raise SystemExit(f"{name}: the loss, not the rebuilt layer, is the transient; shrink the vocabulary")
        error = 100 * (predicted - measured) / measured
        errors.append(abs(error))
        print(f"{name:<44} {measured:>12,} {predicted:>12,} {error:>+7.1f}%")
    met = _summary("rebuilt layer's backward working set", errors)
    print(f"\n{'case (forward of a checkpointed layer)':<44} {'measured':>12} {'predicted':>12} {'error':>8}")
    forward_errors: list[float] = []
    for family, sequence_length, tiled_mlp, precision in FORWARD_CASES:
        measured = measure_forward(family, sequence_length, tiled_mlp, precision)
        predicted = predict_forward(family, sequence_length, tiled_mlp, precision)
        error = 100 * (predicted - measured) / measured
        forward_errors.append(abs(error))
        name = f"{family} {precision} s={sequence_length}" + (" +tiled-mlp" if tiled_mlp else "")
        print(f"{name:<44} {measured:>12,} {predicted:>12,} {error:>+7.1f}%")
    met = _summary("checkpointed layer's forward (input and working set)", forward_errors) and met
    return 0 if met else 1


def _summary(what: str, errors: list[float]) -> bool:
    median, worst = statistics.median(errors), max(errors)
    met = median <= MEDIAN_TARGET and worst <= WORST_TARGET
    print(
        f"{what}, {len(errors)} cases: median |error| {median:.1f} % "
        f"(target <= {MEDIAN_TARGET:.0f} %), worst {worst:.1f} % (target <= {WORST_TARGET:.0f} %): "
        + ("met" if met else "NOT met")
    )
    return met


if __name__ == "__main__":
    raise SystemExit(main())
