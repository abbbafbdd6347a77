"""torchrun worker: train a tiny model under DeepSpeed AutoTP / AutoEP and report what each rank holds.

Launched by :func:`tests.mp_oracle.measure_mp_cases`, one process per rank, on DeepSpeed's CPU accelerator
with the gloo backend. It measures; it predicts nothing. The case (a JSON file, ``--case``) names the
model (a tiny Llama, Qwen3-MoE or Mixtral built from a transformers config class, random weights,
nothing downloaded), the dtype, and the complete DeepSpeed config composed by the oracle: the ZeRO
stage, ``tensor_parallel.autotp_size`` and/or the ``expert_parallel`` block.

The setup mirrors HF Trainer's. The weights come from a reference model built with the case's seed,
saved as safetensors and read back with ``from_pretrained`` while an ``HfDeepSpeedConfig`` of the case's
DeepSpeed config is alive (as ``TrainingArguments`` keeps one), so under ZeRO-3 transformers itself builds
the model inside ``deepspeed.zero.Init(config_dict_or_path=ds_config)`` and loads each partition. Under
ZeRO-3 with ``autotp_size`` > 1 transformers 5.24 refuses that load (``NotImplementedError`` in
``_apply_weight_conversions_to_state_dict``); with ``"zero_init_fallback": true`` the error is recorded
(``from_pretrained_error``) and the model is built inside ``deepspeed.zero.Init`` by the worker, its
weights loaded with ``GatheredParameters(modifier_rank=0)`` as transformers' ZeRO-3 loader does. With
``"tp_model_init": true`` the worker also calls ``deepspeed.tp_model_init`` as
``transformers.integrations.deepspeed.deepspeed_init`` does (record-only in DeepSpeed 0.19.8: the JSON
block alone turns AutoTP on, in ``deepspeed.initialize``). The optimizer is DeepSpeed's, from the config's
``optimizer`` block, over the flat list of trainable parameters Trainer passes in that case.

Data: a tensor-parallel group must see identical batches (``DeepSpeedEngine`` registers a forward
pre-hook, ``check_dataloader_inputs_same_across_ranks``, that asserts it on the first forward), so
every batch is a deterministic function of the data-parallel rank: ``rank // autotp_size`` (the
DeepSpeed mesh is ``(data_parallel, tensor_parallel)``, TP peers are consecutive ranks; the worker
checks this against ``deepspeed.utils.groups`` after ``initialize``).

Before DeepSpeed sees the model, each rank computes the loss of the unsharded reference model (fp32,
plain PyTorch, one process) on its first micro-batch: ``reference_loss``. The first-step loss under
TP or EP must equal it.

AutoEP in DeepSpeed 0.19.8 calls ``registry.get(key, default)`` on transformers'
``_CAN_RECORD_REGISTRY`` (``auto_ep_presets/base.py``, ``_install_instance_transformers_output_recorders``)
and transformers 5.24's ``_CanRecordRegistry.get`` takes one argument, so ``deepspeed.initialize`` fails.
``"can_record_registry_shim"``: False runs as installed; True patches ``get`` to take ``dict.get``'s
arguments first; ``"retry"`` runs as installed, records the error (``autoep_error``, None if there was
none) and, on that error only, initializes a freshly loaded model with the patch.

With ``"probe_batch_world_dp": true`` (AutoTP only) the worker first calls ``deepspeed.initialize`` with
``train_batch_size`` written over world // TP ranks and records what it raised (``batch_world_dp_error``).

Per rank, after the optimizer steps, one record is written to the rank's own report file
(:mod:`tests.rank_reports`, kind ``DSGEN_MP``)::

    {"rank": 0, "world_size": 2, ...}

Exit status: 0 on success; 3 if a loss is not finite, the engine did not take the expected number of
steps, or the parallel groups are not what the data layout assumed; anything else is an uncaught
exception (DeepSpeed's own errors end up in the log the oracle returns).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    from tests.tiny_models import hf_config, model_classes, parse_case_args
    from tests.worker_state import reset_process_state, run_cases
except ModuleNotFoundError:  # torchrun runs a worker as a script: tests/, not the checkout, is on sys.path
    from tiny_models import hf_config, model_classes, parse_case_args  # type: ignore[no-redef]
    from worker_state import reset_process_state, run_cases  # type: ignore[no-redef]

if TYPE_CHECKING:
    import torch

# Before deepspeed is imported: the accelerator is chosen at import time.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

RECORD_KIND = "DSGEN_MP"
EXIT_BAD_TRAINING = 3
WORKER = Path(__file__).resolve()

#: Parameter kinds, by name (first match wins). "linear" is every other weight: the attention and
#: dense MLP projections, the ones AutoTP shards.
KINDS = ("embedding", "lm_head", "experts", "router", "norm", "linear")


def param_kind(name: str) -> str:
    """The kind of a parameter, from its name (before or after AutoTP / AutoEP replacement)."""
    if "embed_tokens" in name:
        return "embedding"
    if name.startswith("lm_head"):
        return "lm_head"
    if ".experts." in name:
        return "experts"
    if ".mlp.gate." in name or ".router." in name:  # HF's router is mlp.gate; AutoEP's mlp.router.gate
        return "router"
    if "norm" in name:
        return "norm"
    return "linear"


def build_reference(case: dict[str, Any]) -> Any:
    """The unsharded model with the case's seed, fp32, plain PyTorch: the same weights on every rank."""
    import torch

    _, model_cls = model_classes(case["model"])
    torch.manual_seed(int(case.get("seed", 1234)))
    model = model_cls(hf_config(case))
    model.train()
    return model


def _load_like_trainer(
    case: dict[str, Any], reference: Any, tmp: Path, ds_config: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The model DeepSpeed trains, with the reference's weights, loaded as a Trainer script loads it.

    The weights are saved (every rank its own copy) and read back with ``from_pretrained``; the caller
    keeps an ``HfDeepSpeedConfig`` of ``ds_config`` alive (as ``TrainingArguments`` does), so under ZeRO-3
    transformers builds the model inside ``deepspeed.zero.Init`` and loads each partition. With
    ``"loader": "zero_init"``, or when ``from_pretrained`` raises ``NotImplementedError`` and the case
    has ``"zero_init_fallback": true`` (recorded as ``from_pretrained_error``), the model is built inside
    ``deepspeed.zero.Init(config_dict_or_path=ds_config)`` and each module's weights are loaded with
    ``GatheredParameters(modifier_rank=0)``, what ``_load_state_dict_into_zero3_model`` does.
    """
    from safetensors.torch import save_file

    _, model_cls = model_classes(case["model"])
    info: dict[str, Any] = {"loader": case.get("loader", "from_pretrained")}
    if info["loader"] == "from_pretrained":
        path = tmp / f"weights_rank{os.environ.get('RANK', '0')}"
        path.mkdir(parents=True, exist_ok=True)
        reference.config.save_pretrained(path)
        state = {k: v.contiguous() for k, v in reference.state_dict().items()}
        save_file(state, path / "model.safetensors", {"format": "pt"})
        try:
            model = model_cls.from_pretrained(path, dtype="float32", device_map=None)
        except NotImplementedError as exc:
            if not case.get("zero_init_fallback"):
                raise
            info["from_pretrained_error"] = _describe_error(exc)
            info["loader"] = "zero_init"
            gc.collect()
        else:
            model.train()
            return model, info
    if info["loader"] != "zero_init":
        raise ValueError(f"unknown loader {info['loader']!r}")
    model = _build_zero_init(case, reference, ds_config)
    model.train()
    return model, info


def _build_zero_init(case: dict[str, Any], reference: Any, ds_config: dict[str, Any]) -> Any:
    import deepspeed
    import torch
    from deepspeed import comm as dist

    _, model_cls = model_classes(case["model"])
    stage3 = int(ds_config.get("zero_optimization", {}).get("stage", 0)) == 3
    init = deepspeed.zero.Init(config_dict_or_path=ds_config) if stage3 else contextlib.nullcontext()
    with init:
        model = model_cls(hf_config(case))
    source = dict(reference.named_parameters())
    with torch.no_grad():
        for name, param in model.named_parameters():
            gather = deepspeed.zero.GatheredParameters([param], modifier_rank=0) if stage3 else contextlib.nullcontext()
            with gather:
                if not stage3 or dist.get_rank() == 0:
                    param.copy_(source[name])
    return model


def _describe_error(exc: BaseException) -> dict[str, Any]:
    """An exception as the docs quote it: type, message, and the innermost frame (file in its package)."""
    import traceback

    frame = traceback.extract_tb(exc.__traceback__)[-1]
    filename = frame.filename.split("site-packages/")[-1]
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "where": f"{filename}:{frame.lineno} ({frame.name})",
        "line": (frame.line or "").strip(),
    }


def _shim_can_record_registry() -> None:
    """Let ``_CanRecordRegistry.get`` take a string key and a default, as ``dict.get`` does."""
    from transformers.utils import output_capturing

    registry_cls = output_capturing._CanRecordRegistry
    original = registry_cls.get
    if not _REGISTRY_GET:
        _REGISTRY_GET.append(original)

    def get(self: Any, key: Any, *default: Any) -> Any:
        if isinstance(key, str):
            return dict.get(self, key, *default)
        return original(self, key)

    setattr(registry_cls, "get", get)  # noqa: B010 (a method replaced on the class)


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What HF Trainer hands ``deepspeed.initialize`` when the DeepSpeed config has an ``optimizer`` block:
    ``transformers.integrations.deepspeed.deepspeed_init`` wraps the trainable parameters, a flat list,
    in accelerate's ``DummyOptim`` and ``Accelerator._prepare_deepspeed`` passes ``optimizer.params``.
    (Trainer's named-less weight-decay groups would fail under AutoEP: DeepSpeed's
    ``split_params_into_different_moe_groups_for_optimizer`` reads ``param_group['name']``.)"""
    return [p for p in model.parameters() if p.requires_grad]


def _batch(case: dict[str, Any], dp_rank: int, index: int, rows: int, vocab: int) -> torch.Tensor:
    """Micro-batch ``index`` of data-parallel rank ``dp_rank``: identical on every TP peer."""
    import torch

    gen = torch.Generator().manual_seed(int(case.get("seed", 1234)) + 1000 * dp_rank + index)
    return torch.randint(0, vocab, (rows, int(case["seq_len"])), generator=gen)


# ---- measurements -----------------------------------------------------------------------------


def _is_tp_layer(module: Any) -> bool:
    from deepspeed.module_inject.layers import TensorParallel_Layer

    return isinstance(module, TensorParallel_Layer)


def _param_census(model: torch.nn.Module) -> dict[str, Any]:
    """Per kind: elements this rank holds (the ZeRO-3 partition, else the tensor), elements of its
    TP/EP-local tensor before ZeRO-3 partitioning, tensor count; and every parameter's local shape."""
    modules = dict(model.named_modules())
    by_kind: dict[str, dict[str, int]] = {k: {"held": 0, "local": 0, "tensors": 0} for k in KINDS}
    shapes: dict[str, list[int]] = {}
    tp_sharded = {"held": 0, "local": 0}
    held_total = local_total = 0
    for name, param in model.named_parameters():
        ds_tensor = getattr(param, "ds_tensor", None)
        held = int(ds_tensor.numel()) if ds_tensor is not None else int(param.numel())
        local = int(getattr(param, "ds_numel", param.numel()))
        shape = [int(s) for s in getattr(param, "ds_shape", param.shape)]
        entry = by_kind[param_kind(name)]
        entry["held"] += held
        entry["local"] += local
        entry["tensors"] += 1
        shapes[name] = shape
        held_total += held
        local_total += local
        owner = modules.get(name.rpartition(".")[0])
        if owner is not None and _is_tp_layer(owner):
            tp_sharded["held"] += held
            tp_sharded["local"] += local
    return {
        "param_elements": held_total,
        "param_local_elements": local_total,
        "params_by_kind": by_kind,
        "tp_layer_params": tp_sharded,
        "param_shapes": shapes,
        "tp_layer_modules": sorted(
            f"{name}:{type(m).__name__}" for name, m in model.named_modules() if _is_tp_layer(m)
        ),
    }


def _replicated_checksums(model: torch.nn.Module, zero3: bool) -> dict[str, list[float]]:
    """Sum and sum of squares of every norm, embedding and router weight (and of any head AutoTP left
    whole), gathered under ZeRO-3: TP peers must hold the same values after the steps."""
    import deepspeed
    import torch

    modules = dict(model.named_modules())
    chosen = [
        (name, p)
        for name, p in model.named_parameters()
        if param_kind(name) in ("norm", "embedding", "router")
        or (param_kind(name) == "lm_head" and not _is_tp_layer(modules.get(name.rpartition(".")[0])))
    ]
    gather = (
        deepspeed.zero.GatheredParameters([p for _, p in chosen], modifier_rank=None)
        if zero3
        else contextlib.nullcontext()
    )
    out: dict[str, list[float]] = {}
    with gather, torch.no_grad():
        for name, param in chosen:
            values = param.detach().double()
            out[name] = [float(values.sum()), float((values * values).sum())]
    return out


def _groups_record(engine: Any) -> dict[str, Any]:
    """The process groups DeepSpeed built: TP, DP (the ZeRO group of dense parameters), EP, EDP."""
    from deepspeed import comm as dist
    from deepspeed.utils import groups

    out: dict[str, Any] = {"dp_world_size": int(engine.dp_world_size)}
    with contextlib.suppress(AssertionError, AttributeError):
        out["tp_world_size"] = int(groups.get_tensor_model_parallel_world_size())
        out["tp_rank"] = int(groups.get_tensor_model_parallel_rank())
    out["dp_rank"] = int(dist.get_rank(group=groups._get_data_parallel_group()))
    out["seq_dp_world_size"] = int(engine.seq_dp_world_size)
    ep: dict[str, Any] = {}
    for name, group in getattr(groups, "_EXPERT_PARALLEL_GROUP", {}).items():
        ep[name] = {"ep_world_size": int(dist.get_world_size(group=group)), "ep_rank": int(dist.get_rank(group=group))}
    for name, group in getattr(groups, "_EXPERT_DATA_PARALLEL_GROUP", {}).items():
        ep.setdefault(name, {})["edp_world_size"] = int(dist.get_world_size(group=group))
        ep[name]["edp_ranks"] = [int(r) for r in groups._EXPERT_DATA_PARALLEL_GROUP_RANKS.get(name, [])]
    if ep:
        out["expert_groups"] = ep
    return out


def _zero_groups(engine: Any) -> dict[str, Any]:
    """Per optimizer param group: whether it is an MoE group, how many ranks ZeRO splits it over, and
    the elements of this rank's fp32 partition (ZeRO-1/2) or of each parameter's partition (ZeRO-3)."""
    from deepspeed import comm as dist

    opt = engine.optimizer
    groups_out: list[dict[str, Any]] = []
    if hasattr(opt, "single_partition_of_fp32_groups"):  # ZeRO-1/2
        for index, group in enumerate(opt.optimizer.param_groups):
            groups_out.append(
                {
                    "moe": bool(group.get("moe", False)),
                    "name": group.get("name"),
                    "partition_count": int(opt.partition_count[index]),
                    "bit16_flat_elements": int(opt.bit16_groups_flat[index].numel()),
                    "fp32_partition_elements": int(opt.single_partition_of_fp32_groups[index].numel()),
                }
            )
    elif hasattr(opt, "fp32_partitioned_groups_flat"):  # ZeRO-3
        for index, group in enumerate(opt.fp16_groups):
            process_groups = {id(getattr(p, "ds_process_group", None)): p.ds_process_group for p in group}
            sizes = sorted({int(dist.get_world_size(group=g)) for g in process_groups.values()})
            groups_out.append(
                {
                    "partition_world_sizes": sizes,
                    "fp16_partition_elements": int(opt.fp16_partitioned_groups_flat[index].numel()),
                    "fp32_partition_elements": int(opt.fp32_partitioned_groups_flat[index].numel()),
                }
            )
    return {"zero_groups": groups_out}


def _probe_batch_world_dp(model: torch.nn.Module, ds_config: dict[str, Any], dp_width: int) -> dict[str, Any] | None:
    """``deepspeed.initialize`` with ``train_batch_size`` written over the data-parallel ranks only
    (micro x accumulation x world // TP): the error it raises (it fails in ``DeepSpeedConfig``, before
    the engine touches the model), or None if it was accepted (the model is sharded then, and the
    measurements that follow are void)."""
    import deepspeed

    micro = int(ds_config["train_micro_batch_size_per_gpu"])
    accumulation = int(ds_config.get("gradient_accumulation_steps", 1))
    dp_config = {**ds_config, "train_batch_size": micro * accumulation * dp_width}
    try:
        deepspeed.initialize(model=model, model_parameters=_trainable(model), config=dp_config)
    except AssertionError as exc:
        return _describe_error(exc)
    return None


def _initialize(
    case: dict[str, Any],
    model: torch.nn.Module,
    reference: Any,
    tmp: Path,
    ds_config: dict[str, Any],
    record: dict[str, Any],
) -> Any:
    """``deepspeed.initialize`` over the trainable parameters; the engine.

    ``can_record_registry_shim``: False = as installed; True = shim first; "retry" = as installed,
    and if AutoEP fails on ``_CanRecordRegistry.get`` the error goes to ``record["autoep_error"]``
    (None when it did not fail) and a freshly loaded model is initialized with the shim.
    """
    import deepspeed

    shim = case.get("can_record_registry_shim", False)
    if shim is True:
        _shim_can_record_registry()
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=_trainable(model), config=ds_config)
    except TypeError as exc:
        if shim != "retry" or "_CanRecordRegistry.get()" not in str(exc):
            raise
        record["autoep_error"] = _describe_error(exc)
    else:
        if shim == "retry":
            record["autoep_error"] = None
        return engine
    del model  # partly replaced by AutoEP: start over from the saved weights
    gc.collect()
    fresh, _ = _load_like_trainer(case, reference, tmp, ds_config)
    _shim_can_record_registry()
    engine, _, _, _ = deepspeed.initialize(model=fresh, model_parameters=_trainable(fresh), config=ds_config)
    return engine


# ---- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_case_args(argv, __doc__.splitlines()[0])
    given = json.loads(args.case.read_text())
    cases: list[dict[str, Any]] = given if isinstance(given, list) else [given]
    sys.path.insert(0, str(WORKER.parent))  # torchrun runs this file as a script: finetune_worker is beside it
    sys.path.insert(0, str(WORKER.parent.parent))  # and tests.rank_reports in the checkout

    def prepare() -> None:
        for case in cases:
            model_classes(case["model"])

    # a list of cases tags each record with its place (tests/ds_oracle.measure_cases)
    tagged = isinstance(given, list)
    return run_cases(
        len(cases), lambda i: _run(cases[i], args.case.parent, i if tagged else None), _reset_process_state, prepare
    )


#: transformers' ``_CanRecordRegistry.get`` as installed, kept by the first shim (see the module docstring)
_REGISTRY_GET: list[Any] = []


def _reset_process_state() -> None:
    """Undo what a case leaves behind, so that the next case in the same processes starts as a
    fresh launch would (``bench/batched_launch_identity.py`` compares the records both ways):
    ZeRO-3's ``linear`` override (``tests/worker_state.py``); the arguments ``deepspeed.tp_model_init``
    records for the next ``initialize`` to merge into its config (``runtime/tensor_parallel/init_utils.py``
    ``_TP_MODEL_INIT_ARGS``, kept for the rest of the process); and the registry shim, so that a later
    AutoEP case meets transformers' ``get`` as installed and records its error again.

    What it cannot undo: the tensor-parallel process groups (``deepspeed.utils.groups``, built once per
    process), so cases with and without AutoTP never share a launch (``tests/mp_cases.py``)."""
    from deepspeed.runtime.tensor_parallel import init_utils

    reset_process_state()
    init_utils._TP_MODEL_INIT_ARGS = None
    if _REGISTRY_GET:
        from transformers.utils import output_capturing

        setattr(output_capturing._CanRecordRegistry, "get", _REGISTRY_GET[0])  # noqa: B010


def _run(case: dict[str, Any], tmp: Path, case_index: int | None = None) -> int:
    import deepspeed
    import torch
    import transformers
    from deepspeed import comm as dist
    from deepspeed.utils import groups
    from finetune_worker import SavedActivations, _gradient_holdings, _optimizer_state_bytes
    from transformers.integrations import HfDeepSpeedConfig

    timings: dict[str, float] = {}
    started = time.monotonic()
    rank, world = dist.get_rank(), dist.get_world_size()
    ds_config: dict[str, Any] = case["ds_config"]
    stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
    tp = int(ds_config.get("tensor_parallel", {}).get("autotp_size", 0) or 1)
    dp_rank = rank // tp  # DeepSpeed's (data_parallel, tensor_parallel) mesh; checked below
    micro = int(ds_config["train_micro_batch_size_per_gpu"])
    accumulation = int(ds_config.get("gradient_accumulation_steps", 1))

    record: dict[str, Any] = {
        **({} if case_index is None else {"case_index": case_index}),
        "rank": rank,
        "world_size": world,
        "case": {k: v for k, v in case.items() if k != "ds_config"},
        "ds_config": ds_config,
        "zero_stage": stage,
        "versions": {
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "transformers": transformers.__version__,
        },
        "can_record_registry_shim": case.get("can_record_registry_shim", False),
    }

    # -- the unsharded reference: its census and its loss on this rank's first micro-batch --
    reference = build_reference(case)
    vocab = int(reference.config.vocab_size)
    first_ids = _batch(case, dp_rank, 0, micro, vocab)
    with torch.no_grad():
        record["reference_loss"] = float(reference(input_ids=first_ids, labels=first_ids).loss)
    reference_census = _param_census(reference)
    record["reference_params_by_kind"] = {k: v["local"] for k, v in reference_census["params_by_kind"].items()}
    record["reference_param_elements"] = reference_census["param_elements"]
    record["reference_param_shapes"] = reference_census["param_shapes"]

    # -- the model DeepSpeed trains, loaded the way a Trainer script loads it --
    t0 = time.monotonic()
    hf_ds_config = HfDeepSpeedConfig(ds_config)  # alive until the record is written, as TrainingArguments keeps it
    model, load_info = _load_like_trainer(case, reference, tmp, ds_config)
    record.update(load_info)
    timings["load_s"] = time.monotonic() - t0
    record["built_under_zero_init"] = any(hasattr(p, "ds_id") for p in model.parameters())

    if case.get("probe_batch_world_dp") and tp > 1:
        record["batch_world_dp_error"] = _probe_batch_world_dp(model, ds_config, world // tp)

    if case.get("tp_model_init"):
        dtype = torch.bfloat16 if case.get("dtype") == "bf16" else torch.float32
        model = deepspeed.tp_model_init(model, tp_size=tp, dtype=dtype, config=ds_config)
        record["tp_model_init_sharded"] = any(_is_tp_layer(m) for m in model.modules())

    t0 = time.monotonic()
    engine = _initialize(case, model, reference, tmp, ds_config, record)
    timings["init_s"] = time.monotonic() - t0
    del reference
    gc.collect()
    record["after_init"] = _param_census(engine.module)
    record["groups"] = _groups_record(engine)
    record["dp_rank_assumed"] = dp_rank
    if tp > 1 and (
        record["groups"].get("tp_world_size") != tp or dist.get_rank(group=groups._get_data_parallel_group()) != dp_rank
    ):
        print(f"mp_worker: rank {rank}: groups {record['groups']} do not match dp_rank={dp_rank}", file=sys.stderr)
        return EXIT_BAD_TRAINING

    steps = int(case.get("steps", 2))
    losses: list[list[float]] = []
    grad_records: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for step in range(1, steps + 1):
        step_losses: list[float] = []
        for index in range(accumulation):
            measure = step == 1 and index == 0
            ids = _batch(case, dp_rank, (step - 1) * accumulation + index, micro, vocab).to(engine.device)
            counter = SavedActivations(engine.module) if measure else None
            with counter.recording() if counter else contextlib.nullcontext():
                loss = engine(input_ids=ids, labels=ids).loss
            if counter:
                record["saved_activation_bytes"] = counter.snapshot()
                del counter
            engine.backward(loss)
            if engine.is_gradient_accumulation_boundary():
                grad_records.append(_gradient_holdings(engine))
            engine.step()
            step_losses.append(float(loss.detach().float()))
        losses.append(step_losses)
        if not all(math.isfinite(x) for x in step_losses):
            print(f"mp_worker: rank {rank} step {step}: non-finite loss {step_losses}", file=sys.stderr)
            return EXIT_BAD_TRAINING
    timings["train_s"] = time.monotonic() - t0
    if engine.global_steps != steps:
        print(f"mp_worker: rank {rank}: global_steps={engine.global_steps}, expected {steps}", file=sys.stderr)
        return EXIT_BAD_TRAINING

    record.update(_param_census(engine.module))
    record["replicated_checksums"] = _replicated_checksums(engine.module, stage == 3)
    record.update(_zero_groups(engine))
    record["fp32_master_elements"] = sum(g["fp32_partition_elements"] for g in record["zero_groups"])
    record["zero_optimizer"] = type(engine.optimizer).__name__
    record.update(_optimizer_state_bytes(engine))
    if grad_records:
        record.update(grad_records[-1])
    record["losses"] = losses
    record["first_loss"] = losses[0][0]
    record["micro_batch"] = micro
    record["gradient_accumulation_steps"] = accumulation
    record["train_batch_size"] = int(engine.train_batch_size())
    record["global_steps"] = engine.global_steps
    timings["total_s"] = time.monotonic() - started
    record["timings"] = {k: round(v, 2) for k, v in timings.items()}
    del hf_ds_config

    from tests import rank_reports

    rank_reports.write(RECORD_KIND, rank, record)  # its own file: stdout lines from several ranks interleave
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
