"""The doctor's reading of an out-of-memory message sizes each allocation as the estimate does."""

from __future__ import annotations

from dataclasses import replace

from dsgen.api import solve_spec
from dsgen.doctor.oom_match import read_oom
from dsgen.doctor.oom_message import parse_oom
from dsgen.intake.loader import load_spec_text
from dsgen.search.evaluation import evaluate
from dsgen.search.solver import require_feasible
from tests.conftest import EXAMPLES_DIR

GPT2_PARAMETERS = 124_439_808  # published GPT-2 small, tied head
DEFAULT_REDUCE_BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size default (zero/config.py)


def test_a_small_models_reduce_bucket_is_matched_at_its_whole_size() -> None:
    """DeepSpeed allocates a reduce bucket of ``reduce_bucket_size`` elements however small the
    model (stage_1_and_2.py ``setup_buckets``), so a request of that size is the bucket, not a
    mismatch, even for a model four times smaller than the bucket."""
    text = (
        "model: {preset: gpt2}\n"
        "hardware: {gpu: a100-80gb, gpus_per_node: 8, nodes: 1}\n"
        "training: {sequence_length: 1024, global_batch_size: 64, precision: bf16}\n"
        "constraints: {zero_stage: 2, offload_optimizer: none}\n"
    )
    spec = load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)
    plan = require_feasible(solve_spec(spec)).plan
    plan = replace(plan, knobs=replace(plan.knobs, reduce_bucket_size=DEFAULT_REDUCE_BUCKET, overlap_comm=False))
    assert DEFAULT_REDUCE_BUCKET > GPT2_PARAMETERS  # the case under test: a bucket larger than the model
    tried_mib = 2 * DEFAULT_REDUCE_BUCKET / 2**20  # bf16: 953.67 MiB
    message = parse_oom(f"CUDA out of memory. Tried to allocate {tried_mib:.2f} MiB (GPU 0; 79.15 GiB total capacity)")
    reading = read_oom(message, spec, evaluate(spec, plan))
    assert reading.match is not None and reading.match.what == "one reduce bucket"
