"""The published-outcome corpora (bench/data/*_outcomes.yaml) stay sourced, complete and loadable.

bench/fit_accuracy.py and bench/throughput_accuracy.py score dsgen against these files; a case
without a source, with a field the bench cannot read, or that no longer loads as a dsgen spec would
silently drop out of (or break) those figures. Groups must vary the knobs they say they vary, or
their pair-order count means something else.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.conftest import bench_module

RUN_FIELDS = (
    "model",
    "gpu",
    "gpus_per_node",
    "nodes",
    "sequence_length",
    "micro_batch",
    "grad_accum",
    "precision",
    "zero_stage",
    "offload_optimizer",
    "offload_param",
    "activation_checkpointing",
    "optimizer",
    "attention",
)


def _outcome_specs() -> ModuleType:
    return bench_module("outcome_specs")


#: The held-out fit files collected blind (every case says whether its inputs were all stated).
BLIND_FIT_SETS = ("fit_heldout_strict", "fit_heldout_blind3", "fit_heldout_blind4", "fit_heldout_blind5")


@pytest.fixture(scope="module")
def specs() -> ModuleType:
    return _outcome_specs()


@pytest.fixture(
    scope="module",
    params=[
        "fit_outcomes",
        "throughput_outcomes",
        "fit_heldout",
        "fit_heldout_strict",
        "fit_heldout_blind3",
        "fit_heldout_blind4",
        "fit_heldout_blind5",
        "throughput_heldout",
        "throughput_heldout_blind2",
        "throughput_heldout_blind2_excluded",
    ],
)
def corpus(request: pytest.FixtureRequest, specs: ModuleType) -> dict[str, Any]:
    data: dict[str, Any] = specs.load_corpus(request.param)
    data["_name"] = request.param
    return data


def test_corpus_sizes(specs: ModuleType) -> None:
    fit = specs.load_corpus("fit_outcomes")["cases"]
    throughput = specs.load_corpus("throughput_outcomes")
    assert len(fit) >= 40
    assert {c["outcome"] for c in fit} == {"fits", "oom", "host_oom"}
    assert len(throughput["cases"]) >= 20
    assert sum(len(g["varies"]) == 1 for g in throughput["groups"].values()) >= 10


def test_every_case_is_sourced_and_complete(corpus: dict[str, Any]) -> None:
    ids = [c["id"] for c in corpus["cases"]]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    for case in corpus["cases"]:
        where = f"{corpus['_name']}: {case['id']}"
        assert str(case["source"]).startswith("https://"), where
        assert case["quote"].strip(), where
        assert isinstance(case.get("assumed", []), list), where
        for field in RUN_FIELDS:
            assert field in case, f"{where}: {field} missing"
        model = case["model"]
        assert ("preset" in model) != ("arch" in model), where
        if "arch" in model:
            assert model["arch"] in corpus["models"], where
        assert ("knobs_ref" in case) != ("knobs" in case), f"{where}: exactly one of knobs_ref / knobs"
        if "knobs_ref" in case:
            assert case["knobs_ref"] in corpus["knobs"], where
        assert isinstance(case.get("liger_kernel", False), bool), where
        assert isinstance(case.get("packed_samples", False), bool), where
        if corpus["_name"] in BLIND_FIT_SETS:  # the blind sets say, per case, whether every input was stated
            assert isinstance(case["strict"], bool), where
            assert case["strict"] or case["assumed"], f"{where}: a non-strict case lists what was assumed"
        if corpus["_name"].startswith("fit_"):
            assert case["outcome"] in ("fits", "oom", "host_oom"), where
        else:
            assert case["measured"]["value"] > 0, where
            assert case["measured"]["unit"] in ("tokens_per_s", "samples_per_s", "iterations_per_s", "per_runtime")


def test_every_case_loads_as_a_fully_pinned_spec(corpus: dict[str, Any], specs: ModuleType) -> None:
    for case in corpus["cases"]:
        spec = specs.build_spec(specs.spec_mapping(case, corpus))
        c = spec.constraints
        assert c.zero_stage == case["zero_stage"], case["id"]
        assert c.micro_batch_size == case["micro_batch"], case["id"]
        assert c.gradient_accumulation_steps == case["grad_accum"], case["id"]
        assert c.activation_checkpointing is not None, case["id"]
        assert c.memory_headroom == 0, case["id"]
        assert spec.hardware.world_size == case["gpus_per_node"] * case["nodes"], case["id"]
        assert spec.training.liger_kernel == case.get("liger_kernel", False), case["id"]
        assert spec.training.packed_samples == case.get("packed_samples", False), case["id"]


@pytest.mark.parametrize("name", ["throughput_outcomes", "throughput_heldout"])
def test_groups_vary_only_what_they_declare(specs: ModuleType, name: str) -> None:
    data = specs.load_corpus(name)
    cases = {c["id"]: c for c in data["cases"]}
    for name, group in data["groups"].items():
        members = [cases[i] for i in group["cases"]]  # KeyError names a missing case
        assert len(members) >= 2, name
        varying = {f for f in RUN_FIELDS if len({repr(m[f]) for m in members}) > 1}
        declared = set(group["varies"])
        # accumulation follows the micro-batch where the global batch is held fixed
        if "micro_batch" in declared and len({m["micro_batch"] * m["grad_accum"] for m in members}) == 1:
            varying.discard("grad_accum")
        assert varying == declared, f"{name}: declares {sorted(declared)}, varies {sorted(varying)}"


def test_run_knobs_fill_auto_and_default_as_hf_and_deepspeed_do(specs: ModuleType) -> None:
    # hand-computed for hidden 4096 (Llama-2-7B): HF "auto" = h^2, 0.9 h^2, 10 h; DeepSpeed 0.19.8
    # defaults = 5e8-element buckets, 5e7 prefetch, 1e5 persistence, 1e9 live / sub-group, and
    # overlap_comm on for stage 3 only
    corpus = {
        "knobs": {
            "auto": {
                "reduce_bucket_size": "auto",
                "prefetch_bucket_size": "auto",
                "param_persistence_threshold": "auto",
            }
        }
    }
    spec = specs.build_spec(
        {
            "model": {"preset": "llama-2-7b"},
            "hardware": {"gpu": "a100-80gb", "gpus_per_node": 8},
            "training": {"sequence_length": 512, "global_batch_size": 8},
        }
    )
    z3 = specs.run_knobs({"zero_stage": 3, "knobs_ref": "auto"}, corpus, spec.model)
    assert (z3.reduce_bucket_size, z3.prefetch_bucket_size, z3.param_persistence_threshold) == (
        16777216,
        15099494,
        40960,
    )
    assert (z3.allgather_bucket_size, z3.max_live_parameters, z3.sub_group_size) == (500000000, 1000000000, 1000000000)
    assert z3.overlap_comm is True
    z2 = specs.run_knobs({"zero_stage": 2, "knobs": {}}, corpus, spec.model)
    assert (z2.reduce_bucket_size, z2.prefetch_bucket_size, z2.param_persistence_threshold) == (
        500000000,
        50000000,
        100000,
    )
    assert z2.overlap_comm is False


@pytest.mark.parametrize(
    ("release", "stated", "pinned"), [("0.16", None, False), ("0.19.8", None, True), ("0.16", True, True)]
)
def test_run_knobs_pin_offload_as_the_runs_release_does(
    specs: ModuleType, release: str, stated: bool | None, pinned: bool
) -> None:
    """The bench's "run knobs" pricing pins offloaded tensors as the run did: its config's
    ``pin_memory``, else its release's default (DeepSpeed's ``offload_config.py``: false up to
    0.19.4, true from 0.19.5, deepspeedai/DeepSpeed#8207), the reading ``dsgen doctor`` makes."""
    knobs = {} if stated is None else {"offload_pin_memory": stated}
    case = {
        "id": "pin",
        "model": {"preset": "llama-2-7b"},
        "gpu": "a100-80gb",
        "gpus_per_node": 8,
        "nodes": 1,
        "host_ram_gib": None,
        "sequence_length": 512,
        "micro_batch": 1,
        "grad_accum": 1,
        "precision": "bf16",
        "zero_stage": 3,
        "offload_optimizer": "cpu",
        "offload_param": "cpu",
        "activation_checkpointing": True,
        "optimizer": "adamw",
        "attention": "sdpa",
        "knobs": knobs,
        "deepspeed_version": release,
    }
    run = specs.price(case, {"knobs": {}}).run.plan.knobs
    assert (run.pin_optimizer_offload, run.pin_param_offload) == (pinned, pinned)


@pytest.mark.parametrize("name", ["long_context_runs", "long_context_heldout"])
def test_long_context_runs_are_sourced_and_load_as_pinned_specs(name: str) -> None:
    """bench/data/long_context_runs.yaml and the blind held-out file: every run quoted, with an
    outcome the bench can score, its Ulysses degree dividing the GPUs and the sequence, and its
    settings loading as a dsgen spec (without Liger where dsgen does not model it for the model, as
    the bench prices it); the recipes' commented-out tries and every blind run are held out."""
    import yaml

    bench = bench_module("long_context_published")
    data = yaml.safe_load((bench.DATA.parent / f"{name}.yaml").read_text())
    ids = [run["id"] for run in data["runs"]]
    assert len(ids) == len(set(ids)), "run ids must be unique"
    for run in data["runs"]:
        where = run["id"]
        assert run["source"].strip() and run["quote"].strip(), where
        assert run["outcome"] in ("fits", "oom", "host_oom", "fails"), where  # fails: ran, did not train
        sp = run["constraints"].get("sequence_parallel_size", 1)
        assert run["gpus"] % sp == 0 and run["sequence_length"] % sp == 0, where
        if run.get("recipe_try") or name.endswith("heldout"):
            assert run.get("heldout") is True, where
        spec, caveat = bench.pinned_spec(run, data)
        assert not caveat or run.get("liger_kernel"), where
        assert spec.constraints.memory_headroom == 0, where
        assert spec.training.sequence_length == run["sequence_length"], where
        # the recipes pack their samples (the corpus header); only they say so
        assert spec.training.packed_samples == run["source"].startswith("ArcticTraining"), where


def test_long_context_bench_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/long_context_published.py runs to its end on its own corpus: the verdict agreement,
    the frontier against the published lengths and the speed figure each print their goal line."""
    import sys

    bench = bench_module("long_context_published")
    argv = sys.argv
    sys.argv = ["long_context_published.py"]
    try:
        assert bench.main() == 0
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    assert "agreement, held out:" in out
    assert "worst factor x" in out and "(goal within x1.25)" in out
    assert "median predicted/published speed" in out


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Statistics in
    # Medicine 17:857-872, Table I, method 3 (Wilson score, no continuity correction)
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_fit_accuracy_interval_is_wilsons(successes: int, trials: int, low: float, high: float) -> None:
    """The 95 % interval bench/fit_accuracy.py prints beside every doctor figure matches the
    published worked examples of the Wilson score interval to four places."""
    bench = bench_module("fit_accuracy")
    got = bench.wilson_interval(successes, trials)
    assert got == pytest.approx((low, high), abs=6e-5)


def test_fit_accuracy_pools_the_corpora_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """Given two corpora, bench/fit_accuracy.py prints each one's doctor figure and a pooled line
    whose counts are their sums."""
    import re

    bench = bench_module("fit_accuracy")
    ids = [
        "ds1302-bert-large-z1-8xv100",
        "litllama397-llama-7b-z2-offload-4xa100-40",
        "trl930-llama2-7b-z2-2xa100-80-s4096",
    ]
    assert bench.main(["--corpus", "fit_heldout", "--corpus", "fit_heldout_blind3", *[f"--case={i}" for i in ids]]) == 0
    out = capsys.readouterr().out
    per_file = [tuple(map(int, m)) for m in re.findall(r"^doctor verdicts right (\d+)/(\d+) \(", out, re.M)]
    assert [m for _, m in per_file] == [2, 1, 3]  # two cases of fit_heldout, one of blind3, the pool
    assert per_file[2] == (per_file[0][0] + per_file[1][0], 3)
    assert "pooled over fit_heldout, fit_heldout_blind3:" in out
    by_certainty = [tuple(map(int, m)) for m in re.findall(r"^  (?:strict|stated|unsure) +(\d+)/(\d+) ", out, re.M)]
    assert len(by_certainty) == 3  # strict, stated, unsure: each pooled run in exactly one
    assert (sum(n for n, _ in by_certainty), sum(m for _, m in by_certainty)) == per_file[2]
    estimator = re.search(r"^DeepSpeed's model-state estimator on the same runs right (\d+)/(\d+) ", out, re.M)
    assert estimator is not None and int(estimator[2]) == 3  # none of the three is a stage-0 run


@pytest.mark.parametrize(
    ("case", "certainty"),
    [
        ({"strict": True, "note": "UNSURE: a strict case's note"}, "strict"),
        ({"strict": False, "note": "UNSURE: the failure mode is not named"}, "unsure"),
        ({"note": "the reporter was not UNSURE"}, "stated"),
        ({"strict": "yes"}, "stated"),
        ({}, "stated"),
    ],
)
def test_fit_accuracy_reads_the_collectors_certainty(case: dict[str, Any], certainty: str) -> None:
    """A case is strict only where its collector set ``strict: true``, unsure where the note opens
    with the collectors' "UNSURE" mark, and stated otherwise."""
    assert bench_module("fit_accuracy").source_certainty(case) == certainty
