"""dsgen's fine-tuning terms against real DeepSpeed runs on CPU: per-rank bytes and saved activations.

Runs every case of ``tests/test_finetuning_measured.py`` (a tiny Llama or Qwen3 with PEFT's LoRA,
freeze-tuning, bitsandbytes' 4-bit QLoRA or TRL's DPO reference, under ZeRO-1/2/3, 2 CPU ranks,
gloo) through the measurement worker (``tests/finetune_worker.py``) and prints, per case, the
frozen bytes, the reference engine's bytes and the activations autograd saved, each beside dsgen's
prediction, then the activations' median and worst error (the activation bench's bar: 3 % and 8 %).
Then one real TRL GRPO step per case of ``tests/test_grpo_measured.py`` (``trl.GRPOTrainer`` with
transformers generation, ``tests/grpo_worker.py``): the KV cache and sampler logits generation
holds, ZeRO-3's gather for generation and the saved activations, each beside dsgen's prediction.

Run: python bench/finetune_state_accuracy.py   (about 6 minutes on 2 cores)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for entry in (str(REPO), str(REPO / "tests")):
    if entry not in sys.path:  # run as a script from a checkout: this dsgen and the test harness
        sys.path.insert(0, entry)

from tests.test_finetuning_measured import CASES, _measured, _predicted, _shape  # noqa: E402


def main() -> None:
    errors = []
    tmp = tempfile.mkdtemp(prefix="dsgen_finetune_bench_")
    print(
        f"{'case':<36} {'frozen B':>10} {'dsgen':>10} {'reference B':>12} {'dsgen':>10} {'activations B':>14} {'dsgen':>10} {'error':>7}"
    )
    for name, case in CASES.items():
        predicted = _predicted(name, _shape(case["model"], tmp))
        record = max(_measured(name), key=lambda r: r["saved_activation_bytes"])
        states = predicted.model_states
        frozen = states.frozen.partitions if case["zero_stage"] == 3 else states.frozen.resident
        reference = record.get("ref_param_bytes")
        if reference is not None:  # ZeRO-3 also keeps the small tensors whole on every rank
            w = 2 if case.get("dtype") == "bf16" else 4
            reference += w * (record.get("ref_zero3_persistent_elements") or 0)
        error = predicted.gpu.activations / record["saved_activation_bytes"] - 1
        errors.append(error)
        print(
            f"{name:<36} {record['frozen_bytes']:>10,} {frozen:>10,} {reference if reference is not None else '-':>12} "
            f"{predicted.gpu.reference_model if reference is not None else '-':>10} "
            f"{record['saved_activation_bytes']:>14,} {predicted.gpu.activations:>10,} {error:>+7.1%}"
        )
    absolute = [abs(e) for e in errors]
    print(
        f"\nsaved activations: median |error| {statistics.median(absolute):.1%}, worst {max(errors, key=abs):+.1%} over {len(errors)} cases"
    )
    print(
        "frozen bytes: ZeRO-3 partitions shown (its persistent copies are checked in the test); QLoRA's records leave out the 4-bit constants dsgen counts"
    )
    grpo(tmp)


def grpo(tmp: str) -> None:
    """The GRPO section: measured (largest over the ranks) and predicted bytes per term."""
    from tests.test_grpo_measured import CASES as GRPO_CASES
    from tests.test_grpo_measured import comparison

    print(
        f"\nGRPO, one TRL GRPOTrainer step (transformers generation)\n{'case / term':<36} {'measured B':>12} {'dsgen':>12} {'error':>7}"
    )
    for name in GRPO_CASES:
        result = comparison(name, tmp)
        measured, predicted = result["measured"], result["predicted"]
        print(f"{name}")
        print(f"{'  KV cache':<36} {measured['kv_cache']:>12,}")
        print(f"{'  sampler logits':<36} {measured['sampler_logits']:>12,}")
        for term in ("generation", "generation_gather", "saved_activations"):
            if term not in measured:
                continue
            error = predicted[term] / measured[term] - 1
            print(f"{'  ' + term:<36} {measured[term]:>12,} {predicted[term]:>12,} {error:>+7.1%}")


if __name__ == "__main__":
    main()
