"""``dsgen frontier``: the value found is the solver's own boundary (it fits, one step more does
not), the JSON has the issue's shape, and bad input is exit 2 naming the option."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from dsgen.api import frontier_of, load_spec, solve_spec
from dsgen.search.frontier import SEQUENCE_GRANULE, FrontierPoint
from dsgen.search.solver import fits_any
from dsgen.spec.types import Spec
from tests.cli_helpers import run_cli

SPEC = """\
model: {preset: llama-3.1-8b}
hardware: {gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 2048}
training: {sequence_length: 131072, global_batch_size: 8}
"""


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


def _solve_at(spec, gpus: int, seq: int):
    from dsgen.search.frontier import spec_for_gpus

    at = spec_for_gpus(spec, gpus)
    constraints = replace(at.constraints, allow_batch_rounding="nearest")
    return solve_spec(replace(at, training=replace(at.training, sequence_length=seq), constraints=constraints))


@pytest.mark.parametrize("gpus", [1, 8])
def test_the_frontier_is_the_solvers_boundary(spec_file: Path, gpus: int) -> None:
    spec = load_spec(spec_file)
    (point,) = frontier_of(spec, "sequence_length", [gpus])
    assert point.value is not None and not point.at_limit
    assert point.result.feasible
    assert _solve_at(spec, gpus, point.value).feasible
    assert not _solve_at(spec, gpus, point.value + SEQUENCE_GRANULE).feasible


def test_json_shape_with_gpus(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(["frontier", str(spec_file), "--gpus", "1,8", "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    for key in ("max_sequence_length", "plan", "memory", "step_time_s", "points"):
        assert key in body
    assert [p["gpus"] for p in body["points"]] == [1, 8]
    for p in body["points"]:
        assert {"max_sequence_length", "plan", "memory", "step_time_s", "gpus"} <= p.keys()
    assert body["points"][1]["max_sequence_length"] > body["points"][0]["max_sequence_length"]
    assert body["points"][1]["plan"]["sequence_parallel_size"] > 1


@pytest.mark.parametrize(("host_gib", "runs_out"), [(2048, "gpu"), (512, "host")])
def test_what_runs_out_one_step_further(spec_file: Path, host_gib: int, runs_out: str) -> None:
    """The frontier names the resource the next length runs out of, and that resource is over its
    budget in a fresh solve at that length (GPU on a 2 TiB host; host RAM on a 512 GiB one, where
    checkpoint offload and the offloaded optimizer fill the node first)."""
    spec = load_spec(spec_file, [f"hardware.cpu_memory_gib={host_gib}"])
    (point,) = frontier_of(spec, "sequence_length", [8])
    assert point.value is not None and point.runs_out == (runs_out,)
    nearest = _solve_at(spec, 8, point.value + SEQUENCE_GRANULE).closest
    assert nearest is not None
    short = {"gpu": not nearest.fits_gpu, "host": not nearest.fits_cpu}
    assert short[runs_out] and not any(v for k, v in short.items() if k != runs_out)


def test_the_ulysses_ceiling_is_named_where_more_gpus_add_no_sequence(spec_file: Path) -> None:
    """Llama-3.1-8B has 32 query heads: Ulysses cannot go past 32, so 64 GPUs reach no further
    than 32, and the frontier says which rule stops the larger degree."""
    spec = load_spec(spec_file)
    at_32, at_64 = frontier_of(spec, "sequence_length", [32, 64])
    assert at_64.value == at_32.value
    assert at_32.sequence_parallel_ceiling is None
    assert at_64.sequence_parallel_ceiling is not None
    assert "64" in at_64.sequence_parallel_ceiling and "32 query heads" in at_64.sequence_parallel_ceiling


def test_an_assumed_host_is_said_where_it_stops_the_frontier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.replace(", cpu_memory_gib: 2048", ""))
    result = run_cli(["frontier", str(path), "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    stop = json.loads(result.stdout)["stopped_by"]
    assert stop["runs_out"] == ["host"]
    assert stop["sequence_length"] == json.loads(result.stdout)["max_sequence_length"] + SEQUENCE_GRANULE
    assert "hardware.cpu_memory_gib not set" in stop["reason"]
    table = run_cli(["frontier", str(path)], capsys)
    assert "host RAM, over by" in table.stdout and "512.0 GiB per node assumed" in table.stdout


def test_micro_batch_frontier(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(
        ["frontier", str(spec_file), "--over", "micro_batch_size", "--set", "training.sequence_length=4096", "--json"],
        capsys,
    )
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["max_micro_batch_size"] == body["plan"]["micro_batch_size"]
    assert "points" not in body


def test_table_and_bars(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(["frontier", str(spec_file), "--gpus", "1,8"], capsys)
    assert result.exit_code == 0, result.stderr
    assert "max sequence length" in result.stdout
    assert "#" in result.stdout and "8 GPUs |" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--gpus", "1,x"], "--gpus"),
        (["--gpus", "12"], "--gpus"),  # neither within one node of 8 nor whole nodes
        (["--plot", "curve.pdf"], "--plot"),
    ],
)
def test_bad_options_are_exit_2(
    spec_file: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    result = run_cli(["frontier", str(spec_file), *args], capsys)
    assert result.exit_code == 2
    assert words in result.stderr
    assert "Traceback" not in result.stderr


def test_plot_is_written(spec_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import require_module

    require_module("matplotlib")
    out = tmp_path / "frontier.svg"
    result = run_cli(["frontier", str(spec_file), "--gpus", "1,8", "--plot", str(out)], capsys)
    assert result.exit_code == 0, result.stderr
    assert out.read_text().lstrip().startswith(("<?xml", "<svg"))


# --- frontier on every layout the solver can choose (issue 48) -------------------------------
# ``solve`` is the oracle: a value fits on the frontier iff ``solve`` with that value pinned (the
# frontier's documented spec at that value: the spec's batch at a length, ``value`` sequences per
# GPU at a micro-batch) finds a feasible plan.

#: Llama-3.1-8B on four 96 GB devices, ZeRO-1 and AutoTP 2 pinned, 512 tokens (the issue's case).
TP2_SPEC = """\
model: {preset: llama-3.1-8b}
hardware:
  gpu: {name: gpu-96gb, memory_gib: 96, peak_tflops: 900, memory_bandwidth_gbps: 4000}
  gpus_per_node: 4
  cpu_memory_gib: 512
training: {sequence_length: 512, global_batch_size: 64}
constraints: {zero_stage: 1, tensor_parallel_size: 2}
"""

#: Each layout the solver chooses: (name, spec source, overrides, the plan key that must exceed 1).
LAYOUTS = {
    "autotp-pinned": (TP2_SPEC, [], "tensor_parallel_size"),
    "autotp-chosen": ("qwen2.5-7b-adafactor-4xa100-40gb.yaml", [], "tensor_parallel_size"),
    "autoep": ("qwen3-30b-a3b-8xh100.yaml", ["constraints.expert_parallel_size=4"], "expert_parallel_size"),
    "ulysses": ("llama-3.1-8b-128k-8xh100.yaml", [], "sequence_parallel_size"),
}
AXES = ("sequence_length", "micro_batch_size")


@pytest.fixture(scope="module")
def layout_frontier(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], tuple[Spec, FrontierPoint]]:
    """(spec, frontier point) of a layout on one axis, computed once per module."""
    from tests.conftest import EXAMPLES_DIR

    @cache
    def of(layout: str, over: str) -> tuple[Spec, FrontierPoint]:
        source, overrides, _ = LAYOUTS[layout]
        path = EXAMPLES_DIR / source
        if not source.endswith(".yaml"):
            path = tmp_path_factory.mktemp(layout) / "spec.yaml"
            path.write_text(source)
        spec = load_spec(path, overrides)
        (point,) = frontier_of(spec, over)
        return spec, point

    return of


def _pinned(spec: Spec, over: str, value: int) -> Spec:
    """``spec`` with ``over`` pinned to ``value``, as the frontier documents it."""
    constraints = replace(spec.constraints, allow_batch_rounding="nearest")
    training = replace(spec.training, tokens_per_step=None)
    if over == "sequence_length":
        batch = spec.training.global_batch_size or spec.hardware.world_size
        training = replace(training, sequence_length=value, global_batch_size=batch)
    else:
        training = replace(training, global_batch_size=value * spec.hardware.world_size)
        constraints = replace(constraints, micro_batch_size=value, gradient_accumulation_steps=None)
    return replace(spec, training=training, constraints=constraints)


def _solve_pinned(spec: Spec, over: str, value: int):
    """``dsgen solve`` on ``spec`` with ``over`` pinned to ``value``: the oracle."""
    return solve_spec(_pinned(spec, over, value))


@pytest.mark.parametrize("over", AXES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_frontier_agrees_with_solve_on_every_layout(
    layout_frontier: Callable[[str, str], tuple[Spec, FrontierPoint]], layout: str, over: str
) -> None:
    """The value found, half of it and the smallest fit under ``solve``; one step more does not;
    and the plan at the frontier runs the layout under test."""
    spec, point = layout_frontier(layout, over)
    step = SEQUENCE_GRANULE if over == "sequence_length" else 1
    assert point.value is not None and not point.at_limit, point.runs_out
    for fitting in {step, point.value // 2 // step * step or step, point.value}:
        assert _solve_pinned(spec, over, fitting).feasible, fitting
    assert not _solve_pinned(spec, over, point.value + step).feasible
    assert point.result.best is not None
    key = LAYOUTS[layout][2]
    shown = point.result.best.plan
    degree = {
        "tensor_parallel_size": shown.model_parallel.tensor_parallel_size,
        "expert_parallel_size": shown.model_parallel.expert_parallel_size,
        "sequence_parallel_size": shown.long_context.sequence_parallel_size,
    }[key]
    assert degree > 1


@pytest.mark.parametrize("over", AXES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fits_any_agrees_with_solve_at_the_frontier(
    layout_frontier: Callable[[str, str], tuple[Spec, FrontierPoint]], layout: str, over: str
) -> None:
    """The fast predicate the bisection asks gives ``solve``'s answer on both sides of the
    boundary (where it does not, the frontier is right only through its slower fallback)."""
    spec, point = layout_frontier(layout, over)
    assert point.value is not None
    step = SEQUENCE_GRANULE if over == "sequence_length" else 1
    for value in (point.value, point.value + step):
        at = _pinned(spec, over, value)
        assert fits_any(at) == solve_spec(at).feasible, value


def test_the_issues_tp2_micro_batch_frontier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 48: AutoTP 2 pinned, where ``solve`` finds micro 8 on the spec's own batch, printed
    'none fits' with an empty reason. Micro 8 is within the frontier, and the JSON says so."""
    path = tmp_path / "spec.yaml"
    path.write_text(TP2_SPEC)
    chosen = solve_spec(load_spec(path)).best
    assert chosen is not None and chosen.plan.micro_batch_size == 8
    result = run_cli(["frontier", str(path), "--over", "micro_batch_size", "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["max_micro_batch_size"] >= chosen.plan.micro_batch_size
    assert body["plan"]["tensor_parallel_size"] == 2 and body["plan"]["zero_stage"] == 1
    assert body["reason"] is None
    assert "none fits" not in run_cli(["frontier", str(path), "--over", "micro_batch_size"], capsys).stdout


#: Llama-3.1-8B with ZeRO-0 and AutoTP 2 pinned on two 24 GB A10s: the Adam states alone are
#: 8.03e9 x 12 bytes / 2 = 48 GB per GPU, so not even the smallest value fits.
NO_FIT_SPEC = """\
model: {preset: llama-3.1-8b}
hardware: {gpu: a10, gpus_per_node: 2, cpu_memory_gib: 256}
training: {sequence_length: 2048, global_batch_size: 8}
constraints: {zero_stage: 0, tensor_parallel_size: 2}
"""


@pytest.mark.parametrize("over", AXES)
def test_no_fit_says_what_runs_out(tmp_path: Path, capsys: pytest.CaptureFixture[str], over: str) -> None:
    """Nothing fits: exit 3, and the reason is ``solve``'s own for its closest plan at the
    smallest value, naming the GPU memory it needs; the table says what runs out there."""
    path = tmp_path / "spec.yaml"
    path.write_text(NO_FIT_SPEC)
    smallest = SEQUENCE_GRANULE if over == "sequence_length" else 1
    closest = _solve_pinned(load_spec(path), over, smallest).closest
    assert closest is not None and closest.runs_out == ("gpu",)
    result = run_cli(["frontier", str(path), "--over", over, "--json"], capsys)
    assert result.exit_code == 3, result.stderr
    body = json.loads(result.stdout)
    assert body[f"max_{over}"] is None and body["plan"] is None
    assert body["reason"] and body["reason"] == closest.reason() and "per GPU" in body["reason"]
    table = run_cli(["frontier", str(path), "--over", over], capsys)
    assert table.exit_code == 3
    assert closest.reason() in table.stdout and "none fits, already at" in table.stdout
    assert "GPU memory, over by" in table.stdout


@pytest.mark.parametrize(
    ("layout", "overrides", "gpus", "key"),
    [
        ("autotp-pinned", [], "1,4", "tensor_parallel_size"),  # AutoTP 2 on one GPU
        ("autoep", [], "2,8", "expert_parallel_size"),  # AutoEP 4 on two GPUs
        ("ulysses", ["constraints.sequence_parallel_size=8"], "4,8", "sequence_parallel_size"),
    ],
)
def test_a_gpu_count_the_pinned_layout_cannot_run_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str, overrides: list[str], gpus: str, key: str
) -> None:
    """``--gpus`` moves the cluster past the checks the spec loader made on its own: a pinned
    degree that does not divide a count is bad input naming the option and the pin, not a crash."""
    from tests.conftest import EXAMPLES_DIR

    source, pins, _ = LAYOUTS[layout]
    path = EXAMPLES_DIR / source
    if not source.endswith(".yaml"):
        path = tmp_path / "spec.yaml"
        path.write_text(source)
    sets = [arg for pair in ([*pins, *overrides]) for arg in ("--set", pair)]
    result = run_cli(["frontier", str(path), "--gpus", gpus, *sets], capsys)
    assert result.exit_code == 2, result.stderr
    assert "--gpus" in result.stderr and f"constraints.{key}" in result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
