"""torchrun worker: one real TRL GRPO step (transformers generation) under DeepSpeed, measured per rank.

Launched by :func:`measure_grpo`, one process per rank, on DeepSpeed's CPU accelerator with the
gloo backend. It measures; it predicts nothing. The run is TRL's own ``trl.GRPOTrainer`` with
``use_vllm=False`` (``_generate_single_turn``'s "regular generation path": ``unwrap_model_for_generation``
and ``model.generate`` with the ``GenerationConfig`` the trainer builds), a tiny Llama built from a
transformers config (random weights, nothing downloaded; the sizes of ``tests/tiny_models.py``),
LoRA through ``peft_config``, the DeepSpeed config handed to ``GRPOConfig(deepspeed=...)`` (ZeRO
stage, AdamW from DeepSpeed's ``optimizer`` block), a word-level tokenizer over the model's
vocabulary and made-up prompts of exactly ``prompt_length`` tokens.

Every completion is ``completion_length`` tokens long (``generation_kwargs={"min_new_tokens": ...}``
keeps EOS from being sampled), so nothing is padded: the training forward sees ``micro × (P + C)``
tokens with an all-ones attention mask, as dsgen prices a micro-batch.

Per rank it records:

* generation (``GenerationMixin.generate``, ``Cache.update`` and the logits processors are wrapped
  at class level for the run; TRL's code is not touched): the rows ``generate`` runs, the most bytes the KV cache
  holds at once (every layer's key and value storages, summed after each ``Cache.update``) with
  its token count, the fp32 ``next_token_logits`` the sampler keeps (``GenerationMixin._sample``:
  ``outputs.logits[:, -1].to(copy=True, dtype=torch.float32)``, the tensor the first logits
  processor receives), the model's own last-position logits for reference, whether ``use_cache``
  was on, and under ZeRO-3 the bytes ``GatheredParameters`` materialised for generation;
* training: the bytes autograd saves in the loss forward of the first micro-batch
  (``GRPOTrainer.compute_loss``, counted as ``finetune_worker.SavedActivations`` counts, see
  :func:`_saved_activations_class` for the two differences), the part of it TRL's fused LM head
  saved, and after the step the model states as ``finetune_worker`` reports them (parameter census, ZeRO buffers, Adam
  states).

One record per rank, in the rank's own report file (:mod:`tests.rank_reports`, kind ``DSGEN_GRPO``;
stdout lines from several ranks interleave)::

    {"rank": 0, "world_size": 2, ...}

Exit status: 0 on success; 3 if the step did not run as configured (no generation, no cache, a
loss that is not finite, a step count other than one); anything else is an uncaught exception.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import math
import os
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

try:
    from tests.tiny_models import parse_case_args
except ModuleNotFoundError:  # torchrun runs a worker as a script: tests/, not the checkout, is on sys.path
    from tiny_models import parse_case_args  # type: ignore[no-redef]

# Before deepspeed is imported: the accelerator is chosen at import time.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

RECORD_KIND = "DSGEN_GRPO"
EXIT_BAD_TRAINING = 3
WORKER = Path(__file__).resolve()

DEFAULT_CASE: dict[str, Any] = {
    "model": "llama",
    "dtype": "fp32",
    "method": "lora",
    "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"},
    "zero_stage": 2,
    "micro_batch": 2,  # per_device_train_batch_size: completions per micro-batch
    "gradient_accumulation_steps": 2,  # steps_per_generation defaults to it
    "num_generations": 4,
    "prompt_length": 32,
    "completion_length": 32,
    "gradient_checkpointing": False,
    "seed": 1234,
    "learning_rate": 1e-4,
}


# ---- launcher (imported by the tests; torch is not imported here) ------------------------------


def ds_config_for(case: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config handed to ``GRPOConfig(deepspeed=...)``: the HF integration fills the
    ``auto`` values from the training arguments (batch sizes, AdamW's hyper-parameters, bf16)."""
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": "auto", "weight_decay": "auto", "betas": "auto", "eps": "auto"},
        },
        "zero_optimization": {"stage": int(case["zero_stage"])},
        "bf16": {"enabled": "auto"},
        "gradient_clipping": "auto",
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }


def measure_grpo(case: dict[str, Any], ranks: int = 2, timeout: float = 600) -> list[dict[str, Any]]:
    """Run one GRPO step of ``case`` (missing keys from :data:`DEFAULT_CASE`) on ``ranks`` CPU ranks
    with real TRL and DeepSpeed; one measured record per rank. Launched and read by
    :func:`tests.ds_oracle.measure_case` (which raises ``OracleRunError`` with the log tail)."""
    from tests.ds_oracle import measure_case

    full_case = {**copy.deepcopy(DEFAULT_CASE), **case}
    full_case["ds_config"] = ds_config_for(full_case)
    return measure_case(WORKER, RECORD_KIND, full_case, ranks=ranks, timeout=timeout, what="grpo")


# ---- generation probe ----------------------------------------------------------------------------


def _storage_bytes(tensors: list[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (each storage once, its full size)."""
    storages: dict[int, int] = {}
    for t in tensors:
        if t is None or not hasattr(t, "untyped_storage"):
            continue
        st = t.untyped_storage()
        if st.nbytes():
            storages[st.data_ptr()] = st.nbytes()
    return sum(storages.values())


class GenerationProbe:
    """What ``model.generate`` holds, read through class-level wrappers installed for the run."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._current: dict[str, Any] | None = None
        self._depth = 0

    def _cache_update(self, cache: Any) -> None:
        current = self._current
        if current is None:
            return
        tensors = []
        tokens = 0
        layers = 0
        dtypes = set()
        for layer in getattr(cache, "layers", []):
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if keys is None or not hasattr(keys, "untyped_storage") or keys.numel() == 0:
                continue
            layers += 1
            tensors += [keys, values]
            tokens = max(tokens, int(keys.shape[-2]))
            dtypes.add(str(keys.dtype).removeprefix("torch."))
        held = _storage_bytes(tensors)
        current["cache_updates"] += 1
        if held > current["kv_cache_bytes"]:
            current.update(
                kv_cache_bytes=held,
                kv_cache_tokens=tokens,
                kv_cache_layers=layers,
                kv_cache_rows=int(tensors[0].shape[0]) if tensors else 0,
                kv_cache_dtypes=sorted(dtypes),
            )

    def _scores(self, scores: Any) -> None:
        current = self._current
        if current is None:
            return
        held = int(scores.untyped_storage().nbytes())
        if held > current["sampler_logits_bytes"]:
            current.update(
                sampler_logits_bytes=held,
                sampler_logits_shape=list(scores.shape),
                sampler_logits_dtype=str(scores.dtype).removeprefix("torch."),
            )

    def _head_output(self, output: Any) -> None:
        current = self._current
        if current is not None:
            current["model_logits_bytes"] = max(current["model_logits_bytes"], int(output.untyped_storage().nbytes()))
            current["model_logits_dtype"] = str(output.dtype).removeprefix("torch.")

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        import torch
        from transformers.cache_utils import Cache
        from transformers.generation.logits_process import LogitsProcessor
        from transformers.generation.utils import GenerationMixin

        probe = self
        original_generate = GenerationMixin.generate
        original_update = Cache.update
        original_processors = GenerationMixin._get_logits_processor
        original_prepare_cache = GenerationMixin._prepare_cache_for_generation

        class _Record(LogitsProcessor):
            """First in the list: it sees ``next_token_logits`` itself, before any processor."""

            def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
                probe._scores(scores)
                return scores

        def generate(model: Any, *args: Any, **kwargs: Any) -> Any:
            if probe._depth:
                return original_generate(model, *args, **kwargs)
            inputs = kwargs.get("input_ids", args[0] if args else None)
            config = kwargs.get("generation_config")  # TRL's (GRPOTrainer.__init__, transformers path)
            current: dict[str, Any] = {
                "rows": int(inputs.shape[0]) if inputs is not None else None,
                "prompt_width": int(inputs.shape[1]) if inputs is not None else None,
                "use_cache": None,  # as generate resolved it (_prepare_cache_for_generation)
                "cache_class": None,
                "max_new_tokens": getattr(config, "max_new_tokens", None),
                "cache_updates": 0,
                "kv_cache_bytes": 0,
                "sampler_logits_bytes": 0,
                "model_logits_bytes": 0,
            }
            current.update(_zero3_gathered(model))
            head = model.get_output_embeddings()
            hook = head.register_forward_hook(lambda _m, _i, out: probe._head_output(out))
            probe._current, probe._depth = current, 1
            try:
                out = original_generate(model, *args, **kwargs)
            finally:
                hook.remove()
                probe._current, probe._depth = None, 0
            current["output_width"] = int(out.shape[1]) if hasattr(out, "shape") else None
            probe.calls.append(current)
            return out

        def prepare_cache(model: Any, generation_config: Any, model_kwargs: dict[str, Any], *args: Any) -> Any:
            result = original_prepare_cache(model, generation_config, model_kwargs, *args)
            if probe._current is not None:
                probe._current["use_cache"] = generation_config.use_cache
                probe._current["cache_class"] = type(model_kwargs.get("cache")).__name__
            return result

        def update(cache: Any, *args: Any, **kwargs: Any) -> Any:
            result = original_update(cache, *args, **kwargs)
            probe._cache_update(cache)
            return result

        def processors(model: Any, *args: Any, **kwargs: Any) -> Any:
            processors = original_processors(model, *args, **kwargs)
            if probe._current is not None:
                processors.insert(0, _Record())
            return processors

        mixin: Any = GenerationMixin  # patched for the run, restored after
        cache_class: Any = Cache
        mixin.generate = generate
        cache_class.update = update
        mixin._get_logits_processor = processors
        mixin._prepare_cache_for_generation = prepare_cache
        try:
            yield
        finally:
            mixin.generate = original_generate
            cache_class.update = original_update
            mixin._get_logits_processor = original_processors
            mixin._prepare_cache_for_generation = original_prepare_cache


def _zero3_gathered(model: Any) -> dict[str, Any]:
    """Under ZeRO-3, inside ``unwrap_model_for_generation``'s ``GatheredParameters``: the full bytes
    of every partitioned parameter now materialised, and of those the ones that stay whole anyway
    (``ds_persist``: under the persistence threshold)."""
    materialised = persistent = 0
    zero3 = False
    for param in model.parameters():
        if not hasattr(param, "ds_tensor"):
            continue
        zero3 = True
        held = int(param.data.numel()) * param.element_size()
        materialised += held
        if getattr(param, "ds_persist", False):
            persistent += held
    if not zero3:
        return {}
    return {"zero3_materialised_bytes": materialised, "zero3_persistent_bytes_in_generation": persistent}


# ---- training probe ------------------------------------------------------------------------------


def _saved_activations_class() -> type:
    """``finetune_worker.SavedActivations``, except that a parameter is packed as itself.

    The base class packs ``t.detach()``: a new tensor without the parameter's Python attributes.
    TRL's fused LM head saves the head's weight and, in its backward, reads ``ds_status`` from it
    to gather it under ZeRO-3 (``trl/kernels/chunked_logprob.py`` ``ChunkedLogProbFunction.backward``
    -> ``maybe_gather_lm_head_ctx``), which the detached copy lacks (AttributeError). Parameters are
    left out of the count either way; everything else is packed and counted as the base class does.

    A tensor whose storage is a parameter's when it is packed is left out right there, not by its
    address at the snapshot: under ZeRO-3 a gathered parameter's storage is freed after its module
    runs and the allocator hands the address to a later activation, which the base class's
    address list (``excluded``) would then drop from the count too (a few percent, differing per rank).
    """
    import torch

    from tests.finetune_worker import SavedActivations, _Saved, _tensor_list

    class GrpoSavedActivations(SavedActivations):
        @contextlib.contextmanager
        def recording(self) -> Iterator[None]:
            def pack(t: torch.Tensor) -> Any:
                holder = _Saved(t if isinstance(t, torch.nn.Parameter) else t.detach())
                if t.untyped_storage().data_ptr() not in self._param_ptrs():
                    self.saved.append(weakref.ref(holder))  # a parameter's storage now: never counted
                return holder

            def unpack(holder: Any) -> torch.Tensor:
                return holder.tensor

            wrapped = []
            module: Any
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

    return GrpoSavedActivations


@contextlib.contextmanager
def _fused_head_window(counter: Any) -> Iterator[list[int]]:
    """Where, in ``counter``'s pack order, TRL's fused LM head saved its tensors: GRPO's loss forward
    runs the head as ``ChunkedLogProbFunction`` (``trl/trainer/utils.py`` ``add_fused_lm_head``),
    whose ``save_for_backward`` packs them inside ``apply``. Yields ``[start, end]`` (filled in)."""
    import trl.trainer.utils

    trl_utils: Any = trl.trainer.utils
    original = trl_utils._ChunkedLogProbFunction
    window = [0, 0]

    class _Windowed:
        @staticmethod
        def apply(*args: Any) -> Any:
            window[0] = len(counter.saved)
            out = original.apply(*args)
            window[1] = len(counter.saved)
            return out

    trl_utils._ChunkedLogProbFunction = _Windowed
    try:
        yield window
    finally:
        trl_utils._ChunkedLogProbFunction = original


def _live(counter: Any, start: int = 0, end: int | None = None) -> list[Any]:
    gc.collect()
    excluded = counter.excluded | counter._param_ptrs()
    tensors = [holder.tensor for ref in counter.saved[start:end] if (holder := ref()) is not None]
    return [t for t in tensors if t.untyped_storage().data_ptr() not in excluded]


def _saved_between(counter: Any, start: int, end: int) -> int:
    """Bytes of the distinct live storages packed between ``start`` and ``end``."""
    return _storage_bytes(_live(counter, start, end))


def _breakdown(counter: Any, top: int = 12) -> list[dict[str, Any]]:
    """The live saved storages grouped by (shape, dtype), largest first (for reading a mismatch)."""
    seen: set[int] = set()
    groups: dict[tuple[str, str], list[int]] = {}
    for t in [*_live(counter), *counter.held_by_checkpoint]:
        st = t.untyped_storage()
        if st.data_ptr() in seen or not st.nbytes():
            continue
        seen.add(st.data_ptr())
        key = ("x".join(map(str, t.shape)), str(t.dtype).removeprefix("torch."))
        entry = groups.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += int(st.nbytes())
    rows: list[dict[str, Any]] = [
        {"shape": k[0], "dtype": k[1], "count": v[0], "bytes": v[1]} for k, v in groups.items()
    ]
    return sorted(rows, key=lambda r: -r["bytes"])[:top]


# ---- the run -------------------------------------------------------------------------------------


def _tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over the model's vocabulary: ``t<i>`` is token ``i`` for i >= 2, and
    0 and 1 are padding and EOS. Nothing is added to a text, so a prompt of n words is n tokens.
    (The special tokens get names no word contains: an added token also matches inside a word.)"""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, **{f"t{i}": i for i in range(2, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<pad>")


def _reward(completions: list[str], **_: Any) -> list[float]:
    """A trivial reward with spread within a group: the completion's tokens with an even id."""
    return [float(sum(int(word[1:]) % 2 == 0 for word in c.split() if word[1:].isdigit())) for c in completions]


def main(argv: list[str] | None = None) -> int:
    args = parse_case_args(argv, __doc__.splitlines()[0])
    case: dict[str, Any] = json.loads(args.case.read_text())
    sys.path.insert(0, str(WORKER.parent.parent))  # torchrun runs this file as a script: tests.* from the checkout
    import torch.distributed as dist

    try:
        return _run(case, args.case.parent)
    finally:
        gc.collect()  # see tests/ds_train_worker.py: free engines while the group is alive
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(case: dict[str, Any], tmp: Path) -> int:
    import deepspeed
    import peft
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from peft import LoraConfig

    from tests.finetune_worker import _optimizer_state_bytes, _param_census, _zero_buffers
    from tests.tiny_models import TINY_MODELS, model_classes

    started = time.monotonic()
    prompt_len, completion_len = int(case["prompt_length"]), int(case["completion_length"])
    lora = case["lora"]
    config_cls, model_cls = model_classes(case["model"])
    grpo_args = trl.GRPOConfig(
        output_dir=str(tmp / "out"),
        max_steps=1,
        per_device_train_batch_size=int(case["micro_batch"]),
        gradient_accumulation_steps=int(case["gradient_accumulation_steps"]),
        num_generations=int(case["num_generations"]),
        max_completion_length=completion_len,
        generation_kwargs={"min_new_tokens": completion_len},  # no EOS: every completion full length
        use_vllm=False,
        learning_rate=float(case["learning_rate"]),
        weight_decay=0.0,
        max_grad_norm=0.0,
        bf16=case["dtype"] == "bf16",
        gradient_checkpointing=bool(case["gradient_checkpointing"]),
        deepspeed=case["ds_config"],
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=int(case["seed"]),
        data_seed=int(case["seed"]),
    )  # before the model: under ZeRO-3 it is then built inside zero.Init, as from_pretrained would be
    rank, world = grpo_args.process_index, grpo_args.world_size
    torch.manual_seed(int(case["seed"]))
    hf_config = config_cls(**TINY_MODELS[case["model"]], max_position_embeddings=max(prompt_len + completion_len, 128))
    model = model_cls(hf_config)
    tokenizer = _tokenizer(hf_config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        " ".join(f"t{int(i)}" for i in torch.randint(2, hf_config.vocab_size, (prompt_len,), generator=gen))
        for _ in range(8 * max(1, int(grpo_args.generation_batch_size or 0) // int(grpo_args.num_generations or 1)))
    ]
    peft_config = LoraConfig(
        r=int(lora["r"]),
        lora_alpha=int(lora["lora_alpha"]),
        lora_dropout=float(lora["lora_dropout"]),
        target_modules=lora["target_modules"],
        task_type="CAUSAL_LM",
    )

    measured: dict[str, Any] = {}
    saved_activations = _saved_activations_class()
    losses: list[float] = []

    class MeasuredGRPOTrainer(trl.GRPOTrainer):
        """GRPOTrainer with the first micro-batch's loss forward counted (nothing else changes)."""

        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            if "saved_activation_bytes" in measured:
                loss = super().compute_loss(model, inputs, *args, **kwargs)
            else:
                counter = saved_activations(model)
                with counter.recording(), _fused_head_window(counter) as window:
                    loss = super().compute_loss(model, inputs, *args, **kwargs)
                measured["saved_activation_bytes"] = counter.snapshot()
                measured["saved_by_fused_lm_head_bytes"] = _saved_between(counter, *window)
                measured["saved_activation_breakdown"] = _breakdown(counter)
                measured["activation_rows"] = int(inputs["prompt_ids"].shape[0])
                measured["activation_prompt_width"] = int(inputs["prompt_ids"].shape[1])
                measured["activation_completion_width"] = int(inputs["completion_ids"].shape[1])
                measured["attention_mask_all_ones"] = bool(
                    inputs["prompt_mask"].all().item() and inputs["completion_mask"].all().item()
                )
                del counter
            losses.append(float(loss.detach().float()))
            return loss

    probe = GenerationProbe()
    with probe.installed():
        trainer = MeasuredGRPOTrainer(
            model=model,
            reward_funcs=cast(Any, _reward),
            args=grpo_args,
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=tokenizer,
            peft_config=peft_config,
        )
        t0 = time.monotonic()
        trainer.train()
        train_s = time.monotonic() - t0

    engine: Any = trainer.model_wrapped
    record: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "case": {k: v for k, v in case.items() if k != "ds_config"},
        "zero_stage": int(engine.zero_optimization_stage()),
        "versions": {
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "trl": trl.__version__,
        },
        "micro_batch": int(engine.train_micro_batch_size_per_gpu()),
        "gradient_accumulation_steps": int(engine.gradient_accumulation_steps()),
        "steps_per_generation": int(grpo_args.steps_per_generation or 0),
        "generation_batch_size": int(grpo_args.generation_batch_size or 0),
        "global_steps": int(engine.global_steps),
        "generate_calls": probe.calls,
        "losses": losses,
        **measured,
    }
    record.update(_param_census(engine.module))
    record.update(_zero_buffers(engine))
    record.update(_optimizer_state_bytes(engine))
    record["timings"] = {"train_s": round(train_s, 2), "total_s": round(time.monotonic() - started, 2)}

    problems = []
    if not probe.calls or not all(c["use_cache"] is True and c["cache_updates"] for c in probe.calls):
        problems.append(f"generation did not run with a KV cache: {probe.calls}")
    if not losses or not all(math.isfinite(x) for x in losses):
        problems.append(f"losses {losses}")
    if engine.global_steps != 1:
        problems.append(f"global_steps={engine.global_steps}, expected 1")
    for problem in problems:
        print(f"grpo_worker: rank {rank}: {problem}", file=sys.stderr)

    from tests import rank_reports

    rank_reports.write(RECORD_KIND, rank, record)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()  # see tests/hf_trainer_script.py: tear gloo down while Python is whole
    return EXIT_BAD_TRAINING if problems else 0


if __name__ == "__main__":
    sys.exit(main())
