"""torchrun worker: run a tiny fine-tuning setup under real DeepSpeed and report what each rank holds.

Launched by :func:`tests.finetune_oracle.measure_finetune`, one process per rank, on DeepSpeed's
CPU accelerator with the gloo backend. It measures; it predicts nothing. The case (a JSON file,
``--case``) names the model (tiny Llama or Qwen3 built from a transformers config, random weights,
nothing downloaded), the dtype (fp32, or bf16 through DeepSpeed's ``bf16`` block), the method
(``full``, ``lora`` through peft, ``freeze`` = only the last N decoder layers and named modules
trainable, ``qlora`` = bitsandbytes 4-bit base + LoRA), the objective (``sft``, or ``dpo`` with a
separate frozen reference model prepared by TRL's own ``trl.models.utils.prepare_deepspeed``), and
the complete DeepSpeed config (composed by the oracle). A list of cases runs each in turn in the
same processes (one torchrun start for all), each record tagged with its ``case_index``.

The setup mirrors what HF Trainer / TRL do: the base model is built inside ``deepspeed.zero.Init``
for ZeRO-3 (as ``from_pretrained`` does under an active ZeRO-3 config) and the PEFT wrapping comes
after it; the optimizer is DeepSpeed's, from the config's ``optimizer`` block, over Trainer's two
parameter groups (weight decay / no weight decay; an empty group is left out); gradient
checkpointing is ``gradient_checkpointing_enable()`` plus ``enable_input_require_grads()`` for
PEFT, as Trainer does; the DPO reference model is prepared before the policy engine, as
``DPOTrainer.__init__`` does before ``Trainer.train``.

Per rank, after the optimizer steps, one record is written to the rank's own report file
(:mod:`tests.rank_reports`, kind ``DSGEN_FINETUNE``; stdout lines from several ranks interleave)::

    {"rank": 0, "world_size": 2, ...}

Exit status: 0 on success; 3 if a loss is not finite or the engine did not take the expected
number of optimizer steps; anything else is an uncaught exception.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    from tests.tiny_models import hf_config, model_classes, parse_case_args
    from tests.worker_state import run_cases
except ModuleNotFoundError:  # torchrun runs a worker as a script: tests/, not the checkout, is on sys.path
    from tiny_models import hf_config, model_classes, parse_case_args  # type: ignore[no-redef]
    from worker_state import run_cases  # type: ignore[no-redef]

if TYPE_CHECKING:
    import torch

# Before deepspeed is imported: the accelerator is chosen at import time.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

RECORD_KIND = "DSGEN_FINETUNE"
EXIT_BAD_TRAINING = 3

# transformers.Trainer.get_decay_parameter_names (transformers 5.x): no weight decay for these.
_NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def _build_base(case: dict[str, Any], zero3_config: dict[str, Any] | None) -> torch.nn.Module:
    """The base model with the case's seed (identical weights on every rank and for the reference)."""
    import deepspeed
    import torch

    _, model_cls = model_classes(case["model"])
    torch.manual_seed(case.get("seed", 1234))
    init = deepspeed.zero.Init(config_dict_or_path=zero3_config) if zero3_config else contextlib.nullcontext()
    with init:
        return model_cls(hf_config(case))


def _build_qlora_base(case: dict[str, Any], tmp: Path) -> torch.nn.Module:
    """QLoRA's base: the tiny model saved, then loaded back through ``BitsAndBytesConfig`` (4-bit nf4,
    double quantisation, bf16 quant storage), as a QLoRA script loads its checkpoint."""
    import torch
    from transformers import BitsAndBytesConfig

    _, model_cls = model_classes(case["model"])
    base = _build_base(case, None)
    path = tmp / f"qlora_base_rank{os.environ.get('RANK', '0')}"
    # Written directly (save_pretrained writes on the main process only, and every rank loads).
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    base.config.save_pretrained(path)
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, path / "model.safetensors", {"format": "pt"})
    del base
    bnb = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_quant_storage=torch.bfloat16,
    )
    return model_cls.from_pretrained(path, quantization_config=bnb, dtype=torch.bfloat16, device_map={"": "cpu"})


def _apply_method(model: torch.nn.Module, case: dict[str, Any]) -> torch.nn.Module:
    method = case["method"]
    if method == "full":
        return model
    if method == "freeze":
        spec = case.get("freeze", {})
        last = int(spec.get("last_layers", 1))
        names = list(spec.get("modules", []))
        layers = model.model.layers
        trainable_prefixes = [f"model.layers.{i}." for i in range(len(layers) - last, len(layers))]
        trainable_prefixes += [f"{name}." for name in names]
        for name, param in model.named_parameters():
            param.requires_grad_(any(name.startswith(prefix) for prefix in trainable_prefixes))
        return model
    if method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        spec = case.get("lora", {})
        if method == "qlora":
            from peft import prepare_model_for_kbit_training

            # What QLoRA recipes call; checkpointing is switched on (or not) below, like the others.
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        lora = LoraConfig(
            r=int(spec.get("r", 8)),
            lora_alpha=int(spec.get("lora_alpha", 16)),
            lora_dropout=float(spec.get("lora_dropout", 0.0)),
            target_modules=spec.get("target_modules", "all-linear"),
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, lora)
    raise ValueError(f"unknown method {method!r}")


def _enable_checkpointing(model: torch.nn.Module, peft: bool) -> None:
    """What Trainer does for ``gradient_checkpointing=True`` (transformers 5: non-reentrant)."""
    model.gradient_checkpointing_enable()
    if peft:
        # Trainer/TRL call this for PEFT: with frozen embeddings the checkpointed layers' input
        # would not require grad and (reentrant) checkpointing would drop the adapters' grads.
        model.enable_input_require_grads()
    if not any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        raise RuntimeError("gradient checkpointing was requested but no module has it enabled")


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Trainer.create_optimizer's two groups (trainable params only); empty groups left out."""
    import re

    groups = [
        {"params": [], "weight_decay": weight_decay},
        {"params": [], "weight_decay": 0.0},
    ]
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        no_decay = any(re.search(pattern, name.lower()) for pattern in _NO_DECAY_PATTERNS)
        groups[1 if no_decay else 0]["params"].append(param)
    return [g for g in groups if g["params"]]


# ---- measurements -----------------------------------------------------------------------------


def _local_numel(param: torch.Tensor) -> int:
    """Elements of ``param`` this rank holds as its own: the ZeRO-3 partition, else the tensor."""
    ds_tensor = getattr(param, "ds_tensor", None)
    return int(ds_tensor.numel()) if ds_tensor is not None else int(param.numel())


def _local_bytes(param: torch.Tensor) -> int:
    ds_tensor = getattr(param, "ds_tensor", None)
    tensor = ds_tensor if ds_tensor is not None else param
    return int(tensor.numel() * tensor.element_size())


def _param_census(model: torch.nn.Module) -> dict[str, Any]:
    """Trainable / frozen elements and bytes as this rank holds them, plus ZeRO-3 extras."""
    out: dict[str, Any] = {
        "trainable_elements": 0,
        "frozen_elements": 0,
        "trainable_bytes": 0,
        "frozen_bytes": 0,
        "trainable_full_elements": 0,  # unpartitioned sizes, for reference
        "frozen_full_elements": 0,
        "param_dtypes": {},
    }
    persistent = persistent_bytes = materialised = 0
    zero3 = False
    seen: set[int] = set()
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        kind = "trainable" if param.requires_grad else "frozen"
        out[f"{kind}_elements"] += _local_numel(param)
        out[f"{kind}_bytes"] += _local_bytes(param)
        full = int(getattr(param, "ds_numel", param.numel()))
        out[f"{kind}_full_elements"] += full
        dtype = str(param.dtype).removeprefix("torch.")
        out["param_dtypes"][f"{kind}:{dtype}"] = out["param_dtypes"].get(f"{kind}:{dtype}", 0) + full
        if hasattr(param, "ds_tensor"):
            zero3 = True
            # A ZeRO-3 param whose full tensor stays gathered on every rank (ds_persist: numel under
            # stage3_param_persistence_threshold) is held twice: full data plus its partition.
            if getattr(param, "ds_persist", False):
                persistent += full
                persistent_bytes += full * param.element_size()
            materialised += int(param.data.numel())
    if zero3:
        out["zero3_persistent_elements"] = persistent
        out["zero3_persistent_bytes"] = persistent_bytes
        out["zero3_materialised_elements"] = materialised  # param.data numel now (gathered/persistent)
    return out


def _storages_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (each storage once, its full size)."""
    storages: dict[int, int] = {}
    for t in tensors:
        if t is None or not hasattr(t, "untyped_storage"):
            continue
        st = t.untyped_storage()
        if st.nbytes():
            storages[st.data_ptr()] = st.nbytes()
    return sum(storages.values())


def _tensor_list(value: Any) -> list[torch.Tensor]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensor_list(item)]
    if isinstance(value, dict):
        return _tensor_list(list(value.values()))
    return []


def _zero_buffers(engine: Any) -> dict[str, Any]:
    """Sizes of the ZeRO optimizer's flat buffers on this rank (elements per group)."""
    opt = engine.optimizer
    out: dict[str, Any] = {"zero_optimizer": type(opt).__name__}
    if hasattr(opt, "bit16_groups_flat"):  # ZeRO-1/2
        out["zero12_bit16_groups_flat_elements"] = [int(t.numel()) for t in opt.bit16_groups_flat]
        out["zero12_bit16_groups_flat_dtype"] = [str(t.dtype).removeprefix("torch.") for t in opt.bit16_groups_flat]
        out["zero12_single_partition_of_fp32_groups_elements"] = [
            int(t.numel()) for t in opt.single_partition_of_fp32_groups
        ]
        out["zero12_fp32_partition_is_bit16_storage"] = [
            t.untyped_storage().data_ptr() == f.untyped_storage().data_ptr()
            for t, f in zip(opt.single_partition_of_fp32_groups, opt.bit16_groups_flat, strict=False)
        ]
        out["zero12_partition_size"] = [int(x) for x in getattr(opt, "partition_size", [])]
    if hasattr(opt, "fp16_partitioned_groups_flat"):  # ZeRO-3
        out["zero3_fp16_partitioned_groups_flat_elements"] = [int(t.numel()) for t in opt.fp16_partitioned_groups_flat]
        out["zero3_fp16_partitioned_groups_flat_dtype"] = [
            str(t.dtype).removeprefix("torch.") for t in opt.fp16_partitioned_groups_flat
        ]
        out["zero3_fp32_partitioned_groups_flat_elements"] = [int(t.numel()) for t in opt.fp32_partitioned_groups_flat]
        out["zero3_fp32_is_fp16_storage"] = [
            a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            for a, b in zip(opt.fp32_partitioned_groups_flat, opt.fp16_partitioned_groups_flat, strict=False)
        ]
        buf = getattr(opt, "grad_partitions_flat_buffer", None)
        out["zero3_grad_partitions_flat_buffer_elements"] = int(buf.numel()) if buf is not None else None
        out["zero3_grad_partitions_flat_buffer_bytes"] = (
            int(buf.numel() * buf.element_size()) if buf is not None else None
        )
        out["zero3_param_persistence_threshold"] = int(engine._config.zero_config.param_persistence_threshold)
        out["zero3_reduce_bucket_size"] = int(engine._config.zero_config.reduce_bucket_size)
    return out


def _gradient_holdings(engine: Any) -> dict[str, Any]:
    """Gradient bytes the rank holds after the boundary backward, before ``step`` (by holder)."""
    opt = engine.optimizer
    parts: dict[str, list[torch.Tensor]] = {
        "param_grad": [p.grad for p in engine.module.parameters() if p.grad is not None],
    }
    averaged = getattr(opt, "averaged_gradients", None)
    if averaged:
        parts["averaged_gradients"] = _tensor_list(averaged)
    for attr in ("grads_in_partition", "grad_partitions_flat_buffer"):
        value = getattr(opt, attr, None)
        if value is not None:
            parts[attr] = _tensor_list(value)
    buckets = getattr(opt, "ipg_buckets", None)
    if isinstance(buckets, dict):
        parts["ipg_buckets"] = [t for bucket in buckets.values() for t in _tensor_list(getattr(bucket, "buffer", None))]
    fp32_grads = [t.grad for t in getattr(opt, "single_partition_of_fp32_groups", []) if t.grad is not None]
    fp32_grads += [t.grad for t in getattr(opt, "fp32_partitioned_groups_flat", []) if t.grad is not None]
    if fp32_grads:
        parts["fp32_partition_grad"] = fp32_grads
    by_part = {name: _storages_bytes(tensors) for name, tensors in parts.items()}
    # The reduction bucket (ZeRO-3 with contiguous_gradients: torch.empty(reduce_bucket_size), 5e8
    # elements by default) is reported apart: it is a staging buffer, not a held gradient.
    held = [t for name, tensors in parts.items() if name != "ipg_buckets" for t in tensors]
    if averaged:  # ZeRO-1/2: views of this rank's partition (a straddling param's full grad stays alive)
        partition_elements = sum(int(t.numel()) for t in _tensor_list(averaged))
    else:
        flat = getattr(opt, "grad_partitions_flat_buffer", None)
        partition_elements = int(flat.numel()) if flat is not None else None
    return {
        "gradient_partition_elements": partition_elements,
        "gradient_bytes_by_holder": by_part,
        "gradient_bytes": _storages_bytes(held),
        "gradient_bucket_bytes": by_part.get("ipg_buckets", 0),
    }


def _optimizer_state_bytes(engine: Any) -> dict[str, Any]:
    """nbytes of the torch optimizer's state tensors on this rank (each storage once)."""
    torch_opt = getattr(engine.optimizer, "optimizer", None) or engine.optimizer
    tensors = _tensor_list([dict(state) for state in torch_opt.state.values()])
    return {
        "torch_optimizer": type(torch_opt).__name__,
        "optimizer_state_bytes": _storages_bytes(tensors),
        "optimizer_state_elements": sum(int(t.numel()) for t in tensors if t.dim() > 0),
        "optimizer_state_dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in tensors}),
    }


class _Saved:
    """What the pack hook returns: autograd keeps it exactly as long as it keeps the saved tensor."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedActivations:
    """Bytes autograd holds for backward, counted as bench/activation_accuracy.py counts them.

    Every tensor given to ``saved_tensors_hooks``' pack hook is recorded; those whose graph node is
    still alive at the snapshot are counted, each storage once (``untyped_storage().data_ptr()``,
    full ``nbytes``), plus the keyword tensors a checkpointed layer binds in its recompute closure.
    Parameters and buffers are left out. Unlike the bench (a plain module) the model here runs
    under DeepSpeed: a ZeRO-3 parameter's storage exists only while it is gathered, so a tensor is
    left out when its storage is a parameter's or buffer's storage *at the moment it is packed*.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.saved: list[weakref.ref[_Saved]] = []
        self.held_by_checkpoint: list[torch.Tensor] = []
        self.excluded: set[int] = set()

    def _param_ptrs(self) -> set[int]:
        return {
            t.untyped_storage().data_ptr()
            for t in (*self.model.parameters(), *self.model.buffers())
            if t.untyped_storage().nbytes()
        }

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        import torch

        def pack(t: torch.Tensor) -> _Saved:
            ptr = t.untyped_storage().data_ptr()
            if ptr in self._param_ptrs():
                self.excluded.add(ptr)
            holder = _Saved(t.detach())
            self.saved.append(weakref.ref(holder))
            return holder

        def unpack(holder: _Saved) -> torch.Tensor:
            return holder.tensor

        wrapped = []
        for module in self.model.modules():
            func = module.__dict__.get("_gradient_checkpointing_func")
            if func is None or not getattr(module, "gradient_checkpointing", False):
                continue

            def record(function: Any, *args: Any, _inner: Any = func, **kwargs: Any) -> Any:
                bound = getattr(function, "keywords", {}) or {}
                self.held_by_checkpoint.extend(_tensor_list(list(bound.values())))
                return _inner(function, *args, **kwargs)

            module._gradient_checkpointing_func = record
            wrapped.append((module, func))
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                yield
        finally:
            for module, func in wrapped:
                module._gradient_checkpointing_func = func

    def snapshot(self) -> int:
        gc.collect()
        excluded = self.excluded | self._param_ptrs()
        live = [holder.tensor for ref in self.saved if (holder := ref()) is not None]
        storages: dict[int, int] = {}
        for t in [*live, *self.held_by_checkpoint]:
            st = t.untyped_storage()
            if st.data_ptr() in excluded or st.nbytes() == 0:
                continue
            storages[st.data_ptr()] = st.nbytes()
        return sum(storages.values())


# ---- objectives --------------------------------------------------------------------------------


def _sequence_logps(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Sum of next-token log-probabilities per sequence (TRL's ``selective_log_softmax``)."""
    from trl.trainer.utils import selective_log_softmax

    return selective_log_softmax(logits[:, :-1, :], input_ids[:, 1:]).sum(-1)


def _dpo_loss(policy_logps: torch.Tensor, reference_logps: torch.Tensor, micro: int, beta: float) -> torch.Tensor:
    import torch.nn.functional as F

    chosen = policy_logps[:micro] - reference_logps[:micro]
    rejected = policy_logps[micro:] - reference_logps[micro:]
    return -F.logsigmoid(beta * (chosen - rejected)).mean()


def _fake_accelerator(ds_config: dict[str, Any]) -> Any:
    """The one attribute chain ``trl.models.utils.prepare_deepspeed`` reads from an Accelerator:
    ``accelerator.state.deepspeed_plugin.deepspeed_config`` (the processed DeepSpeed config)."""
    from types import SimpleNamespace

    return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=ds_config)))


def _reference_record(ref_engine: Any) -> dict[str, Any]:
    census = _param_census(ref_engine.module)
    zero = ref_engine._config.zero_config
    return {
        "ref_zero_stage": int(ref_engine.zero_optimization_stage()),
        "ref_param_elements": census["trainable_elements"] + census["frozen_elements"],
        "ref_param_bytes": census["trainable_bytes"] + census["frozen_bytes"],
        "ref_full_elements": census["trainable_full_elements"] + census["frozen_full_elements"],
        "ref_param_dtypes": census["param_dtypes"],
        "ref_has_optimizer": ref_engine.optimizer is not None,
        "ref_optimizer_type": type(ref_engine.optimizer).__name__ if ref_engine.optimizer is not None else None,
        "ref_zero3_persistent_elements": census.get("zero3_persistent_elements"),
        "ref_reduce_bucket_size": int(zero.reduce_bucket_size),
        "ref_stage3_prefetch_bucket_size": int(zero.prefetch_bucket_size),
        "ref_stage3_param_persistence_threshold": int(zero.param_persistence_threshold),
    }


# ---- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_case_args(argv, __doc__.splitlines()[0])
    given = json.loads(args.case.read_text())
    cases: list[dict[str, Any]] = given if isinstance(given, list) else [given]

    def prepare() -> None:
        for case in cases:
            model_classes(case["model"])
        if any(case["method"] in ("lora", "qlora") for case in cases):
            import peft  # noqa: F401  (before any zero.Init, like transformers)
        if any(case.get("objective", "sft") == "dpo" for case in cases):
            import trl.models.utils
            import trl.trainer.utils  # noqa: F401

    # a list of cases tags each record with its place (tests/ds_oracle.measure_cases)
    tagged = isinstance(given, list)
    return run_cases(len(cases), lambda i: _run(cases[i], args.case.parent, i if tagged else None), prepare=prepare)


def _run(case: dict[str, Any], tmp: Path, case_index: int | None) -> int:
    import deepspeed
    import peft
    import torch
    import transformers
    from deepspeed import comm as dist

    timings: dict[str, float] = {}
    started = time.monotonic()
    rank, world = dist.get_rank(), dist.get_world_size()
    ds_config: dict[str, Any] = case["ds_config"]
    stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
    objective = case.get("objective", "sft")
    method = case["method"]
    peft_method = method in ("lora", "qlora")
    zero3_config = ds_config if stage == 3 else None

    record: dict[str, Any] = {
        **({} if case_index is None else {"case_index": case_index}),
        "rank": rank,
        "world_size": world,
        "case": {k: v for k, v in case.items() if k != "ds_config"},
        "zero_stage": stage,
        "versions": {
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
    }
    with contextlib.suppress(ImportError):
        import trl

        record["versions"]["trl"] = trl.__version__
    if method == "qlora":
        import bitsandbytes

        record["versions"]["bitsandbytes"] = bitsandbytes.__version__

    # -- reference model first, as DPOTrainer.__init__ prepares it before Trainer.train --
    ref_engine = None
    if objective == "dpo":
        from trl.models.utils import prepare_deepspeed

        reference = _build_base(case, zero3_config)
        reference.requires_grad_(False)
        reference.eval()
        ref_engine = prepare_deepspeed(reference, _fake_accelerator(ds_config))
        record.update(_reference_record(ref_engine))
        timings["reference_init_s"] = time.monotonic() - started

    # -- policy --
    model = _build_qlora_base(case, tmp) if method == "qlora" else _build_base(case, zero3_config)
    model = _apply_method(model, case)
    if case.get("gradient_checkpointing"):
        _enable_checkpointing(model, peft_method)
    model.train()

    groups = _param_groups(model, float(case.get("weight_decay", 0.0)))
    t0 = time.monotonic()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config)
    timings["policy_init_s"] = time.monotonic() - t0
    record["optimizer_param_groups"] = len(groups)
    record["after_init"] = _param_census(engine.module)

    micro = engine.train_micro_batch_size_per_gpu()
    accumulation = engine.gradient_accumulation_steps()
    seq = int(case["seq_len"])
    vocab = int(engine.module.config.vocab_size)
    beta = float(case.get("dpo_beta", 0.1))
    gen = torch.Generator().manual_seed(case.get("seed", 1234) + 1000 * rank)
    steps = int(case.get("steps", 2))
    losses: list[float] = []
    grad_records: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for step in range(1, steps + 1):
        step_losses: list[float] = []
        for index in range(accumulation):
            measure = step == 1 and index == 0
            rows = 2 * micro if objective == "dpo" else micro  # chosen + rejected concatenated
            ids = torch.randint(0, vocab, (rows, seq), generator=gen).to(engine.device)
            counter = SavedActivations(engine.module) if measure else None
            with counter.recording() if counter else contextlib.nullcontext():
                if objective == "dpo":
                    out = engine(input_ids=ids)
                    if counter:
                        record["saved_activation_bytes_model_forward"] = counter.snapshot()
                    policy_logps = _sequence_logps(out.logits, ids)
                    del out
                    with torch.no_grad():
                        ref_logps = _sequence_logps(ref_engine(input_ids=ids).logits, ids)
                    loss = _dpo_loss(policy_logps, ref_logps, micro, beta)
                else:
                    loss = engine(input_ids=ids, labels=ids).loss
            if counter:
                record["saved_activation_bytes"] = counter.snapshot()
                record["activation_rows"] = rows
                del counter
            engine.backward(loss)
            if engine.is_gradient_accumulation_boundary():
                grad_records.append(_gradient_holdings(engine))
            engine.step()
            step_losses.append(float(loss.detach().float()))
        losses.append(sum(step_losses) / len(step_losses))
        if not all(math.isfinite(x) for x in step_losses):
            print(f"finetune_worker: rank {rank} step {step}: non-finite loss {step_losses}", file=sys.stderr)
            return EXIT_BAD_TRAINING
    timings["train_s"] = time.monotonic() - t0
    if engine.global_steps != steps:
        print(f"finetune_worker: rank {rank}: global_steps={engine.global_steps}, expected {steps}", file=sys.stderr)
        return EXIT_BAD_TRAINING

    record.update(_param_census(engine.module))
    record.update(_zero_buffers(engine))
    record.update(_optimizer_state_bytes(engine))
    if grad_records:
        record.update(grad_records[-1])
        record["gradient_bytes_per_step"] = [g["gradient_bytes"] for g in grad_records]
    if method == "qlora":  # after training: the 4-bit weights and quant states survived DeepSpeed's cast
        record["qlora"] = _qlora_bytes(engine.module)
    record["losses"] = losses
    record["micro_batch"] = micro
    record["gradient_accumulation_steps"] = accumulation
    record["global_steps"] = engine.global_steps
    timings["total_s"] = time.monotonic() - started
    record["timings"] = {k: round(v, 2) for k, v in timings.items()}

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: tests.* from the checkout
    from tests import rank_reports

    rank_reports.write(RECORD_KIND, rank, record)
    dist.barrier()
    return 0


def _qlora_bytes(model: torch.nn.Module) -> dict[str, Any]:
    """Packed 4-bit weight bytes and quant-state bytes of every bitsandbytes ``Linear4bit``."""
    import bitsandbytes as bnb

    layers: dict[str, Any] = {}
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        weight = module.weight
        state = weight.quant_state
        entry = {
            "shape": [int(module.out_features), int(module.in_features)],
            "packed_bytes": int(weight.numel() * weight.element_size()),
            "packed_dtype": str(weight.dtype).removeprefix("torch."),
            "absmax_bytes": int(state.absmax.numel() * state.absmax.element_size()),
            "code_bytes": int(state.code.numel() * state.code.element_size()),
        }
        if getattr(state, "state2", None) is not None:
            entry["nested_absmax_bytes"] = int(state.state2.absmax.numel() * state.state2.absmax.element_size())
            entry["nested_code_bytes"] = int(state.state2.code.numel() * state.state2.code.element_size())
            entry["offset_bytes"] = int(state.offset.numel() * state.offset.element_size())
        layers[name] = entry
    totals = {
        key: sum(entry.get(key, 0) for entry in layers.values())
        for key in ("packed_bytes", "absmax_bytes", "code_bytes", "nested_absmax_bytes", "nested_code_bytes")
    }
    return {"layers": layers, "totals": totals}


if __name__ == "__main__":
    sys.exit(main())
