"""One rank of bench/long_context_accuracy.py: a real 2-rank DeepSpeed run with Ulysses SP = 2 (gloo, CPU).

Per case (model, sequence, ALST pieces) the rank builds the tiny model from its config, registers
``UlyssesSPAttentionHF`` (sdpa core), shards the batch with ``UlyssesSPDataLoaderAdapter``, wraps
the model with ``deepspeed.initialize(..., mpu=mpu)`` (ZeRO-2, fp32) and runs one forward through
the SP loss with every saved tensor recorded (``saved_tensors_hooks``), then backward and an
optimizer step. It prints one ``DSGEN_LC`` JSON line per case with the bytes autograd holds at
the end of forward on this rank (each storage once, parameters excluded) and, for checkpoint
offload, the bytes the offload moves to the host.

The pieces are applied as a user would (see the notes dsgen prints):
- TiledMLP: the MLP class's forward patched to ``TiledMLP.apply`` with ``ceil(seqlen / hidden)`` shards;
- tiled loss: ``TiledFusedLogitsLoss`` on the final hidden states with ~1 GiB fp32 logit tiles;
- checkpoint offload: reentrant gradient checkpointing whose ``CheckpointFunction`` moves its first
  tensor to the host (ArcticTraining's ``CheckpointFunctionWithCPUOffload``: ``arg.detach().cpu()``).
  On a CPU machine ``.cpu()`` is the same tensor, so the bytes it would move are counted as host
  bytes instead of device bytes: the mechanism is measured, not the copy.
"""

from __future__ import annotations

import json
import math
import os
import sys
import weakref
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
import transformers
from deepspeed.runtime.sequence_parallel.ulysses_sp import (
    TiledFusedLogitsLoss,
    TiledMLP,
    UlyssesSPAttentionHF,
    UlyssesSPDataLoaderAdapter,
)
from live_bytes import LiveBytes  # bench/live_bytes.py (the script's own directory is on sys.path)

SP = 2


class _Saved:
    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _ptr(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return _tensors(list(value.values()))
    return []


def patch_tiled_mlp(model: torch.nn.Module) -> Any:
    """Patch the model's MLP class; returns the original forward (restored after the case)."""
    mlp_class = type(model.model.layers[0].mlp)
    original = mlp_class.forward

    def mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    def tiled_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        shards = math.ceil(x.shape[1] / x.shape[2])
        return TiledMLP.apply(mlp_forward, self, x, shards, list(self.parameters()))

    mlp_class.forward = tiled_forward
    return original


def run_case(case: dict[str, Any], mpu: Any, rank: int) -> dict[str, Any]:
    config = transformers.AutoConfig.for_model(case["family"], **case["config"])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    mlp_forward = patch_tiled_mlp(model) if case["tiled_mlp"] else None
    offloaded: list[torch.Tensor] = []
    held: list[torch.Tensor] = []
    layer_forward: list[int] = []  # each checkpointed layer's input plus its forward working set
    if case["checkpoint_offload"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        original = torch.utils.checkpoint.CheckpointFunction.forward

        def offloading_forward(ctx: Any, run_function: Any, preserve: bool, *args: Any) -> Any:
            first = next(a for a in args if torch.is_tensor(a))
            offloaded.append(first)  # ArcticTraining saves first.detach().cpu(): host bytes
            bound = _tensors(list((getattr(run_function, "keywords", {}) or {}).values()))
            held.extend(bound)  # the layer's keyword tensors live in the closure
            # the layer's forward working set: the most bytes its operators hold at once beyond what
            # was live when it started (parameters, buffers and the layer's arguments excluded)
            tracker = LiveBytes()
            tracker.exclude([*model.parameters(), *model.buffers(), *_tensors(list(args)), *bound])
            with tracker:
                out = original(ctx, run_function, preserve, *args)
            layer_forward.append(first.numel() * first.element_size() + tracker.peak)
            return out

        torch.utils.checkpoint.CheckpointFunction.forward = staticmethod(offloading_forward)  # type: ignore[method-assign]
    model.train()
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "sequence_parallel_size": SP,
        "steps_per_print": 1000,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config, mpu=mpu)
    seq = case["sequence_length"]
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, config.vocab_size, (1, seq), generator=gen)
    batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(seq).unsqueeze(0)}
    loader = UlyssesSPDataLoaderAdapter(
        [batch],
        sp_rank=mpu.get_sequence_parallel_rank(),
        sp_group=mpu.get_sequence_parallel_group(),
        sp_world_size=mpu.get_sequence_parallel_world_size(),
        device=torch.device("cpu"),
    )
    micro = next(iter(loader))
    shift_labels = micro.pop("shift_labels")
    excluded = {_ptr(p)[0] for p in model.parameters()} | {_ptr(b)[0] for b in model.buffers()}
    excluded |= {_ptr(t)[0] for t in micro.values() if torch.is_tensor(t)} - {_ptr(micro["input_ids"])[0]}
    saved: list[weakref.ref[_Saved]] = []

    def pack(t: torch.Tensor) -> _Saved:
        holder = _Saved(t.detach())
        saved.append(weakref.ref(holder))
        return holder

    def unpack(holder: _Saved) -> torch.Tensor:
        return holder.tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        if case["tiled_loss"]:
            hidden = engine.module.model(**micro, use_cache=False).last_hidden_state
            vocab = config.vocab_size
            shards = max(1, math.ceil(shift_labels.numel() * vocab * 4 / 2**30))

            def loss_fn(self: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                logits = self.lm_head(x).float()
                return torch.nn.functional.cross_entropy(
                    logits.view(-1, vocab), y.view(-1), ignore_index=-100, reduction="sum"
                )

            loss = TiledFusedLogitsLoss.apply(
                loss_fn, engine.module, hidden, shift_labels, None, shards, [engine.module.lm_head.weight], "sum"
            )
            loss = loss / max((shift_labels != -100).sum(), 1)
        else:
            out = engine(**micro, use_cache=False)
            loss = engine.module.loss_function(
                logits=out.logits, labels=None, shift_labels=shift_labels, vocab_size=config.vocab_size
            )
    import gc

    gc.collect()
    storages: dict[int, int] = {}
    host: dict[int, int] = {}
    offloaded_ptrs = {_ptr(t)[0] for t in offloaded}
    live = [h.tensor for ref in saved if (h := ref()) is not None]
    for t in [*live, *held]:
        ptr, nbytes = _ptr(t)
        if ptr in excluded or nbytes == 0:
            continue
        (host if ptr in offloaded_ptrs else storages)[ptr] = nbytes
    # SP-aware loss reduction (the tutorial's weighted all-gather), then a real backward and step
    group = mpu.get_sequence_parallel_group()
    tokens = (shift_labels != -100).sum()
    losses = torch.distributed.nn.functional.all_gather(loss, group=group)
    counts = torch.distributed.nn.functional.all_gather(tokens, group=group)
    total = sum(part * count for part, count in zip(losses, counts, strict=True)) / max(sum(counts), 1)
    engine.backward(total)
    engine.step()
    if case["checkpoint_offload"]:
        torch.utils.checkpoint.CheckpointFunction.forward = staticmethod(original)  # type: ignore[method-assign]
    if mlp_forward is not None:
        type(model.model.layers[0].mlp).forward = mlp_forward
    return {
        "name": case["name"],
        "rank": rank,
        "device_bytes": sum(storages.values()),
        "host_bytes": sum(host.values()),
        "loss": float(total.detach()),
        # the layers are identical; the lowest is what their operators need. Gloo's worker thread
        # holds a collective's input and output until it drops its Work, which races the caller:
        # in 1 of ~6 layers at s=512 the attention's all-to-all result and its contiguous copy were
        # still alive in the MLP (+2 x 131,072 B on the tiny Llama), never the same layer twice
        "layer_forward_bytes": min(layer_forward, default=0),
    }


def main() -> int:
    cases = json.loads(sys.argv[1])  # one model family per process: one Ulysses registration
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    rank = torch.distributed.get_rank()
    config = transformers.AutoConfig.for_model(cases[0]["family"], **cases[0]["config"])
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=_Loaded(config),
        core_attn_implementation="sdpa",
        sequence_parallel_size=SP,
        micro_batch_size=1,
        seq_length_is_variable=True,
    )
    for case in cases:
        print("DSGEN_LC " + json.dumps(run_case(case, mpu, rank)), flush=True)
    # an alive process group can abort the rank in interpreter shutdown (docs/targets.md, "How your script ends")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


class _Loaded:
    """What register_with_transformers reads from a loaded model: its config."""

    def __init__(self, config: Any) -> None:
        self.config = config


if __name__ == "__main__":
    raise SystemExit(main())
