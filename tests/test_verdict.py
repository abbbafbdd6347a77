"""One verdict vocabulary (issue 22): calibrated bands whose evidence is the published corpus, and
doctor fixes that come from the solver's own search.

The band counts in dsgen.search.verdict.BANDS are re-derived here from bench/data/fit_outcomes.yaml with
``dsgen doctor``'s own predictions, so the evidence a user reads cannot drift from the data.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from dsgen.doctor.diagnose import diagnose
from dsgen.intake.loader import load_spec_text
from dsgen.search.solver import solve
from dsgen.search.verdict import (
    BANDS,
    HELD_OUT_BANDS,
    LONG_CONTEXT_BANDS,
    MARGIN_BANDS,
    ROOM_LINE,
    SAFE_LINE,
    band_of,
    classify,
)
from tests.conftest import EXAMPLES_DIR, bench_module


def _bench(name: str) -> ModuleType:
    return bench_module(name)


def _spec(text: str):
    return load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)


def _tight_band_json(runs: int, gpu_oom: int) -> dict[str, object]:
    """What JSON carries for the band between the safe line (0.9) and capacity."""
    return {"low": 0.9, "high": 1.0, "published_runs": runs, "published_gpu_oom": gpu_oom}


def test_band_edges() -> None:
    assert pytest.approx(0.9) == SAFE_LINE
    assert band_of(0.9).verdict == "fits" and band_of(0.9001).verdict == "tight"
    assert band_of(1.0).verdict == "tight" and band_of(1.0001).verdict == "oom"
    assert classify(10, 100, host_ok=False).verdict == "host-oom"
    tight = classify(95, 100, host_ok=True)
    assert tight.evidence is not None and "ran out of GPU memory" in tight.evidence
    assert tight.as_dict()["band"] == _tight_band_json(BANDS[1].runs, BANDS[1].gpu_oom)


def _doctor_fills(*names: str) -> list[tuple[float, bool]]:
    """(GPU fill, ran out of GPU memory) of ``dsgen doctor``'s own predictions on the corpus files
    ``names`` (runs the doctor calls host-oom have no GPU band)."""
    specs = _bench("outcome_specs")
    fills = []
    for name in names:
        corpus = specs.load_corpus(name)
        for case in corpus["cases"]:
            spec = specs.doctor_spec(case, corpus)
            d = diagnose(specs.doctor_config(case, corpus, spec.model), spec, max_fixes=0)
            if d.verdict != "host-oom":
                fills.append((d.fit.fill, case["outcome"] == "oom"))
    return fills


def _doctor_band_counts(*names: str) -> dict[str, list[int]]:
    """[runs, ran out of GPU memory] per band of the doctor's predictions on ``names``."""
    counts = {band.verdict: [0, 0] for band in BANDS}
    for fill, oom in _doctor_fills(*names):
        band = band_of(fill)
        counts[band.verdict][0] += 1
        counts[band.verdict][1] += oom
    return counts


def test_margin_bands_are_every_fit_corpus_outcome_below_the_safe_line() -> None:
    """MARGIN_BANDS (the solver's room-to-spare line) re-derived from the calibration and every
    held-out fit file: below the room line and between it and the safe line."""
    fills = _doctor_fills("fit_outcomes", *_bench("fit_accuracy").held_out_corpora())
    below = [oom for fill, oom in fills if fill <= ROOM_LINE]
    close = [oom for fill, oom in fills if ROOM_LINE < fill <= SAFE_LINE]
    assert [(len(below), sum(below)), (len(close), sum(close))] == [(b.runs, b.gpu_oom) for b in MARGIN_BANDS]
    # the evidence the line stands on: runs close to the safe line ran out far more often
    assert sum(close) / len(close) > 2 * sum(below) / len(below)


def test_bands_are_the_corpus_outcomes_of_the_doctors_own_predictions() -> None:
    assert _doctor_band_counts("fit_outcomes") == {band.verdict: [band.runs, band.gpu_oom] for band in BANDS}


def test_held_out_bands_are_the_held_out_outcomes_of_the_doctors_own_predictions() -> None:
    """HELD_OUT_BANDS re-derived from every held-out fit file (bench/data/fit_heldout*.yaml, as
    ``bench/fit_accuracy.py --held-out`` reads them) the way BANDS is from the calibration corpus; a
    tight verdict states both sentences."""
    counts = _doctor_band_counts(*_bench("fit_accuracy").held_out_corpora())
    assert counts == {band.verdict: [band.runs, band.gpu_oom] for band in HELD_OUT_BANDS}
    tight = classify(95, 100, host_ok=True)
    assert tight.evidence is not None and "held-out published runs" in tight.evidence
    assert tight.as_dict()["held_out_band"] == _tight_band_json(HELD_OUT_BANDS[1].runs, HELD_OUT_BANDS[1].gpu_oom)
    assert classify(10, 100, host_ok=False).as_dict()["held_out_band"] is None


def test_long_context_bands_are_that_corpus_outcomes_of_dsgens_own_predictions() -> None:
    """LONG_CONTEXT_BANDS re-derived from bench/data/long_context_runs.yaml with the plans the
    long-context bench prices (each run's settings pinned): runs with a GPU verdict, by band."""
    import yaml

    bench = _bench("long_context_published")
    corpus = yaml.safe_load(bench.DATA.read_text())
    evaluated = [(run, bench.priced(run, corpus)[0]) for run in corpus["runs"]]
    counts = {band.verdict: [len(out), out.count("oom")] for band, out in bench.outcomes_by_band(evaluated).items()}
    assert counts == {band.verdict: [band.runs, band.gpu_oom] for band in LONG_CONTEXT_BANDS}


def test_a_tight_long_context_plan_states_both_corpora() -> None:
    plain = classify(95, 100, host_ok=True)
    long = classify(95, 100, host_ok=True, long_context=True)
    assert plain.verdict == long.verdict == "tight"  # the verdict stays the fit corpus's
    assert plain.long_context_band is None and plain.as_dict()["long_context_band"] is None
    assert plain.evidence is not None and long.evidence is not None
    assert long.evidence.startswith(plain.evidence.split("; read against")[0])
    assert "long-context runs" in long.evidence and "bench/data/long_context_runs.yaml" in long.evidence
    assert long.as_dict()["long_context_band"] == _tight_band_json(
        LONG_CONTEXT_BANDS[1].runs, LONG_CONTEXT_BANDS[1].gpu_oom
    )
    assert classify(50, 100, host_ok=True, long_context=True).evidence is None  # fits states nothing


def test_a_tight_verdict_leans_to_what_its_governing_corpus_mostly_did() -> None:
    """Data, checked against the corpora by the tests above: of the fit corpus's 6 runs between the
    safe line and capacity all ran out, of the long-context corpus's 14 two did. An unpacked tight
    plan is read against the first (likely oom), a packed one against the second (likely fits)."""
    assert (BANDS[1].runs, BANDS[1].gpu_oom) == (6, 6) and BANDS[1].lean == "oom"
    assert (LONG_CONTEXT_BANDS[1].runs, LONG_CONTEXT_BANDS[1].gpu_oom) == (14, 2)
    assert LONG_CONTEXT_BANDS[1].lean == "fits"
    for long_context in (False, True):
        unpacked = classify(95, 100, host_ok=True, long_context=long_context)
        packed = classify(95, 100, host_ok=True, long_context=long_context, packed_samples=True)
        assert unpacked.verdict == packed.verdict == "tight"  # the band is the same, only the reading differs
        assert (unpacked.likely, packed.likely) == ("oom", "fits")
        assert packed.governing_band is packed.long_context_band is not None
        assert unpacked.governing_band is unpacked.band
        assert packed.as_dict()["likely"] == "fits" and unpacked.as_dict()["likely"] == "oom"
        assert packed.evidence is not None and packed.evidence.endswith("(packed samples): likely fits")
        assert unpacked.evidence is not None and unpacked.evidence.endswith("likely runs out of GPU memory")
    # a verdict outside the band says what it is, packed or not
    for packed_samples in (False, True):
        assert classify(50, 100, True, packed_samples=packed_samples).likely == "fits"
        assert classify(101, 100, True, packed_samples=packed_samples).likely == "oom"
        assert classify(50, 100, False, packed_samples=packed_samples).likely == "host-oom"


def test_an_evenly_split_band_leans_to_out_of_memory() -> None:
    from dsgen.search.verdict import Band, FitVerdict

    split = Band("tight", SAFE_LINE, 1.0, runs=4, gpu_oom=2)
    assert split.lean is None
    assert Band("tight", SAFE_LINE, 1.0, runs=4, gpu_oom=1).lean == "fits"
    assert Band("tight", SAFE_LINE, 1.0, runs=4, gpu_oom=3).lean == "oom"
    assert FitVerdict("tight", 0.95, split, split, packed_samples=True).likely == "oom"


def test_packed_samples_reach_the_verdict_of_solve_and_doctor(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """training.packed_samples goes from the spec to every command's verdict: the same tight plan,
    solved with and without it, is read against the long-context corpus only with it."""
    import json

    from tests.cli_helpers import run_cli

    likely = {}
    for packed in (False, True):
        path = tmp_path / f"spec-{packed}.yaml"
        path.write_text(
            TIGHT_SPEC.replace(
                "global_batch_size: 8}", f"global_batch_size: 8, packed_samples: {str(packed).lower()}}}"
            )
        )
        body = json.loads(run_cli(["solve", str(path), "--json"], capsys).stdout)
        assert body["verdict"] == "tight", body["verdict"]
        likely[packed] = body["likely"]
        assert (body["long_context_band"] is not None) == packed
    assert likely == {False: "oom", True: "fits"}
    # the doctor reads it from the spec it is given; the exit code stays tight's
    config = {
        **BATCH,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    }
    for packed in (False, True):
        spec = _spec(
            "model: {preset: qwen2.5-7b}\nhardware: {gpu: a100-40gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}\n"
            f"training: {{sequence_length: 4096, global_batch_size: 64, packed_samples: {str(packed).lower()}}}\n"
            "constraints: {activation_checkpointing: false}\n"
        )
        d = diagnose(config, spec)
        assert (d.verdict, d.fit.likely, d.exit_code) == ("tight", "fits" if packed else "oom", 3)


# ---- fixes from the solver's search --------------------------------------------------------------
LLAMA_33B = """
model:
  architecture: {family: llama, num_layers: 60, hidden_size: 6656, num_attention_heads: 52,
                 num_key_value_heads: 52, intermediate_size: 17920, vocab_size: 32000, mlp: swiglu}
hardware: {gpu: a100-40gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 600}
training: {sequence_length: 2048, global_batch_size: 64, optimizer: {type: adamw}}
constraints: {activation_checkpointing: true}
"""

BATCH = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8}


def _fix_kinds(d: Any) -> list[str]:
    return [fix.label for fix in d.fixes]


def test_host_ram_case_gets_the_fix_solve_finds() -> None:
    """Issue 22: LLaMA-33B, ZeRO-3 with optimizer and parameter offload on 8 x A100 40 GB and 600 GB
    of host RAM ran out of host memory; dsgen solve finds partial offload without parameter offload."""
    spec = _spec(LLAMA_33B)
    config = {
        **BATCH,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
    }
    d = diagnose(config, spec)
    assert d.verdict == "host-oom"
    assert solve(spec).feasible
    assert d.fixes, d.findings
    best = d.fixes[0]
    assert best.evaluation.feasible and best.evaluation.fit.verdict == "fits"
    assert best.evaluation.plan.offload_param == "none"
    assert dict(best.changes)["zero_optimization.offload_param.device"] == "none"
    assert d.exit_code == 3


def test_every_kind_of_fix() -> None:
    """Partial offload, dropping parameter offload, NVMe where declared, checkpointing, and
    micro-batch/accumulation at the same global batch: each appears as a fix for a case that needs it."""
    nvme = LLAMA_33B.replace(
        "cpu_memory_gib: 600}", "cpu_memory_gib: 200, nvme: {path: /local_nvme, capacity_gib: 3000}}"
    )
    z3_offload = {
        **BATCH,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
    }
    d = diagnose(z3_offload, _spec(nvme))
    assert d.verdict == "host-oom"
    assert any("nvme" in label.lower() for label in _fix_kinds(d)), _fix_kinds(d)
    assert any(fix.evaluation.plan.offload_optimizer == "nvme" for fix in d.fixes)

    d = diagnose(z3_offload, _spec(LLAMA_33B))
    labels = _fix_kinds(d)
    assert any("partial CPU optimizer offload" in label for label in labels), labels
    assert any(fix.evaluation.plan.offload_param == "none" for fix in d.fixes)

    # an 8B model, ZeRO-2, micro-batch 8 at 4096 tokens without checkpointing on 8 x A100 40 GB
    small = _spec(
        """
model: {preset: llama-3.1-8b}
hardware: {gpu: a100-40gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}
training: {sequence_length: 4096, global_batch_size: 64}
constraints: {activation_checkpointing: false}
"""
    )
    config = {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
    }
    d = diagnose(config, small, max_fixes=20)
    assert d.verdict == "oom"
    assert any(fix.script_changes and "checkpointing" in fix.script_changes[0] for fix in d.fixes)
    batch_fixes = [f for f in d.fixes if "micro-batch" in f.label]
    assert batch_fixes
    for fix in batch_fixes:
        micro = fix.evaluation.plan.micro_batch_size
        accum = fix.evaluation.plan.gradient_accumulation_steps
        ranks = fix.evaluation.plan.batch_parallel_size  # 8, or 8 / TP where the fix adds AutoTP
        assert micro * accum * ranks == 64 and dict(fix.changes)["train_micro_batch_size_per_gpu"] == micro
    for fix in d.fixes:
        assert fix.evaluation.feasible


def _slower_and_larger(a: Any, b: Any) -> bool:
    """``a`` is no faster and no smaller (GPU and host peak) than ``b``, and worse in one."""
    sa, ga, ha = a.step.total_s, a.memory.gpu.total, a.memory.cpu.total
    sb, gb, hb = b.step.total_s, b.memory.gpu.total, b.memory.cpu.total
    return sa >= sb and ga >= gb and ha >= hb and (sa, ga, ha) != (sb, gb, hb)


def _moving_parts(e: Any) -> int:
    """What can fail beyond a plain DeepSpeed run, as docs/how-dsgen-chooses.md counts it: each
    offload, AutoTP, AutoEP (with its version pin, two), Ulysses."""
    p = e.plan
    offloads = (p.offload_optimizer != "none") + (p.offload_param != "none")
    return offloads + (p.tensor_parallel_size > 1) + 2 * (p.expert_parallel_size > 1) + (p.sequence_parallel_size > 1)


def test_fixes_follow_the_solvers_rule_room_before_moving_parts_before_speed() -> None:
    """The doctor orders its fixes by the rule ``dsgen solve`` ranks plans with: at each place, of the
    fixes left, one within the step-time band of the fastest, never one slower and larger than
    another, with room to spare (at or below the room line) when one in the band has it, and then
    with the fewest moving parts. LLaMA-33B on 8 x A100 40 GB: the fastest fix (micro 2) is just
    over the room line, so a fix with room within the band goes first."""
    from dsgen.estimate.throughput import STEP_TIME_TIE_BAND

    d = diagnose(
        {
            **BATCH,
            "bf16": {"enabled": True},
            "zero_optimization": {
                "stage": 3,
                "offload_optimizer": {"device": "cpu"},
                "offload_param": {"device": "cpu"},
            },
        },
        _spec(LLAMA_33B),
        max_fixes=10,
    )
    fixes = [fix.evaluation for fix in d.fixes]
    assert len(fixes) >= 2
    for i, pick in enumerate(fixes):
        left = fixes[i:]
        limit = min(e.step.total_s for e in left) * (1 + STEP_TIME_TIE_BAND)
        window = [e for e in left if e.step.total_s <= limit]
        front = [e for e in window if not any(_slower_and_larger(e, other) for other in left)]
        assert pick in front, i  # within the band, and nothing left is both faster and smaller
        if any(e.fit.fill <= ROOM_LINE for e in front):
            assert pick.fit.fill <= ROOM_LINE, i
        peers = [e for e in front if (e.fit.fill <= ROOM_LINE) == (pick.fit.fill <= ROOM_LINE)]
        assert _moving_parts(pick) == min(_moving_parts(e) for e in peers), i
    # the case exercises the room part of the rule: the fastest fix is close to the line, the first has room
    fastest = min(fixes, key=lambda e: e.step.total_s)
    assert fastest.fit.fill > ROOM_LINE and fixes[0].fit.fill <= ROOM_LINE and fixes[0] is not fastest


def test_tight_doctor_exit_code_and_fit() -> None:
    spec = _spec(
        "model: {preset: qwen2.5-7b}\nhardware: {gpu: a100-40gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}\n"
        "training: {sequence_length: 4096, global_batch_size: 64}\nconstraints: {activation_checkpointing: false}\n"
    )
    config = {
        **BATCH,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    }
    d = diagnose(config, spec)
    assert d.verdict == "tight" and SAFE_LINE < d.fit.fill <= 1.0
    assert d.exit_code == 3
    assert any(f.code == "tight" and "published runs" in f.message for f in d.findings)
    assert d.fixes and all(f.evaluation.fit.verdict == "fits" for f in d.fixes)


# The long-context tricks are pinned off: with them (a tiled loss) this run fits below the line.
TIGHT_SPEC = """model: {preset: qwen2.5-1.5b}
hardware: {gpu: l4, gpus_per_node: 1, nodes: 1, cpu_memory_gib: 256}
training: {sequence_length: 8704, global_batch_size: 8}
constraints: {sequence_parallel_size: 1, tiled_mlp: false, tiled_loss: false, checkpoint_offload: false}
"""


def test_new_writes_a_tight_plan_only_with_allow_tight(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tests.cli_helpers import run_cli

    (tmp_path / "spec.yaml").write_text(TIGHT_SPEC)
    spec, out = str(tmp_path / "spec.yaml"), str(tmp_path / "ds.json")
    refused = run_cli(["new", spec, "-o", out], capsys)
    assert refused.exit_code == 3 and not (tmp_path / "ds.json").exists()
    solved = json.loads(run_cli(["solve", spec, "--json"], capsys).stdout)
    assert solved["verdict"] == "tight" and solved["feasible"] is False
    written = run_cli(["new", spec, "-o", out, "--allow-tight", "--json"], capsys)
    assert written.exit_code == 0, written.stderr
    body = json.loads(written.stdout)
    assert body["verdict"] == "tight" and SAFE_LINE < body["fill"] <= 1.0 and body["evidence"]
    assert (tmp_path / "ds.json").exists()
    # a user who pins a headroom below the calibrated one gets the tight plan written without the flag
    pinned = run_cli(["new", spec, "-o", str(tmp_path / "p.json"), "--set", "constraints.memory_headroom=0.0"], capsys)
    assert pinned.exit_code == 0 and "verdict   tight" in pinned.stdout
