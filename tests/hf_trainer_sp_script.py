"""A user's HF Trainer script for a Ulysses SP bundle (``dsgen new --target hf-trainer`` with
``sequence_parallel_size`` > 1), as its ``launch.sh`` runs it.

What the bundle carries it takes from the bundle: ``TrainingArguments(**training_args.json)`` and
the ``PARALLELISM_CONFIG_*`` variables ``launch.sh`` exports, from which the Trainer's Accelerator
builds its ``ParallelismConfig`` and so registers ``UlyssesSPAttentionHF``, wraps the data loader
and reduces the loss over the SP group. The script adds what the notes say it must: sdpa
attention and ``position_ids`` in every batch; on this CPU test machine also the
``deepspeed.comm`` start that Accelerate makes only on GPUs. CPU only (gloo). At the end rank 0
writes a ``DSGEN_SP`` record (global_step, sp, finite, losses) to its own report file
(:mod:`tests.rank_reports`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def patch_gloo_all_to_all() -> None:
    """CPU test machine only. ``torch.distributed.nn.functional._AlltoAll`` (the backward of the
    ``all_gather`` that the SP loss reduction runs) emulates all_to_all on gloo with
    ``dist.scatter(..., i, group=group)``, passing the group rank ``i`` as a global source rank;
    an SP group that does not contain rank ``i`` (ranks 2 and 3 of 4) raises "Global rank 0 is
    not part of group". NCCL runs ``dist.all_to_all`` and never takes that path; here the same
    scatter is made with ``group_src=i``."""
    import torch.distributed as dist
    from torch.distributed.nn import functional as dist_fn

    def forward(ctx, group, out_tensor_list, *tensors):  # type: ignore[no-untyped-def]
        ctx.group = group
        ctx.input_tensor_size_list = [tensors[i].size() for i in range(dist.get_world_size(group=group))]
        my_rank = dist.get_rank(group=group)
        tensors = tuple(t.contiguous() for t in tensors)
        for i in range(dist.get_world_size(group=group)):
            dist.scatter(out_tensor_list[i], list(tensors) if i == my_rank else None, group=group, group_src=i)
        return tuple(out_tensor_list)

    dist_fn._AlltoAll.forward = staticmethod(forward)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-config", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    cli = parser.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: tests.* from the checkout
    from tests import rank_reports

    kwargs = json.loads(Path("training_args.json").read_text())
    kwargs.update(
        output_dir=str(cli.output_dir),
        max_steps=cli.max_steps,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=1234,
    )
    args = TrainingArguments(**kwargs)
    # CPU only: on GPUs Accelerate's PartialState starts deepspeed.comm itself (accelerate/state.py),
    # which UlyssesSPAttentionHF.register_with_transformers needs; with use_cpu it does not
    import deepspeed

    deepspeed.comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    patch_gloo_all_to_all()
    config = LlamaConfig(**json.loads(cli.model_config.read_text()), use_cache=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    samples = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size * cli.max_steps
    gen = torch.Generator().manual_seed(0)
    positions = torch.arange(cli.seq_len)
    data = [
        {"input_ids": ids, "labels": ids, "position_ids": positions}
        for ids in torch.randint(0, config.vocab_size, (samples, cli.seq_len), generator=gen)
    ]
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    pc = trainer.accelerator.parallelism_config
    if args.process_index == 0:
        record = {
            "global_step": trainer.state.global_step,
            "sp": pc.sp_size if pc else 1,
            "finite": all(math.isfinite(x) for x in losses),
            "losses": losses,
        }
        rank_reports.write("DSGEN_SP", args.process_index, record)
    # end the way every distributed script must (docs/targets.md, "How your script ends")
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
