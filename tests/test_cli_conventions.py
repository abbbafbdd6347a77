"""What a command-line user expects of any tool: --version, -h, shell completion, a starter file
(``dsgen init``), parent directories made for -o, a quiet end when the reader of stdout leaves,
aligned tables, one metavar style, and the accounting named in the text output."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dsgen.cli import COMMAND_MODULES
from tests.cli_helpers import run_cli
from tests.conftest import REPO_ROOT, require_module

EXAMPLE = REPO_ROOT / "examples" / "llama-3.1-8b-8xh100.yaml"
SEVENTY_B = REPO_ROOT / "examples" / "llama-3.1-70b-8xa100.yaml"


def _dsgen(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m dsgen``: the console entry with its own exit handling, as users run it."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "dsgen", *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=120
    )


# --- --version, -h ---------------------------------------------------------------------------------


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(["--version"], capsys)
    assert result.exit_code == 0
    assert result.stdout == f"dsgen {importlib.metadata.version('dsgen')}\n"


@pytest.mark.parametrize("command", [None, *sorted(COMMAND_MODULES)])
def test_dash_h_is_help(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = [command] if command else []
    short = run_cli([*prefix, "-h"], capsys)
    long = run_cli([*prefix, "--help"], capsys)
    assert short.exit_code == long.exit_code == 0
    assert short.stdout == long.stdout
    assert short.stdout.startswith(f"Usage: dsgen {command or ''}".rstrip())
    assert "-h, --help" in short.stdout


def test_usage_lines_and_options_use_one_metavar_style(capsys: pytest.CaptureFixture[str]) -> None:
    """Upper-case placeholders everywhere: {REQUIRED}, [OPTIONAL], --option VALUE; no <type> hints."""
    for command in sorted(COMMAND_MODULES):
        text = run_cli([command, "--help"], capsys).stdout
        usage = text.splitlines()[0]
        words = usage.split(f"Usage: dsgen {command} [OPTIONS]")[1].split()
        for word in words:
            assert re.fullmatch(r"\{[A-Z]+(\.\.\.)?\}|\[[A-Z]+(\.\.\.)?\]", word), (command, usage)
        assert "<" not in text and ">" not in text.replace("x>=", ""), (command, text)
        for line in text.splitlines():
            found = re.match(r"\s+(?:-\w, )?--[\w-]+ (\S+)", line)
            if found and not found.group(1).startswith(("[", "Show", "Print")):
                assert re.fullmatch(r"[A-Z][A-Z=.]*", found.group(1)), (command, line)


# --- shell completion ------------------------------------------------------------------------------


def test_completion_script_and_completion_requests(tmp_path: Path) -> None:
    shown = _dsgen("--show-completion", "bash", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "_DSGEN_COMPLETE" in shown.stdout and "complete " in shown.stdout
    request = {"_DSGEN_COMPLETE": "complete_bash", "COMP_WORDS": "dsgen so", "COMP_CWORD": "1"}
    commands = _dsgen(cwd=tmp_path, env=request)
    assert commands.returncode == 0 and commands.stdout.split() == ["solve"]
    request = {"_DSGEN_COMPLETE": "complete_bash", "COMP_WORDS": "dsgen solve --accounting ", "COMP_CWORD": "3"}
    values = _dsgen(cwd=tmp_path, env=request)
    assert values.stdout.split() == ["dsgen", "deepspeed-estimator"]


# --- dsgen init ------------------------------------------------------------------------------------


def test_init_writes_a_commented_spec_that_solves_and_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli(["init"], capsys)
    assert result.exit_code == 0, result.stderr
    text = (tmp_path / "spec.yaml").read_text()
    assert text.count("\n#") + text.count("  #") >= 10, "the starter explains its knobs"
    # AutoTP pinned off: its subject is the plain ZeRO config, whose train_batch_size is the spec's batch
    new = run_cli(["new", "spec.yaml", "--set", "constraints.tensor_parallel_size=1"], capsys)
    assert new.exit_code == 0, new.stderr
    config = json.loads((tmp_path / "ds_config.json").read_text())
    assert config["train_batch_size"] == yaml.safe_load(text)["training"]["global_batch_size"]


def test_every_commented_starter_key_loads_when_uncommented(tmp_path: Path) -> None:
    """Each ``# key: value`` the starter suggests, uncommented on its own (its trailing note cut),
    is a spec dsgen loads: the comments name real keys with valid values."""
    import re

    from dsgen.api import load_spec
    from dsgen.intake.starter import StarterOptions, starter_spec

    lines = starter_spec(StarterOptions()).splitlines()
    suggested = [i for i, line in enumerate(lines) if re.match(r"^ *# +[a-z_]+: \S", line)]
    assert len(suggested) >= 9
    for i in suggested:
        setting = re.sub(r"(\S)\s{2,}\S.*$", r"\1", lines[i].replace("# ", "", 1))
        assert re.match(r"^ +[a-z_]+: \S", setting), setting
        variant = [*lines[:i], setting, *lines[i + 1 :]]
        if lines[i].startswith("# "):  # under the commented-out constraints block
            variant = [("constraints:" if line.startswith("# constraints:") else line) for line in variant]
        path = tmp_path / f"variant-{i}.yaml"
        path.write_text("\n".join(variant) + "\n")
        load_spec(path)  # raises DsgenError naming the key if a suggestion is wrong


METHODS_AND_OBJECTIVES = [
    (method, objective)
    for method in ("full", "lora", "qlora", "freeze")
    for objective in ("sft", "dpo", "kto", "orpo", "simpo", "reward", "grpo", "ppo")
]
METHOD_IDS = [f"{method}-{objective}" for method, objective in METHODS_AND_OBJECTIVES]


@pytest.mark.parametrize(("method", "objective"), METHODS_AND_OBJECTIVES, ids=METHOD_IDS)
def test_init_writes_the_method_and_objective_asked_for_and_the_spec_solves(
    method: str, objective: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dsgen.api import load_spec, solve_spec

    path = tmp_path / "spec.yaml"
    result = run_cli(["init", str(path), "--finetuning", method, "--objective", objective], capsys)
    assert result.exit_code == 0, result.stderr
    spec = load_spec(path)
    assert (spec.training.finetuning.method, spec.training.finetuning.objective) == (method, objective)
    training = yaml.safe_load(path.read_text())["training"]
    assert ("finetuning" in training) == (method != "full") and ("objective" in training) == (objective != "sft")
    if objective in ("grpo", "ppo"):  # trained on prompt + completion, as the loader checks
        generation = spec.training.finetuning.generation
        assert spec.training.sequence_length == generation.max_prompt_length + generation.max_completion_length
    solved = solve_spec(spec)
    assert solved.feasible, solved.closest and solved.closest.reason()


@pytest.mark.parametrize(("method", "objective"), METHODS_AND_OBJECTIVES, ids=METHOD_IDS)
def test_a_starters_commented_method_keys_hold_the_defaults(method: str, objective: str, tmp_path: Path) -> None:
    """The lora, quantization, freeze and generation keys a method's starter names in comments,
    uncommented, load to the same spec: they show the knobs at the schema's defaults."""
    import re

    from dsgen.api import load_spec
    from dsgen.intake.starter import StarterOptions, starter_spec

    text = starter_spec(StarterOptions(finetuning=method, objective=objective))  # type: ignore[arg-type]
    (tmp_path / "starter.yaml").write_text(text)
    plain = load_spec(tmp_path / "starter.yaml")
    pattern = r"^  # (lora|quantization|freeze|generation): (\{.*?\})(\s{2,}.*)?$"
    uncommented = re.sub(pattern, r"  \1: \2", text, flags=re.MULTILINE)
    expected = {"lora": method in ("lora", "qlora"), "quantization": method == "qlora", "freeze": method == "freeze"}
    expected["generation"] = objective in ("grpo", "ppo")
    assert {key: f"\n  {key}: {{" in uncommented for key in expected} == expected
    (tmp_path / "uncommented.yaml").write_text(uncommented)
    assert load_spec(tmp_path / "uncommented.yaml").training == plain.training


def test_init_options_fill_the_spec_and_the_batch_splits_over_every_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dsgen.api import load_spec, solve_spec

    path = tmp_path / "specs" / "a100.yaml"
    args = ["init", str(path), "--gpu", "a100-80gb", "--model", "llama-3.2-1b", "--gpus-per-node", "6", "--nodes", "3"]
    assert run_cli(args, capsys).exit_code == 0
    spec = load_spec(path)
    assert (spec.hardware.gpu.name, spec.model.name) == ("a100-80gb", "llama-3.2-1b")
    assert (spec.hardware.gpus_per_node, spec.hardware.nodes) == (6, 3)
    assert spec.training.global_batch_size % 18 == 0
    result = solve_spec(spec)
    assert result.feasible and result.best is not None
    assert result.best.plan.global_batch_size == spec.training.global_batch_size


def test_init_refuses_to_overwrite_without_force_and_rejects_unknown_presets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("mine\n")
    refused = run_cli(["init", str(path)], capsys)
    assert refused.exit_code == 2 and "already exists" in refused.stderr
    assert path.read_text() == "mine\n"
    forced = run_cli(["init", str(path), "--force"], capsys)
    assert forced.exit_code == 0 and "model:" in path.read_text()
    bad = run_cli(["init", str(tmp_path / "bad.yaml"), "--gpu", "h1000"], capsys)
    assert bad.exit_code == 2 and "hardware.gpu" in bad.stderr and "h1000" in bad.stderr
    unknown = run_cli(["init", str(tmp_path / "bad.yaml"), "--finetuning", "dora"], capsys)
    assert unknown.exit_code == 2 and "--finetuning" in unknown.stderr and "'dora'" in unknown.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


# --- -o into a new directory -----------------------------------------------------------------------


def test_new_output_into_a_directory_that_does_not_exist_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # AutoTP pinned off: its subject is the plain ZeRO config, whose train_batch_size is the spec's batch
    result = run_cli(
        ["new", str(EXAMPLE), "-o", "out/ds.json", "--force", "--set", "constraints.tensor_parallel_size=1"], capsys
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "out" / "ds.json").read_text())["train_batch_size"] == 256


# --- a reader that goes away -----------------------------------------------------------------------


def test_closed_stdout_ends_quietly_with_141(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "dsgen", "solve", str(EXAMPLE), "--top", "40"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before dsgen writes its first line
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 141
    assert stderr == b""


def test_closed_stdout_in_process_is_141_not_findings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import typer

    def gone(*args: object, **kwargs: object) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(typer, "echo", gone)
    result = run_cli(["solve", str(EXAMPLE)], capsys)
    assert result.exit_code == 141
    assert result.stderr == ""


# --- text output -----------------------------------------------------------------------------------


def test_top_table_columns_line_up_whatever_the_labels(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(["solve", str(SEVENTY_B), "--top", "12"], capsys)
    assert result.exit_code == 0, result.stderr
    # the table is the block headed " # stage ..." (the rule's statement precedes it, #1's reason follows)
    table = next(block for block in result.stdout.split("\n\n") if block.lstrip().startswith("# "))
    lines = table.strip("\n").splitlines()
    header, rows = lines[0], lines[1:]
    assert len(rows) == 12
    offloads = {row[header.index("offload") :].split("  ")[0].strip() for row in rows}
    assert len({len(label) for label in offloads}) > 1, "the table must show labels of different lengths"
    assert {len(line) for line in lines} == {len(header)}
    gpu_end = header.index("GPU GiB") + len("GPU GiB")
    for row in rows:
        assert re.fullmatch(r"\d+\.\d", row[:gpu_end].split()[-1]), row  # the GPU GiB cell ends where its title does
        assert row[gpu_end] == " "


def test_text_output_names_the_accounting(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(["solve", str(EXAMPLE)], capsys)
    assert "dsgen's accounting" in result.stdout
    require_module("deepspeed")
    other = run_cli(["solve", str(EXAMPLE), "--accounting", "deepspeed-estimator"], capsys)
    assert other.exit_code == 0, other.stderr
    assert "DeepSpeed's own estimator" in other.stdout and "dsgen's accounting" not in other.stdout


# --- the API takes a mapping ------------------------------------------------------------------------


def test_load_spec_takes_a_mapping_and_names_the_key_path_without_a_line(tmp_path: Path) -> None:
    from dsgen.api import load_spec, solve_spec
    from dsgen.errors import DsgenError

    data = yaml.safe_load(EXAMPLE.read_text())
    from_file = solve_spec(load_spec(EXAMPLE))
    from_mapping = solve_spec(load_spec(data, ["training.sequence_length=4096"]))
    assert from_mapping.best is not None and from_file.best is not None
    assert from_mapping.best.plan == from_file.best.plan
    assert data == yaml.safe_load(EXAMPLE.read_text()), "the caller's mapping is not changed"
    data["hardware"]["gpus_per_node"] = -3
    with pytest.raises(DsgenError) as bad:
        load_spec(data)
    assert bad.value.render().startswith("hardware.gpus_per_node: ")
    assert bad.value.location.line is None


def test_load_spec_mapping_reads_local_files_from_base_dir(tmp_path: Path) -> None:
    from dsgen.api import load_spec

    config = {
        "model_type": "llama",
        "hidden_size": 512,
        "intermediate_size": 1376,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    data = {
        "model": {"hf_config": "config.json"},
        "hardware": {"gpu": "l4", "gpus_per_node": 1},
        "training": {"sequence_length": 512, "global_batch_size": 8},
    }
    spec = load_spec(data, base_dir=tmp_path)
    assert spec.model.num_layers == 4


# --- docs/cli.md's command list runs as written ----------------------------------------------------


def _use_section() -> str:
    """docs/cli.md: the list of every command, then the Python API (the README's tour links it)."""
    return (REPO_ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


def test_readme_use_commands_run_in_order_in_a_fresh_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ``dsgen`` line of docs/cli.md's command block, top to bottom (the first creates the
    spec.yaml the others read), then its Python API block. Installing completion would edit the
    shell's rc file."""
    import shlex
    import shutil

    shutil.copytree(REPO_ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    section = _use_section()
    shell = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line.split("  #", 1)[0]) for line in shell.splitlines() if line.startswith("dsgen ")]
    assert commands[0][:2] == ["dsgen", "init"], "the command list starts by creating the spec it uses"
    ran = 0
    for argv in commands:
        if "--install-completion" in argv:
            continue
        result = run_cli(argv[1:], capsys)
        assert result.exit_code == 0, (argv, result.stderr)
        ran += 1
    assert ran >= 10
    # the starter's plan may use AutoTP, whose config has no train_batch_size (DeepSpeed would count every
    # TP peer in it): its batch is micro x accumulation x data-parallel ranks (GPUs / autotp_size)
    config = json.loads((tmp_path / "out" / "ds.json").read_text())
    starter = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    gpus = starter["hardware"]["gpus_per_node"] * starter["hardware"].get("nodes", 1)
    data_parallel = gpus // config.get("tensor_parallel", {}).get("autotp_size", 1)
    batch = config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * data_parallel
    assert batch == starter["training"]["global_batch_size"]
    python = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(python, "docs/cli.md (From Python)", "exec"), namespace)
    assert (tmp_path / "runs" / "manifest.jsonl").is_file()
