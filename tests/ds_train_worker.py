"""torchrun worker: train a tiny Llama for a few optimizer steps under a given DeepSpeed config.

Launched by :func:`tests.ds_oracle.train_cases`, one process per rank, on DeepSpeed's CPU
accelerator with the gloo backend. It is the end-to-end half of the oracle: parsing a config
with ``DeepSpeedConfig`` proves the keys and the batch arithmetic are accepted, but only
``deepspeed.initialize`` plus real ``backward``/``step`` calls prove that the ZeRO stage, the
precision, the optimizer block and the offload settings actually work together.

The worker mirrors what HF Trainer does with a config (``zero.Init`` for ZeRO-3, the optimizer
built by DeepSpeed from the config's ``optimizer`` block, the model cast by DeepSpeed rather than
by us) so that a config accepted here is accepted for the reason a user's run would accept it.

Output protocol (rank 0 only, through its own file, see :mod:`tests.rank_reports`; read by
``ds_oracle``): one ``step`` record per optimizer step, ``{"step": <n>, "loss": <float>}``, and one
``done`` record with what the engine ran (ZeRO stage, optimizer class, parameter dtype, ...), written
once every rank has finished the case. Given ``--cases``, the worker runs each in turn in the same
processes and tags every record with its ``case_index``; a case that fails ends the launch.

Exit status: 0 on success; 3 if a loss is not finite or the engine did not take the expected
number of optimizer steps; 4 if the config asks for something the CPU accelerator cannot do
(fp16); anything else is an uncaught exception, normally DeepSpeed refusing the config.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Must be set before deepspeed is imported: the accelerator is chosen at import time, and on a
# machine with a GPU (a developer laptop) the oracle must still run the CPU code paths CI runs.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

STEP_REPORT = "step"  # keep in sync with ds_oracle.STEP_REPORT / DONE_REPORT
DONE_REPORT = "done"
EXIT_BAD_TRAINING = 3
EXIT_UNSUPPORTED = 4

# Tiny on purpose: the oracle checks that DeepSpeed accepts and runs the config, not that the
# model learns. 2 layers x hidden 64 keeps a step at tens of milliseconds on two CPU cores while
# still having every module kind (embeddings, attention, MLP, norms, untied LM head) that ZeRO
# partitions and that activation checkpointing wraps.
TINY_MODELS: dict[str, dict[str, Any]] = {
    "tiny-llama": {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="DeepSpeed JSON config file (one case)")
    parser.add_argument(
        "--cases",
        type=Path,
        help="a JSON list of cases, run in turn in the same processes, each record tagged with its "
        "case_index; each case names its config_path and may set steps, model, seq_len, seed, "
        "client_optimizer and activation_checkpointing (the options below)",
    )
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps to run")
    parser.add_argument("--model", choices=sorted(TINY_MODELS), default="tiny-llama")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--client-optimizer",
        choices=["adafactor"],
        help="build this optimizer in the script and pass it to deepspeed.initialize (the config has no "
        "optimizer block), as dsgen tells users to for client optimizers",
    )
    parser.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="enable HF activation (gradient) checkpointing on the model, as Trainer does",
    )
    args = parser.parse_args(argv)
    if (args.config is None) == (args.cases is None):
        parser.error("give one of --config and --cases")
    return args


def _cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The cases to run: ``--cases``' list, or the one case the other options describe."""
    if args.cases is not None:
        cases: list[dict[str, Any]] = json.loads(args.cases.read_text())
        return cases
    return [
        {
            "config_path": str(args.config),
            "steps": args.steps,
            "model": args.model,
            "seq_len": args.seq_len,
            "seed": args.seed,
            "client_optimizer": args.client_optimizer,
            "activation_checkpointing": args.activation_checkpointing,
        }
    ]


def _zero_stage(config: dict[str, Any]) -> int:
    """The ZeRO stage as DeepSpeed reads it (e.g. ``"auto"`` silently means 0, ``"3"`` means 3)."""
    from deepspeed.runtime.zero.config import get_zero_config

    return int(get_zero_config(config).stage)


def _import_model_classes() -> tuple[type, type]:
    """Import the model classes up front, outside any ``zero.Init`` context.

    ``zero.Init`` patches ``torch.Tensor.__new__``; transformers imports lazily and its modeling
    modules pull in ``torch._dynamo``, whose import-time signature check of ``Tensor.__new__``
    then fails (TypeError "Signature mismatch ... tensor_pynew"). Real HF code has always imported
    transformers before entering ``zero.Init``, so importing first is faithful, not a workaround.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaConfig, LlamaForCausalLM


def _build_model(name: str, seq_len: int, activation_checkpointing: bool) -> torch.nn.Module:
    LlamaConfig, LlamaForCausalLM = _import_model_classes()
    cfg = LlamaConfig(**TINY_MODELS[name], max_position_embeddings=max(seq_len, 64), use_cache=False)
    model = LlamaForCausalLM(cfg)
    if activation_checkpointing:
        # transformers 5 renamed the API and deprecated the old name; 4.x only has the old one.
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)()
        if not any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
            raise RuntimeError("activation checkpointing was requested but no module has it enabled")
    model.train()
    return model


def _micro_batch(
    gen: torch.Generator, micro: int, seq_len: int, vocab: int, device: torch.device
) -> dict[str, torch.Tensor]:
    import torch

    ids = torch.randint(0, vocab, (micro, seq_len), generator=gen)
    return {"input_ids": ids.to(device), "labels": ids.to(device)}


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = _parse_args(argv)
    cases = _cases(args)
    configs = [json.loads(Path(case["config_path"]).read_text()) for case in cases]

    # DeepSpeed's own parser decides whether fp16 is on ("auto", "yes", 1 ... as pydantic reads them).
    from deepspeed.runtime.precision_config import get_float16_config

    if any(get_float16_config(config).enabled for config in configs):
        # DeepSpeed itself refuses fp16 on CPUs without oneDNN fp16 kernels ("ValueError: Type
        # fp16 is not supported on your device.", engine._do_sanity_check) and would try it on
        # AVX512-FP16/AMX CPUs. Refusing up front keeps the oracle's answer the same on every CI
        # machine and says why, before any process group or model is set up.
        print(
            "ds_train_worker: fp16.enabled is true, but the CPU oracle cannot train in fp16 "
            "(DeepSpeed's CPU accelerator has no general fp16 training support); check fp16 "
            "configs with ds_oracle.parse_with_deepspeed only.",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_UNSUPPORTED

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: tests.* from the checkout
    from tests.worker_state import run_cases

    clock = [started, started]  # (started, imported) of the case to come: a later case's starts when it does

    def prepare() -> None:
        _import_model_classes()
        clock[1] = time.monotonic()

    def train(index: int) -> int:
        status = _train(cases[index], configs[index], *clock, index if args.cases is not None else None)
        clock[:] = [time.monotonic()] * 2
        return status

    return run_cases(len(cases), train, prepare=prepare)


def _train(
    case: dict[str, Any], config: dict[str, Any], started: float, imported: float, case_index: int | None
) -> int:
    """Train one case; its records carry ``case_index`` when the worker was given a list."""
    import deepspeed
    import torch
    from deepspeed import comm as dist

    from tests import rank_reports

    rank = dist.get_rank()
    tag = {} if case_index is None else {"case_index": case_index}
    steps, model_name, seq_len = (
        int(case.get("steps", 2)),
        case.get("model", "tiny-llama"),
        int(case.get("seq_len", 32)),
    )
    seed, checkpointing = int(case.get("seed", 1234)), bool(case.get("activation_checkpointing", False))
    torch.manual_seed(seed)  # same initial weights on every rank, as with a loaded checkpoint

    stage = _zero_stage(config)
    if stage == 3:
        # As HF does for ZeRO-3: build the model inside zero.Init so parameters are partitioned
        # (and cast to the config's dtype) at construction instead of being materialised whole.
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = _build_model(model_name, seq_len, checkpointing)
    else:
        model = _build_model(model_name, seq_len, checkpointing)

    trainable = [p for p in model.parameters() if p.requires_grad]
    client_optimizer = (
        torch.optim.Adafactor(trainable, lr=1e-3) if case.get("client_optimizer") == "adafactor" else None
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=trainable,
        optimizer=client_optimizer,
        config=case["config_path"],
    )

    initialised = time.monotonic()
    micro = engine.train_micro_batch_size_per_gpu()
    accumulation = engine.gradient_accumulation_steps()
    vocab = TINY_MODELS[model_name]["vocab_size"]
    # Different data per rank (as a DistributedSampler gives), reproducible across runs.
    gen = torch.Generator().manual_seed(seed + 1000 * rank)

    for step in range(1, steps + 1):
        losses: list[float] = []
        for _ in range(accumulation):
            batch = _micro_batch(gen, micro, seq_len, vocab, engine.device)
            loss = engine(**batch).loss
            engine.backward(loss)
            engine.step()  # only steps the optimizer at the accumulation boundary
            losses.append(float(loss.detach().float()))
        mean = sum(losses) / len(losses)
        if rank == 0:
            rank_reports.write(STEP_REPORT, rank, {**tag, "step": step, "loss": mean})
        if not all(math.isfinite(x) for x in losses):
            print(f"ds_train_worker: rank {rank} step {step}: non-finite loss {losses}", file=sys.stderr)
            return EXIT_BAD_TRAINING

    trained = time.monotonic()
    if engine.global_steps != steps:
        print(
            f"ds_train_worker: rank {rank}: engine.global_steps={engine.global_steps}, "
            f"expected {steps} (gradient accumulation boundary not reached?)",
            file=sys.stderr,
        )
        return EXIT_BAD_TRAINING

    info: dict[str, Any] = {}
    if rank == 0:
        optimizer = getattr(engine, "basic_optimizer", None) or engine.optimizer
        info = {
            **tag,
            "world_size": dist.get_world_size(),
            "dp_world_size": engine.dp_world_size,
            "zero_stage": engine.zero_optimization_stage(),
            "param_dtype": str(next(engine.module.parameters()).dtype).removeprefix("torch."),
            "optimizer": type(optimizer).__name__,
            "wrapper": type(engine.optimizer).__name__,
            "micro_batch": micro,
            "accumulation": accumulation,
            "train_batch_size": engine.train_batch_size(),
            "global_steps": engine.global_steps,
            "skipped_steps": engine.skipped_steps,
            "activation_checkpointing": checkpointing,
            # Where a run's wall time goes, to keep the oracle's cost visible (rank 0's clock).
            "import_s": f"{imported - started:.1f}",
            "init_s": f"{initialised - imported:.1f}",
            "train_s": f"{trained - initialised:.1f}",
        }
    # no rank tears down its process group (or starts the next case) while another still talks to
    # it; rank 0 reports the case done after it, so a ``done`` record means every rank finished
    dist.barrier()
    if rank == 0:
        rank_reports.write(DONE_REPORT, rank, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
