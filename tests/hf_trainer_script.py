"""A user's training script for the HF Trainer, as a dsgen ``hf-trainer`` bundle runs it.

``launch.sh`` starts it (under torchrun) in the bundle directory; it builds ``TrainingArguments``
from ``training_args.json`` exactly as docs/targets.md tells users to, and adds only what a CPU test
machine needs (``use_cpu``, the gloo backend) and what a real script owns (output directory,
step budget, logging). The model is a tiny Llama built from a local config: nothing is
downloaded. At the end rank 0 writes a ``DSGEN_TRAINER`` record (global_step, world_size, zero_stage,
train_batch_size, micro, accumulation) to its own report file (:mod:`tests.rank_reports`) so the
test can check what really ran. It ends the way every distributed script must: by destroying its
process group before the interpreter exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-config", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument(
        "--probe-save", type=Path, help="save a checkpoint at the last step; write its host copies here"
    )
    cli = parser.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: tests.* from the checkout
    from tests import rank_reports

    kwargs = json.loads(Path("training_args.json").read_text())  # the bundle's file, by name
    kwargs.update(
        output_dir=str(cli.output_dir),
        max_steps=cli.max_steps,
        use_cpu=True,  # CPU test machine: DeepSpeed's CPU accelerator, gloo
        ddp_backend="gloo",
        report_to="none",
        save_strategy="steps" if cli.probe_save else "no",
        save_steps=cli.max_steps,
        logging_steps=1,
        seed=1234,
    )
    args = TrainingArguments(**kwargs)  # before the model: ZeRO-3 then builds it under zero.Init
    config = LlamaConfig(**json.loads(cli.model_config.read_text()), use_cache=False)
    model = LlamaForCausalLM(config)

    samples = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size * cli.max_steps
    gen = torch.Generator().manual_seed(0)
    data = [
        {"input_ids": ids, "labels": ids}
        for ids in torch.randint(0, config.vocab_size, (samples, cli.seq_len), generator=gen)
    ]
    trainer = Trainer(model=model, args=args, train_dataset=data)
    probe = SaveProbe(trainer) if cli.probe_save else None
    trainer.train()
    if probe is not None:
        probe.write(cli.probe_save / f"rank{args.process_index}.json")
    if args.process_index == 0:
        rank_reports.write("DSGEN_TRAINER", args.process_index, rank_reports.trainer_record(trainer))
    # The Trainer never tears down the process group it started. Left alive, gloo's worker threads
    # still hold work objects (with tensors) when the interpreter finalizes; freeing those then
    # needs the GIL of an interpreter that is going away, and the rank dies with "terminate called
    # without an active exception" (SIGABRT) after training finished, so torchrun reports the run
    # as failed. Destroying the group here, while Python is whole, joins those threads first.
    trainer.accelerator.wait_for_everyone()  # no rank leaves while another still talks to it
    trainer.accelerator.end_training()  # accelerate's teardown: torch.distributed.destroy_process_group()
    return 0


class SaveProbe:
    """What a checkpoint save puts in this rank's host memory, measured on the Trainer's own path:

    * ``state_dict_bytes``: the tensors of the state dict ``Trainer.save_model`` builds
      (``accelerator.get_state_dict``), each distinct tensor once, by its elements (what a GPU run
      copies to the host);
    * ``largest_saved_storage``: the largest storage of any file this rank ``torch.save``s (the
      zip entries under ``data/`` hold one storage each, as ``torch.save`` copies them to the host
      one at a time)."""

    def __init__(self, trainer: object) -> None:
        import torch

        self.state_dict_bytes = 0
        self.largest_saved_storage = 0
        accelerator = trainer.accelerator  # type: ignore[attr-defined]
        get_state_dict = accelerator.get_state_dict
        save = torch.save

        def counting_get_state_dict(*args: object, **kwargs: object) -> object:
            state = get_state_dict(*args, **kwargs)
            tensors = {(t.data_ptr(), t.numel()): t for t in (state or {}).values() if isinstance(t, torch.Tensor)}
            self.state_dict_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
            return state

        def measuring_save(obj: object, f: object, *args: object, **kwargs: object) -> None:
            save(obj, f, *args, **kwargs)
            if isinstance(f, (str, os.PathLike)):
                import zipfile

                with zipfile.ZipFile(f) as archive:
                    sizes = [i.file_size for i in archive.infolist() if "/data/" in i.filename]
                self.largest_saved_storage = max([self.largest_saved_storage, *sizes])

        accelerator.get_state_dict = counting_get_state_dict
        torch.save = measuring_save

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"state_dict_bytes": self.state_dict_bytes, "largest_saved_storage": self.largest_saved_storage}
        path.write_text(json.dumps(record))


if __name__ == "__main__":
    raise SystemExit(main())
