"""A TRL training script that takes what an hf-trainer fine-tuning bundle carries, for launch.sh.

It builds ``<TRL config>(**training_args.json, **trl_config.json)`` before the model (so ZeRO-3
would build it under zero.Init), wraps a tiny Llama with ``LoraConfig(**peft_config.json)`` when
the bundle has one, and trains ``--max-steps`` optimizer steps with the objective's TRL trainer on
made-up token data (a word-level tokenizer over the model's vocabulary: nothing is downloaded).
Rank 0 writes a ``DSGEN_TRL`` record with what the engine ran to its own report file
(:mod:`tests.rank_reports`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TRAINERS = {"sft": ("SFTConfig", "SFTTrainer"), "dpo": ("DPOConfig", "DPOTrainer")}


def _tokenizer(vocab_size: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="t0", eos_token="t1", unk_token="t0")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-config", type=Path, required=True)
    parser.add_argument("--objective", choices=sorted(TRAINERS), required=True)
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--output-dir", type=Path, required=True)
    cli = parser.parse_args()

    import torch
    import trl
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: tests.* from the checkout
    from tests import rank_reports

    config_class, trainer_class = (getattr(trl, name) for name in TRAINERS[cli.objective])
    kwargs = json.loads(Path("training_args.json").read_text())  # the bundle's files, by name
    kwargs.update(json.loads(Path("trl_config.json").read_text()))
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
    args = config_class(**kwargs)  # before the model
    config = LlamaConfig(**json.loads(cli.model_config.read_text()), use_cache=False)
    model = LlamaForCausalLM(config)
    peft_config = None
    if Path("peft_config.json").is_file():
        from peft import LoraConfig

        peft_config = LoraConfig(**json.loads(Path("peft_config.json").read_text()))

    tokenizer = _tokenizer(config.vocab_size)
    samples = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size * cli.max_steps
    gen = torch.Generator().manual_seed(0)

    def words(n: int) -> str:
        return " ".join(f"t{int(i)}" for i in torch.randint(2, config.vocab_size, (n,), generator=gen))

    half = cli.seq_len // 2
    if cli.objective == "sft":
        data = Dataset.from_list([{"text": words(cli.seq_len)} for _ in range(samples)])
    else:
        data = Dataset.from_list(
            [{"prompt": words(half), "chosen": words(half), "rejected": words(half)} for _ in range(samples)]
        )
    trainer = trainer_class(
        model=model, args=args, train_dataset=data, processing_class=tokenizer, peft_config=peft_config
    )
    trainer.train()
    if args.process_index == 0:
        trained = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        record = {**rank_reports.trainer_record(trainer), "trained": trained}
        rank_reports.write("DSGEN_TRL", args.process_index, record)
    trainer.accelerator.wait_for_everyone()  # see hf_trainer_script.py: tear the group down while Python is whole
    trainer.accelerator.end_training()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
