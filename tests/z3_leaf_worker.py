"""torchrun worker: what ZeRO-3 holds around a MoE block's gather, with and without a ZeRO-3 leaf module.

Launched by ``tests/test_z3_leaf_measured.py`` (``tests.ds_oracle.run_torchrun``), one process per
rank, on DeepSpeed's CPU accelerator with gloo. It measures; it predicts nothing.

The model is a tiny Mixtral (transformers ``MixtralForCausalLM``, random weights, nothing downloaded)
whose proportions are the published run's (Mixtral-8x7B cut to 8 layers): the per-expert width is
3.5 x hidden, GQA with a quarter of the heads as KV heads, so one layer's attention is 2.98 % of its
MoE block and the vocabulary is chosen so ``lm_head`` is 9.3 % of a block, as in the real model.
The ZeRO-3 element thresholds (``stage3_max_live_parameters``, ``stage3_prefetch_bucket_size``,
``stage3_max_reuse_distance``, ``reduce_bucket_size``, ``sub_group_size``) are DeepSpeed's defaults
multiplied by ``tiny block / real block`` so they bite at the same fraction of a block; the
persistence threshold is chosen so the same parameters persist (norms and routers), see
:func:`scaled_zero_knobs`.

Instrumentation (monkeypatches installed in this process only):

* a ``TorchDispatchMode`` that samples after every aten op, plus samples at every ZeRO-3 hook
  (``PartitionedParameterCoordinator.fetch_sub_module`` after, ``release_sub_module`` before/after,
  ``DeepSpeedZeroOptimizer_Stage3.reduce_ready_partitions_and_remove_grads`` before, the IPG flush
  ``__reduce_and_partition_ipg_grads`` before) and every parameter's post-accumulate-grad hook;
* per sample: (a) elements of non-persistent ZeRO-3 parameters that are gathered (``ds_status``
  AVAILABLE, and INFLIGHT separately); (b) elements of full-size (unpartitioned) gradients attached
  to ZeRO-3 parameters (``param.grad``), split into those copied into the preallocated IPG bucket
  buffer and those outside it; (c) (a)+(b) at that instant; and "stale": storages that held a
  gathered parameter which ZeRO-3 has since released, still alive because something else references
  them (autograd's saved tensors), with (a)+stale+(b) at that instant (see :class:`Probe`);
* the live bytes of every storage an op allocated since the micro-step began (an allocator-level
  view: storages created by an op whose output does not alias an input, dropped when
  ``StorageWeakRef`` says they are freed), with what they are at its peak (gathered parameters,
  gradients, the IPG buffer, all else);
* the bytes autograd saves in the forward (:class:`SavedActivations`, which pins no parameter).

The peaks are kept per micro-step and per phase (fwd, bwd, step), each with its composition by owner
(``layers.N.mlp``, ``layers.N.self_attn``, ``lm_head``, ...) at the instant of the peak; micro-step 1
also keeps every hook event with the counts after it. Each micro-step is recorded separately: DeepSpeed records the module trace on the first forward
and backward, and prefetches (and applies the reuse distance) only from the second on.

Per rank one record, in the rank's own report file (:mod:`tests.rank_reports`, kind ``DSGEN_Z3LEAF``;
stdout lines from several ranks interleave)::

    {"rank": 0, ...}
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

try:
    from tests.tiny_models import parse_case_args
except ModuleNotFoundError:  # torchrun runs a worker as a script: tests/, not the checkout, is on sys.path
    from tiny_models import parse_case_args  # type: ignore[no-redef]

os.environ.setdefault("DS_ACCELERATOR", "cpu")

RECORD_KIND = "DSGEN_Z3LEAF"
WORKER = Path(__file__).resolve()

#: The published run: Mixtral-8x7B (transformers >= 5.6 layout: fused 3-D expert tensors) cut to 8 layers.
REAL_MIXTRAL: dict[str, int] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 8,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}

#: The tiny model: same ratios (intermediate/hidden 3.5, kv heads 1/4, lm_head/block 0.093).
TINY_MIXTRAL: dict[str, int] = {
    "vocab_size": 2000,
    "hidden_size": 256,
    "intermediate_size": 896,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}

#: DeepSpeed 0.19.8's ZeRO-3 defaults (elements), the published run's knobs.
REAL_KNOBS: dict[str, float] = {
    "stage3_max_live_parameters": 1e9,
    "stage3_prefetch_bucket_size": 5e7,
    "stage3_max_reuse_distance": 1e9,
    "reduce_bucket_size": 5e8,
    "sub_group_size": 1e9,
    "stage3_param_persistence_threshold": 1e5,
}


def shape_counts(cfg: dict[str, int]) -> dict[str, int]:
    """Elements of one MoE block (experts + router), one layer's attention, one layer, lm_head."""
    h, i, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    head_dim = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    gate_up = e * 2 * i * h
    down = e * h * i
    router = e * h
    attention = 2 * h * h + 2 * h * kv
    block = gate_up + down + router
    return {
        "gate_up_proj": gate_up,
        "down_proj": down,
        "router": router,
        "block": block,
        "attention": attention,
        "layer": block + attention + 2 * h,
        "lm_head": cfg["vocab_size"] * h,
        "embedding": cfg["vocab_size"] * h,
        "norm": h,
        "total": cfg["num_hidden_layers"] * (block + attention + 2 * h) + 2 * cfg["vocab_size"] * h + h,
    }


def scaled_zero_knobs(tiny: dict[str, int] | None = None) -> dict[str, Any]:
    """The ZeRO-3 knobs of the tiny run: the real defaults times ``tiny block / real block``.

    ``stage3_param_persistence_threshold`` is the exception: a threshold on single parameters whose
    sizes do not scale with the block (norms and routers scale with hidden only). In the real model
    the parameters <= 1e5 are the norms (4096) and routers (32768), not k/v_proj (4.2M); 1e4 keeps
    exactly that set persistent in the tiny model (norm 256, router 2048, k/v_proj 16384), where the
    scaled value (~391) would also partition the routers.
    """
    tiny = tiny or TINY_MIXTRAL
    ratio = shape_counts(tiny)["block"] / shape_counts(REAL_MIXTRAL)["block"]
    knobs: dict[str, Any] = {k: round(v * ratio) for k, v in REAL_KNOBS.items()}
    knobs["stage3_param_persistence_threshold"] = 10_000
    knobs["_scale"] = ratio
    return knobs


def ds_config_for(case: dict[str, Any], ranks: int) -> dict[str, Any]:
    knobs = {k: v for k, v in case["zero_knobs"].items() if not k.startswith("_")}
    if not case["leaf"]:
        # DeepSpeed 0.19.8 makes MixtralSparseMoeBlock a leaf by default (zero/leaf_module_config.py
        # DEFAULT_LEAF_MODULE_CLASSES, applied in engine.py via apply_zero_leaf_module_config); an
        # empty class list is the only way to run it without a leaf module.
        knobs["leaf_module"] = {"classes": []}
    micro = int(case["micro_batch"])
    accumulation = int(case["gradient_accumulation_steps"])
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": micro * accumulation * ranks,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
        "zero_optimization": {"stage": 3, **knobs},
        "bf16": {"enabled": case["dtype"] == "bf16"},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }


# ---- the probe ------------------------------------------------------------------------------------


_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(mlp|self_attn|input_layernorm|post_attention_layernorm)\b")


def param_label(name: str) -> str:
    """Where a parameter belongs, at the granularity the findings need: ``layers.N.mlp`` (the MoE
    block: router + experts), ``layers.N.self_attn``, ``lm_head``, ``embed_tokens``, ..."""
    m = _LAYER_RE.match(name)
    if m:
        return f"layers.{m.group(1)}.{m.group(2)}"
    return name.removeprefix("model.").rsplit(".", 1)[0]


class Probe:
    """Samples what ZeRO-3 holds; keeps per-micro-step, per-phase peaks with their composition.

    Metrics, in elements unless named bytes (a "block" is one MoE block: router + experts):

    * ``gathered``: non-persistent ZeRO-3 parameters whose ``ds_status`` is AVAILABLE or INFLIGHT;
    * ``stale``: storages that held a gathered parameter, whose parameter has since been released
      (``ds_status`` NOT_AVAILABLE, or gathered again into a new storage) and which are still alive,
      i.e. referenced from elsewhere (autograd's saved tensors);
    * ``grads``: full-size gradients attached to ZeRO-3 parameters (``param.grad``, before reduction),
      inside the preallocated IPG bucket buffer or outside it;
    * ``both`` = gathered + grads; ``held`` = gathered + stale; ``held_grads`` = gathered + stale + grads;
    * ``live_bytes``: storages allocated by ops since the micro-step began and still alive.
    """

    METRICS = ("gathered", "stale", "grads", "both", "held", "held_grads", "live_bytes")

    def __init__(self, engine: Any, track_live_bytes: bool) -> None:
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        self.status = ZeroParamStatus
        self.engine = engine
        self.optimizer = engine.optimizer
        named = list(engine.module.named_parameters())
        self.params = [p for _, p in named if hasattr(p, "ds_id")]
        self.names = {id(p): n for n, p in named}
        self.labels = {id(p): param_label(n) for n, p in named}
        self.persistent = [p for p in self.params if getattr(p, "ds_persist", False)]
        self.partitioned = [p for p in self.params if not getattr(p, "ds_persist", False)]
        self.module_names = {id(m): (n or "<root>") for n, m in engine.module.named_modules()}
        self.buckets = list(getattr(self.optimizer, "ipg_buckets", {}).values())
        self.track_live_bytes = track_live_bytes
        self.micro: dict[str, Any] | None = None
        self.context = "idle"
        self.phase = "idle"
        self.live: dict[int, tuple[Any, int, str]] = {}
        # storage ptr -> (StorageWeakRef, elements, label) of every storage a gathered parameter had
        self.param_storages: dict[int, tuple[Any, int, str]] = {}
        self.events: list[list[Any]] = []
        self.keep_events = False

    # -- measurements --
    def _bucket_ptrs(self) -> set[int]:
        return {b.buffer.untyped_storage().data_ptr() for b in self.buckets if b.buffer is not None}

    def _remember_gathered(self) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        for p in self.partitioned:
            if p.ds_status == self.status.AVAILABLE and p.data.numel():
                st = p.data.untyped_storage()
                ptr = st.data_ptr()
                known = self.param_storages.get(ptr)
                if known is None or known[0].expired():
                    elements = st.nbytes() // p.data.element_size()
                    self.param_storages[ptr] = (StorageWeakRef(st), elements, self.labels[id(p)])

    def _current_gathered_ptrs(self) -> set[int]:
        return {
            p.data.untyped_storage().data_ptr()
            for p in self.partitioned
            if p.ds_status == self.status.AVAILABLE and p.data.numel()
        }

    def _stale(self, by_label: bool = False) -> tuple[int, dict[str, int]]:
        current = self._current_gathered_ptrs()
        total = 0
        labels: dict[str, int] = {}
        for ptr in list(self.param_storages):
            ref, elements, label = self.param_storages[ptr]
            if ref.expired():
                del self.param_storages[ptr]
                continue
            if ptr in current:
                continue
            total += elements
            if by_label:
                labels[label] = labels.get(label, 0) + elements
        return total, labels

    def _scan(self) -> dict[str, int]:
        available = inflight = loose = in_bucket = 0
        bucket_ptrs = self._bucket_ptrs()
        for p in self.partitioned:
            st = p.ds_status
            if st == self.status.AVAILABLE:
                available += p.ds_numel
            elif st == self.status.INFLIGHT:
                inflight += p.ds_numel
        for p in self.params:
            g = p.grad
            if g is None or g.numel() == 0 or g.numel() != p.ds_numel:
                continue
            if g.untyped_storage().data_ptr() in bucket_ptrs:
                in_bucket += g.numel()
            else:
                loose += g.numel()
        stale, _ = self._stale()
        gathered = available + inflight
        grads = loose + in_bucket
        return {
            "gathered": gathered,
            "inflight": inflight,
            "stale": stale,
            "grads": grads,
            "grads_outside_bucket": loose,
            "grads_in_bucket": in_bucket,
            "bucket_fill": sum(b.elements for b in self.buckets),
            "both": gathered + grads,
            "held": gathered + stale,
            "held_grads": gathered + stale + grads,
        }

    def _gathered_by_label(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.partitioned:
            if p.ds_status != self.status.NOT_AVAILABLE:
                label = self.labels[id(p)] + ("" if p.ds_status == self.status.AVAILABLE else " (inflight)")
                out[label] = out.get(label, 0) + p.ds_numel
        return out

    def _grads_by_label(self) -> dict[str, int]:
        out: dict[str, int] = {}
        bucket_ptrs = self._bucket_ptrs()
        for p in self.params:
            g = p.grad
            if g is None or g.numel() == 0 or g.numel() != p.ds_numel:
                continue
            where = " (in bucket)" if g.untyped_storage().data_ptr() in bucket_ptrs else ""
            label = self.labels[id(p)] + where
            out[label] = out.get(label, 0) + g.numel()
        return out

    def _live_bytes(self) -> int:
        dead = [ptr for ptr, (ref, _, _) in self.live.items() if ref.expired()]
        for ptr in dead:
            del self.live[ptr]
        return sum(nbytes for _, nbytes, _ in self.live.values())

    def _live_composition(self) -> dict[str, int]:
        gathered = self._current_gathered_ptrs()
        grads = {p.grad.untyped_storage().data_ptr() for p in self.params if p.grad is not None and p.grad.numel()}
        bucket = self._bucket_ptrs()
        out: dict[str, int] = {}
        for ptr, (_, nbytes, tag) in self.live.items():
            if ptr in gathered:
                key = "gathered parameters"
            elif ptr in self.param_storages:
                key = "released parameters' storages still referenced"
            elif ptr in bucket:
                key = "ipg bucket buffer"
            elif ptr in grads:
                key = "full-size gradients (outside the bucket)"
            else:
                key = f"other ({tag.split(':')[0]}, {tag.rsplit(':', 1)[-1]})"
            out[key] = out.get(key, 0) + nbytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1])[:10])

    def note_outputs(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """Track storages an op allocated (outputs that alias no input)."""
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils._pytree import tree_flatten

        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor) and not t.is_meta
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.is_meta:
                continue
            st = t.untyped_storage()
            ptr, nbytes = st.data_ptr(), st.nbytes()
            if nbytes == 0 or ptr in inputs:
                continue
            known = self.live.get(ptr)
            if known is not None and not known[0].expired():
                continue
            self.live[ptr] = (StorageWeakRef(st), nbytes, f"{self.phase}:{self.context}:{func.__name__}")

    def _detail(self, metric: str, values: dict[str, int]) -> dict[str, Any]:
        detail: dict[str, Any] = dict(values)
        if metric in ("gathered", "both", "held", "held_grads"):
            detail["gathered_by"] = self._gathered_by_label()
        if metric in ("stale", "held", "held_grads"):
            detail["stale_by"] = self._stale(by_label=True)[1]
        if metric in ("grads", "both", "held_grads"):
            detail["grads_by"] = self._grads_by_label()
        if metric == "live_bytes":
            detail["composition"] = self._live_composition()
        return detail

    def sample(self, where: str) -> None:
        m = self.micro
        if m is None:
            return
        values = self._scan()
        if self.track_live_bytes:
            values["live_bytes"] = self._live_bytes()
        peaks = m["peaks"].setdefault(self.phase, {})
        for metric in self.METRICS:
            if metric not in values:
                continue
            best = peaks.get(metric)
            if best is None or values[metric] > best["value"]:
                peaks[metric] = {"value": values[metric], "at": where, **self._detail(metric, values)}
        if self.keep_events and not where.startswith("op:"):
            self.events.append([self.phase, where, values["gathered"], values["stale"], values["grads"]])

    def hook_event(self, where: str) -> None:
        self.context = where
        self._remember_gathered()
        self.sample(where)

    # -- micro-step bookkeeping --
    def begin(self, index: int) -> None:
        coordinator = self.optimizer.parameter_offload.get_param_coordinator()
        self.micro = {"index": index, "peaks": {}, "trace_before": _trace_mode(coordinator)}
        self.live = {}
        self.events = []

    def end(self) -> dict[str, Any]:
        assert self.micro is not None
        coordinator = self.optimizer.parameter_offload.get_param_coordinator()
        m = self.micro
        m["trace_after"] = _trace_mode(coordinator)
        if self.keep_events:
            m["events"] = self.events
        self.micro = None
        return m


class _Saved:
    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


class SavedActivations:
    """Bytes autograd saves for backward in one forward, counted without pinning parameters.

    ``tests/finetune_worker.SavedActivations`` packs ``t.detach()``: a new tensor on the same
    storage, which keeps a ZeRO-3 parameter's gathered storage alive after DeepSpeed releases the
    parameter (``param.data`` is swapped for an empty tensor, but the detached alias still holds
    the old storage). That would fake the very effect measured here, so this variant hands a
    tensor whose storage is a parameter's back unchanged (autograd then holds exactly what it holds
    without hooks: a parameter itself follows ``param.data``; a view of one keeps the storage) and
    counts only the others, each storage once, still alive at the snapshot.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.saved: list[Any] = []

    def _param_ptrs(self) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in (*self.model.parameters(), *self.model.buffers())}

    @contextlib.contextmanager
    def recording(self) -> Any:
        import weakref

        import torch

        def pack(t: Any) -> Any:
            if t.untyped_storage().data_ptr() in self._param_ptrs():
                return t
            holder = _Saved(t.detach())
            self.saved.append(weakref.ref(holder))
            return holder

        def unpack(packed: Any) -> Any:
            return packed.tensor if isinstance(packed, _Saved) else packed

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def snapshot(self) -> int:
        gc.collect()
        excluded = self._param_ptrs()
        storages: dict[int, int] = {}
        for ref in self.saved:
            holder = ref()
            if holder is None:
                continue
            st = holder.tensor.untyped_storage()
            if st.data_ptr() in excluded or st.nbytes() == 0:
                continue
            storages[st.data_ptr()] = st.nbytes()
        return sum(storages.values())


def _trace_mode(coordinator: Any) -> str:
    if coordinator.is_complete_trace():
        return "complete"
    if coordinator.is_record_trace():
        return "record"
    return "invalid"


def install_patches(probe: Probe) -> list[tuple[Any, str, Any]]:
    """Wrap the ZeRO-3 hook points so each samples the probe; returns what to restore."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    saved: list[tuple[Any, str, Any]] = []

    def wrap(cls: Any, attr: str, make: Any) -> None:
        original = getattr(cls, attr)
        saved.append((cls, attr, original))
        setattr(cls, attr, make(original))

    def fetch(original: Any) -> Any:
        def fetch_sub_module(self: Any, current_submodule: Any, forward: bool) -> Any:
            result = original(self, current_submodule, forward)
            name = probe.module_names.get(id(current_submodule), "?")
            probe.hook_event(f"fetched {'fwd' if forward else 'bwd'} {name}")
            return result

        return fetch_sub_module

    def release(original: Any) -> Any:
        def release_sub_module(self: Any, submodule: Any, forward: bool = False) -> Any:
            name = probe.module_names.get(id(submodule), "?")
            probe.hook_event(f"release {'fwd' if forward else 'bwd'} {name} (before)")
            result = original(self, submodule, forward)
            probe.hook_event(f"release {'fwd' if forward else 'bwd'} {name} (after)")
            return result

        return release_sub_module

    def reduce(original: Any) -> Any:
        def reduce_ready_partitions_and_remove_grads(self: Any, param: Any) -> Any:
            probe.hook_event(f"reduce {probe.names.get(id(param), '?')} (before)")
            return original(self, param)

        return reduce_ready_partitions_and_remove_grads

    def flush(original: Any) -> Any:
        def reduce_and_partition_ipg_grads(self: Any, communication_data_type: Any) -> Any:
            probe.hook_event("ipg flush (before)")
            result = original(self, communication_data_type)
            probe.hook_event("ipg flush (after)")
            return result

        return reduce_and_partition_ipg_grads

    wrap(PartitionedParameterCoordinator, "fetch_sub_module", fetch)
    wrap(PartitionedParameterCoordinator, "release_sub_module", release)
    wrap(DeepSpeedZeroOptimizer_Stage3, "reduce_ready_partitions_and_remove_grads", reduce)
    wrap(DeepSpeedZeroOptimizer_Stage3, "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads", flush)
    return saved


def _probe_mode(probe: Probe) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class SampleEveryOp(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if probe.micro is not None:
                if probe.track_live_bytes:
                    probe.note_outputs(func, args, kwargs, out)
                probe.sample(f"op:{func.__name__}")
            return out

    return SampleEveryOp()


# ---- the run --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_case_args(argv, __doc__.splitlines()[0])
    case: dict[str, Any] = json.loads(args.case.read_text())

    import deepspeed
    from deepspeed import comm as dist
    from transformers import MixtralConfig, MixtralForCausalLM  # noqa: F401  (before any zero.Init)

    deepspeed.init_distributed(dist_backend="gloo")
    try:
        return _run(case)
    finally:
        gc.collect()
        dist.destroy_process_group()


def _run(case: dict[str, Any]) -> int:
    import deepspeed
    import torch
    import transformers
    from deepspeed import comm as dist
    from transformers import MixtralConfig, MixtralForCausalLM
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    rank, world = dist.get_rank(), dist.get_world_size()
    tiny = {**TINY_MIXTRAL, **case.get("model_overrides", {})}
    ds_config = ds_config_for(case, world)
    dtype = torch.bfloat16 if case["dtype"] == "bf16" else torch.float32

    torch.manual_seed(int(case.get("seed", 1234)))
    config = MixtralConfig(
        **tiny,
        max_position_embeddings=max(128, int(case["seq_len"])),
        use_cache=False,
        tie_word_embeddings=False,
        router_jitter_noise=0.0,
        **({"experts_implementation": case["experts_implementation"]} if case.get("experts_implementation") else {}),
    )
    model = MixtralForCausalLM(config).to(dtype)
    model.train()
    leaf_modules: list[str] = []
    if case["leaf"]:
        deepspeed.utils.set_z3_leaf_modules(model, [MixtralSparseMoeBlock])
        leaf_modules = [n for n, m in model.named_modules() if getattr(m, "_z3_leaf", False)]

    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    leaf_after_init = [n for n, m in engine.module.named_modules() if getattr(m, "_z3_leaf", False)]
    probe = Probe(engine, track_live_bytes=bool(case.get("track_live_bytes", True)))
    saved = install_patches(probe)
    for p in probe.params:
        if p.requires_grad:
            name = probe.names[id(p)]
            p.register_post_accumulate_grad_hook(lambda _p, _n=name: probe.hook_event(f"grad accumulated {_n}"))

    counts = shape_counts(tiny)
    knobs = case["zero_knobs"]
    record: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "versions": {
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "transformers": transformers.__version__,
        },
        "case": case,
        "ds_config": ds_config,
        "leaf_modules_set": leaf_modules,
        "leaf_modules": leaf_after_init,
        "experts_implementation": getattr(engine.module.config, "_experts_implementation", None),
        "shape": counts,
        "param_shapes": {n: list(getattr(p, "ds_shape", p.shape)) for n, p in engine.module.named_parameters()},
        "persistent_params": sorted(probe.names[id(p)] for p in probe.persistent),
        "persistent_elements": sum(p.ds_numel for p in probe.persistent),
        "ipg_bucket_capacity": sum(b.buffer.numel() for b in probe.buckets if b.buffer is not None),
        "one_block_model_gathered": max(
            counts["block"],
            min(int(knobs["stage3_max_live_parameters"]), counts["layer"] + int(knobs["stage3_prefetch_bucket_size"])),
        ),
        "zero_optimizer": type(engine.optimizer).__name__,
        "functional_linear": getattr(torch.nn.functional.linear, "__name__", str(torch.nn.functional.linear)),
        "gradient_accumulation_dtype": str(getattr(engine.optimizer, "gradient_accumulation_dtype", None)),
    }

    micro = int(ds_config["train_micro_batch_size_per_gpu"])
    accumulation = int(ds_config["gradient_accumulation_steps"])
    steps = int(case.get("steps", 2))
    vocab = int(tiny["vocab_size"])
    seq = int(case["seq_len"])
    micros: list[dict[str, Any]] = []
    losses: list[float] = []
    mode = _probe_mode(probe)
    index = 0
    started = time.monotonic()
    try:
        for _step in range(steps):
            for _acc in range(accumulation):
                gen = torch.Generator().manual_seed(1000 * rank + index)
                ids = torch.randint(0, vocab, (micro, seq), generator=gen)
                counter = SavedActivations(engine.module) if case.get("count_saved", True) else None
                probe.keep_events = index == 1  # the first micro-step with a complete trace
                probe.begin(index)
                with mode:
                    probe.phase = "fwd"
                    with counter.recording() if counter else contextlib.nullcontext():
                        loss = engine(input_ids=ids, labels=ids).loss
                    saved_bytes = counter.snapshot() if counter else None
                    probe.phase = "bwd"
                    engine.backward(loss)
                    probe.phase = "step"
                    engine.step()
                    probe.phase = "idle"
                m = probe.end()
                m["saved_activation_bytes"] = saved_bytes
                m["boundary_step"] = (index + 1) % accumulation == 0
                micros.append(m)
                losses.append(float(loss.detach().float()))
                del counter, loss
                index += 1
    finally:
        for cls, attr, original in saved:
            setattr(cls, attr, original)

    record["train_s"] = round(time.monotonic() - started, 2)
    record["micro_steps"] = micros
    record["losses"] = losses
    record["global_steps"] = engine.global_steps
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: tests.* from the checkout
    from tests import rank_reports

    rank_reports.write(RECORD_KIND, rank, record)
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
