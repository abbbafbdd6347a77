"""dsgen's fine-tuning terms against real DeepSpeed runs on CPU: per-rank bytes and saved activations.

Runs every case of ``tests/test_finetuning_measured.py`` (a tiny Llama or Qwen3 with PEFT's LoRA,
freeze-tuning, bitsandbytes' 4-bit QLoRA or TRL's DPO reference, under ZeRO-1/2/3, 2 CPU ranks,
gloo) through the measurement worker (``tests/finetune_worker.py``) and prints, per case, the
frozen bytes, the reference engine's bytes and the activations autograd saved, each beside dsgen's
prediction, then the activations' median and worst error (the activation bench's bar: 3 % and 8 %).

Run: python bench/finetune_state_accuracy.py   (about 4 minutes on 2 cores)
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


if __name__ == "__main__":
    main()
