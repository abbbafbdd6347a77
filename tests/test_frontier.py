"""``dsgen frontier``: the value found is the solver's own boundary (it fits, one step more does
not), the JSON has the issue's shape, and bad input is exit 2 naming the option."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dsgen.api import frontier_of, load_spec, solve_spec
from dsgen.frontier import SEQUENCE_GRANULE
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
    from dsgen.frontier import spec_for_gpus

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
