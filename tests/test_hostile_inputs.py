"""Hostile and careless inputs (issue 14): each one ends in one clear message and its exit code,
within a memory cap and a time limit, never a traceback, a hang or a partial output.

Every case runs ``python -m dsgen`` in a subprocess whose address space is capped at
:data:`MEMORY_CAP` (``RLIMIT_AS``) and which is killed after :data:`TIME_LIMIT` seconds, so a
regression shows up as that case failing instead of taking the test run (or the machine) down.
The output-path cases that need two processes or a kill are at the end.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES_DIR, REPO_ROOT

MEMORY_CAP = 2 * 1024**3  # bytes of address space per dsgen process
TIME_LIMIT = 60  # seconds; every case takes about one on a busy 2-core machine

EXAMPLE = (EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml").read_text(encoding="utf-8")


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def dsgen(args: list[str], cwd: Path, timeout: float = TIME_LIMIT) -> subprocess.CompletedProcess[str]:
    """``python -m dsgen ARGS`` in ``cwd`` under the memory cap; a timeout fails the test."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "dsgen", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        preexec_fn=_cap_memory,
    )


# ---- the inputs ---------------------------------------------------------------------------------

Files = dict[str, str | bytes | None]  # name -> text, bytes, or None for a FIFO

# Nine levels of nine aliases: 9**9 = 387 million values from about 400 bytes.
ALIAS_BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)
FLOW_BOMB = (
    "[&a [1,1,1,1,1,1,1,1,1]"
    + "".join(f", &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]" for i in range(8))
    + "]"
)
HUGE_INT = "9" * 5000
ARCH = (
    "  architecture: {{hidden_size: {h}, num_layers: {n}, num_attention_heads: {a}, "
    "vocab_size: {v}, intermediate_size: {f}}}"
)
HF = (
    '{{"model_type": "llama", "hidden_size": {h}, "num_hidden_layers": {n}, "num_attention_heads": 32, '
    '"vocab_size": 32000, "intermediate_size": 11008}}'
)
NVME = "  nvme: {path: /local_nvme, capacity_gib: 2000}\n"
SWEEP = 'base: base.yaml\nname: "{name}"\ngrid:\n  hardware.nodes: [1, 2]\n'


def spec(old: str = "", new: str = "") -> str:
    return EXAMPLE.replace(old, new) if old else EXAMPLE


def line_of(text: str) -> int:
    """The 1-based line of the example spec that holds ``text``."""
    return next(i for i, line in enumerate(EXAMPLE.splitlines(), 1) if text in line)


def arch(h: int = 4096, n: int = 32, a: int = 32, v: int = 32000, f: int = 11008) -> str:
    return spec("  preset: llama-3.1-8b", ARCH.format(h=h, n=n, a=a, v=v, f=f))


def hf_spec(config: str) -> Files:
    return {"config.json": config, "s.yaml": spec("preset: llama-3.1-8b", "hf_config: config.json")}


def sweep(name: str, extra: str = "") -> Files:
    return {"base.yaml": EXAMPLE, "sw.yaml": SWEEP.format(name=name.replace('"', '\\"')) + extra}


DOCTOR_CONFIG = '{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}'
LLAMAFACTORY = "stage: dpo\nfinetuning_type: lora\nlora_rank: 16\nlora_target: q_proj,v_proj\ncutoff_len: 1024\n"


def run_files(name: str, content: str) -> Files:
    """The spec, a DeepSpeed config for the doctor, and one of the run's own files."""
    return {"s.yaml": spec(), "ds.json": DOCTOR_CONFIG, name: content}


def doctor_args(option: str, name: str) -> list[str]:
    return ["doctor", "ds.json", "--spec", "s.yaml", option, name]


@dataclass(frozen=True)
class Case:
    """One hostile input: the files it needs, the command, and what the user must see."""

    files: Files
    args: list[str]
    code: int
    message: str  # a substring of stderr (or, for validate's report, of stdout + stderr)
    setup: Callable[[Path], None] | None = None
    forbid: tuple[str, ...] = field(default=())  # substrings that must not appear (e.g. solved runs)


def _symlink(name: str, target: str) -> Callable[[Path], None]:
    return lambda d: os.symlink(target, d / name)


def _user_dir(d: Path) -> None:
    (d / "out").mkdir()
    (d / "out" / "thesis.tex").write_text("mine")


CASES: dict[str, Case] = {
    # -- spec files -------------------------------------------------------------------------------
    "spec-alias-bomb": Case({"s.yaml": spec() + ALIAS_BOMB}, ["solve", "s.yaml"], 2, "expands to more than 100,000"),
    "spec-self-referencing-alias": Case(
        {"s.yaml": spec() + "loop: &l [1, *l]\n"}, ["solve", "s.yaml"], 2, "refers to a mapping or list that contains"
    ),
    "spec-5000-digit-integer": Case(
        {"s.yaml": spec("global_batch_size: 256", f"global_batch_size: {HUGE_INT}")},
        ["solve", "s.yaml"],
        2,
        "more than 4,300 digits",
    ),
    "spec-global-batch-10**12": Case(
        {"s.yaml": spec("global_batch_size: 256", "global_batch_size: 1000000000000")},
        ["solve", "s.yaml"],
        0,
        "ZeRO-",
    ),
    "spec-global-batch-2**53": Case(
        {"s.yaml": spec("global_batch_size: 256", f"global_batch_size: {2**53}")}, ["solve", "s.yaml"], 0, "ZeRO-"
    ),
    "spec-global-batch-8-times-a-large-prime": Case(
        {"s.yaml": spec("global_batch_size: 256", f"global_batch_size: {8 * 1_000_000_007}")},
        ["solve", "s.yaml"],
        0,
        "ZeRO-",
    ),
    "spec-2**53-gpus-per-node": Case(
        {"s.yaml": spec("gpus_per_node: 8", f"gpus_per_node: {2**53}")},
        ["solve", "s.yaml"],
        2,
        "cannot be split evenly over 9007199254740992 data-parallel GPUs",
    ),
    "spec-10**15-nodes": Case(
        {"s.yaml": spec("nodes: 1", f"nodes: {10**15}")}, ["solve", "s.yaml"], 2, "cannot be split evenly"
    ),
    "spec-global-batch-above-2**53": Case(
        {"s.yaml": spec("global_batch_size: 256", f"global_batch_size: {2**56}")},
        ["solve", "s.yaml"],
        2,
        "training.global_batch_size: must be at most 2**53",
    ),
    "spec-hidden-size-10**30": Case(
        {"s.yaml": arch(h=10**30)}, ["solve", "s.yaml"], 2, "model.architecture.hidden_size: must be at most 2**53"
    ),
    "spec-10001-layers": Case(
        {"s.yaml": arch(n=10_001)}, ["solve", "s.yaml"], 2, "model.architecture.num_layers: must be an integer"
    ),
    "spec-every-dimension-at-its-bound": Case(
        {"s.yaml": arch(h=2**53, n=10_000, a=1, v=2**53, f=2**53)}, ["solve", "s.yaml"], 3, "does not fit"
    ),
    "spec-sequence-length-10**15": Case(
        {"s.yaml": spec("sequence_length: 4096", f"sequence_length: {10**15}")},
        ["solve", "s.yaml"],
        3,
        "does not fit",
    ),
    "spec-dev-zero": Case({}, ["solve", "/dev/zero"], 2, "/dev/zero: cannot read spec file: it is not a regular file"),
    "spec-dev-urandom": Case({}, ["solve", "/dev/urandom"], 2, "it is not a regular file"),
    "spec-fifo": Case({"fifo.yaml": None}, ["solve", "fifo.yaml"], 2, "it is not a regular file"),
    "spec-directory": Case({}, ["solve", "."], 2, "it is a directory"),
    "spec-3-MiB": Case({"s.yaml": spec() + "#" * (3 * 1024 * 1024)}, ["solve", "s.yaml"], 2, "larger than 2 MiB"),
    "spec-latin-1": Case({"s.yaml": spec().encode() + b"# caf\xe9\n"}, ["solve", "s.yaml"], 2, "not UTF-8"),
    "spec-python-tag": Case(
        {"s.yaml": spec("path: ds_config.json", "path: !!python/name:os.system")},
        ["solve", "s.yaml"],
        2,
        "unsupported YAML",
    ),
    "spec-100k-deep-nesting": Case({"s.yaml": "a: " + "[" * 100_000 + "]" * 100_000}, ["solve", "s.yaml"], 2, "error:"),
    "spec-pin-zero1-with-nvme-optimizer-offload": Case(
        {
            "s.yaml": spec("constraints:", "constraints:\n  zero_stage: 1\n  offload_optimizer: nvme").replace(
                "  cpu_memory_gib: 1024          # per node\n", "  cpu_memory_gib: 1024\n" + NVME
            )
        },
        ["solve", "s.yaml"],
        2,
        "leave no plan to search: optimizer offload to NVMe needs ZeRO-3",
        forbid=("min() arg",),
    ),
    "spec-pin-adafactor-with-zero3-param-offload": Case(
        {
            "s.yaml": spec("constraints:", "constraints:\n  zero_stage: 3\n  offload_param: cpu").replace(
                "type: adamw", "type: adafactor"
            )
        },
        ["solve", "s.yaml"],
        2,
        "leave no plan to search: parameter offload needs optimizer offload",
        forbid=("min() arg",),
    ),
    "hf-config-5000-digit-integer": Case(
        hf_spec(HF.format(h=HUGE_INT, n=32)), ["solve", "s.yaml"], 2, "config.json: invalid JSON"
    ),
    "hf-config-hidden-size-10**300": Case(
        hf_spec(HF.format(h=10**300, n=32)), ["solve", "s.yaml"], 2, "hidden_size: must be at most 2**53"
    ),
    "hf-config-10**7-layers": Case(
        hf_spec(HF.format(h=4096, n=10**7)), ["solve", "s.yaml"], 2, "num_hidden_layers: must be at most 10,000"
    ),
    "hf-config-is-dev-zero": Case(
        {"s.yaml": spec("preset: llama-3.1-8b", "hf_config: /dev/zero")},
        ["solve", "s.yaml"],
        2,
        f"s.yaml:{line_of('preset: llama-3.1-8b')}: model.hf_config: file not found: /dev/zero",
    ),
    # -- --set ------------------------------------------------------------------------------------
    "set-alias-bomb": Case(
        {"s.yaml": spec()}, ["solve", "s.yaml", "--set", f"training.x={FLOW_BOMB}"], 2, "expands to more than 100,000"
    ),
    "set-self-referencing-alias": Case(
        {"s.yaml": spec()},
        ["solve", "s.yaml", "--set", "training.x=&a [*a]"],
        2,
        "refers to a mapping or list that contains it",
    ),
    "set-5000-digit-integer": Case(
        {"s.yaml": spec()},
        ["solve", "s.yaml", "--set", f"training.global_batch_size={HUGE_INT}"],
        2,
        "more than 4,300 digits",
    ),
    "set-global-batch-10**12": Case(
        {"s.yaml": spec()}, ["solve", "s.yaml", "--set", "training.global_batch_size=1000000000000"], 0, "ZeRO-"
    ),
    "set-2**53-gpus-per-node": Case(
        {"s.yaml": spec()},
        ["solve", "s.yaml", "--set", f"hardware.gpus_per_node={2**53}"],
        2,
        "cannot be split evenly",
    ),
    "set-python-tag": Case(
        {"s.yaml": spec()},
        ["solve", "s.yaml", "--set", "training.x=!!python/name:os.system"],
        2,
        "unsupported YAML value",
    ),
    # -- validate ---------------------------------------------------------------------------------
    "validate-5000-digit-integer": Case(
        {"c.json": f'{{"train_batch_size": {HUGE_INT}}}'}, ["validate", "c.json"], 2, "integer of 5000 digits"
    ),
    "validate-float-overflow": Case(
        {"c.json": '{"train_batch_size": 1e400}'}, ["validate", "c.json"], 2, "out of range"
    ),
    "validate-dev-zero": Case(
        {}, ["validate", "/dev/zero"], 2, "/dev/zero: cannot read file: it is not a regular file"
    ),
    "validate-dev-urandom": Case({}, ["validate", "/dev/urandom"], 2, "it is not a regular file"),
    "validate-fifo": Case({"fifo.json": None}, ["validate", "fifo.json"], 2, "it is not a regular file"),
    "validate-directory": Case({}, ["validate", "."], 2, "it is a directory"),
    "validate-50-MB-string": Case(
        {"c.json": '{"train_batch_size": 8, "x": "' + "a" * 50_000_000 + '"}'},
        ["validate", "c.json"],
        2,
        "larger than 2 MiB",
    ),
    "validate-a-million-tokens-under-the-cap": Case(
        {"c.json": '{"train_batch_size": 8, "x": [' + ",".join(["1"] * 900_000) + "]}"},
        ["validate", "c.json"],
        0,
        "0 errors",
    ),
    "validate-100k-deep-nesting": Case(
        {"c.json": "[" * 100_000 + "]" * 100_000}, ["validate", "c.json"], 2, "nesting is too deep"
    ),
    "validate-utf-16": Case(
        {"c.json": '{"train_batch_size": 8}'.encode("utf-16")}, ["validate", "c.json"], 2, "not UTF-8"
    ),
    # -- sweeps -----------------------------------------------------------------------------------
    "sweep-alias-bomb": Case(sweep("r{{ index }}", ALIAS_BOMB), ["sweep", "sw.yaml", "-o", "out"], 2, "100,000"),
    "sweep-name-division-by-zero": Case(
        sweep("{{ 1/0 }}"), ["sweep", "sw.yaml", "-o", "out"], 2, "failed for run 0: ZeroDivisionError"
    ),
    "sweep-name-include": Case(
        sweep("{% include 'x' %}"), ["sweep", "sw.yaml", "-o", "out"], 2, "name template \"{% include 'x' %}\" failed"
    ),
    "sweep-name-range-10**9": Case(
        sweep("{% for i in range(10**9) %}{% endfor %}r{{ index }}"),
        ["sweep", "sw.yaml", "-o", "out"],
        2,
        "calls with numbers over 4096",
    ),
    "sweep-name-nested-loops": Case(
        sweep(
            "{% for i in range(4000) %}{% for j in range(4000) %}{% for k in range(4000) %}"
            "{% endfor %}{% endfor %}{% endfor %}r{{ index }}"
        ),
        ["sweep", "sw.yaml", "-o", "out"],
        2,
        "rendering took more than 1 s",
    ),
    "sweep-name-recursive-macro": Case(
        sweep("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
        ["sweep", "sw.yaml", "-o", "out"],
        2,
        "name template",
    ),
    "sweep-name-string-times-10**10": Case(
        sweep("{{ 'a'*10**10 }}"), ["sweep", "sw.yaml", "-o", "out"], 2, "'*' would build a value longer than 4096"
    ),
    "sweep-name-power-tower": Case(
        sweep("{{ 10**(10**10) }}"), ["sweep", "sw.yaml", "-o", "out"], 2, "exponent over 256"
    ),
    "sweep-name-printf-width": Case(
        sweep("{{ '%0999999999d' % 1 }}"), ["sweep", "sw.yaml", "-o", "out"], 2, "format widths"
    ),
    "sweep-name-format-width": Case(
        sweep("{{ '{:>999999999}'.format(1) }}"), ["sweep", "sw.yaml", "-o", "out"], 2, "format widths"
    ),
    "sweep-name-center-filter": Case(
        sweep("{{ 'a'|center(10**10) }}"), ["sweep", "sw.yaml", "-o", "out"], 2, "calls with numbers over 4096"
    ),
    "sweep-name-300-characters": Case(
        sweep("{{ 'a' * 300 }}{{ index }}"),
        ["sweep", "sw.yaml", "-o", "out"],
        2,
        "run 0 gets a name of 301 characters; at most 255",
        forbid=("[1/2]",),
    ),
    "sweep-name-manifest-jsonl": Case(
        sweep("manifest.jsonl"),
        ["sweep", "sw.yaml", "-o", "out"],
        2,
        "'manifest.jsonl', which dsgen uses",
        forbid=("[1/2]",),
    ),
    "sweep-name-manifest-csv": Case(
        sweep("manifest.csv"),
        ["sweep", "sw.yaml", "-o", "out"],
        2,
        "'manifest.csv', which dsgen uses",
        forbid=("[1/2]",),
    ),
    "sweep-name-marker-file": Case(
        sweep(".dsgen-output"), ["sweep", "sw.yaml", "-o", "out"], 2, "'.dsgen-output', which dsgen uses"
    ),
    "sweep-name-path-traversal": Case(
        sweep("../r{{ index }}"), ["sweep", "sw.yaml", "-o", "out"], 2, "unsafe directory name"
    ),
    "sweep-grid-of-a-million-runs": Case(
        {
            "base.yaml": EXAMPLE,
            "sw.yaml": 'base: base.yaml\nname: "r{{ index }}"\ngrid:\n'
            f"  hardware.nodes: [{','.join(map(str, range(1, 1001)))}]\n"
            f"  training.sequence_length: [{','.join(map(str, range(1000, 2000)))}]\n",
        },
        ["sweep", "sw.yaml", "-o", "out"],
        2,
        "the sweep expands to 1,000,000 runs, more than the limit of 10,000",
    ),
    "sweep-over-max-runs": Case(
        sweep("r{{ index }}"),
        ["sweep", "sw.yaml", "-o", "out", "--max-runs", "1"],
        2,
        "2 runs, more than the limit of 1",
    ),
    "sweep-base-latin-1": Case(
        {"base.yaml": b"\xff model: x\n", "sw.yaml": SWEEP.format(name="r{{ index }}")},
        ["sweep", "sw.yaml", "-o", "out"],
        2,
        "cannot read base spec base.yaml: base spec file is not UTF-8",
    ),
    "sweep-base-dev-zero": Case(
        {"sw.yaml": SWEEP.format(name="r{{ index }}").replace("base.yaml", "/dev/zero")},
        ["sweep", "sw.yaml", "-o", "out"],
        2,
        "not a regular file",
    ),
    "sweep-file-fifo": Case({"sw.yaml": None}, ["sweep", "sw.yaml", "-o", "out"], 2, "not a regular file"),
    # -- output paths -----------------------------------------------------------------------------
    "new-onto-a-dangling-symlink": Case(
        {"s.yaml": spec()},
        ["new", "s.yaml", "-o", "ds.json"],
        2,
        "ds.json already exists",
        setup=_symlink("ds.json", "nowhere/target.json"),
    ),
    "new-onto-a-fifo-with-force": Case(
        {"s.yaml": spec(), "pipe": None},
        ["new", "s.yaml", "-o", "pipe", "--force"],
        2,
        "exists and is not a regular file",
    ),
    "new-onto-a-directory-with-force": Case(
        {"s.yaml": spec()}, ["new", "s.yaml", "-o", ".", "--force"], 2, "is a directory"
    ),
    "sweep-force-onto-the-users-directory": Case(
        sweep("r{{ index }}"),
        ["sweep", "sw.yaml", "-o", "out", "--force"],
        2,
        "is not a directory dsgen wrote (no .dsgen-output file); --force will not delete it",
        setup=_user_dir,
        forbid=("[1/2]",),
    ),
    "sweep-onto-a-symlink-without-force": Case(
        sweep("r{{ index }}"),
        ["sweep", "sw.yaml", "-o", "out"],
        2,
        "out already exists",
        setup=_symlink("out", "elsewhere"),
    ),
    # -- the run's own files, read by the doctor (issue 48: each of these exited 70) ----------------
    "doctor-llamafactory-stage-list": Case(
        run_files("lf.yaml", LLAMAFACTORY.replace("stage: dpo", "stage: [sft]")),
        doctor_args("--llamafactory", "lf.yaml"),
        2,
        "lf.yaml:1: stage: must be one of",
    ),
    "doctor-llamafactory-stage-mapping": Case(
        run_files("lf.yaml", LLAMAFACTORY.replace("stage: dpo", "stage: {sft: 1}")),
        doctor_args("--llamafactory", "lf.yaml"),
        2,
        "lf.yaml:1: stage: must be one of",
    ),
    "doctor-llamafactory-null-rank": Case(
        run_files("lf.yaml", LLAMAFACTORY.replace("lora_rank: 16", "lora_rank: null")),
        doctor_args("--llamafactory", "lf.yaml"),
        2,
        "lf.yaml:3: lora_rank: must be an integer",
        forbid=("lora_rank: lora_rank",),
    ),
    **{
        f"doctor-training-args-null-{key}": Case(
            run_files("args.json", json.dumps({"learning_rate": 1e-05, key: None}, indent=2)),
            doctor_args("--training-args", "args.json"),
            2,
            f"args.json:3: {key}: must be an integer",
        )
        for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "per_device_eval_batch_size")
    },
}


def _materialise(files: Files, where: Path) -> None:
    for name, content in files.items():
        path = where / name
        if content is None:
            os.mkfifo(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def test_there_are_at_least_forty_named_hostile_inputs() -> None:
    assert len(CASES) >= 40
    areas = {name.split("-")[0] for name in CASES}
    assert {"spec", "set", "validate", "sweep", "new", "doctor"} <= areas


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    _materialise(case.files, tmp_path)
    if case.setup:
        case.setup(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    start = time.monotonic()
    result = dsgen(case.args, tmp_path)
    seconds = time.monotonic() - start
    shown = result.stderr + result.stdout
    assert "Traceback" not in shown, shown[-3000:]
    assert "internal error" not in shown, shown[-3000:]
    assert result.returncode == case.code, f"exit {result.returncode} after {seconds:.1f} s: {shown[-2000:]}"
    assert case.message in shown, shown[-2000:]
    for text in case.forbid:
        assert text not in shown, shown[-2000:]
    if case.code != 0:  # a refused command writes nothing, not even a hidden staging file
        assert sorted(p.name for p in tmp_path.iterdir()) == before


# ---- output paths that need two processes or a kill ---------------------------------------------


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, "-m", "dsgen", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_cap_memory,
    )


@pytest.mark.parametrize("command", ["new", "sweep"])
def test_two_concurrent_writers_without_force_one_fails(command: str, tmp_path: Path) -> None:
    _materialise(sweep("r{{ index }}") | {"s.yaml": spec()}, tmp_path)
    args = ["new", "s.yaml", "-o", "ds.json"] if command == "new" else ["sweep", "sw.yaml", "-o", "out"]
    for _attempt in range(5):  # the two must overlap; retry if one finished before the other began
        first, second = _start(args, tmp_path), _start(args, tmp_path)
        results = [(p.wait(timeout=TIME_LIMIT), p.communicate()) for p in (first, second)]
        codes = sorted(code for code, _ in results)
        assert codes == [0, 2], results
        failed = next(err for code, (_, err) in results if code == 2)
        assert "already exists" in failed and "Traceback" not in failed
        leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
        assert leftovers == [], leftovers
        if "written while dsgen was working" in failed:
            break  # the race itself was exercised: both passed the early check
        target = tmp_path / ("ds.json" if command == "new" else "out")
        if target.is_dir():
            for child in sorted(target.rglob("*"), reverse=True):
                child.unlink() if not child.is_dir() else child.rmdir()
            target.rmdir()
        else:
            target.unlink()


def test_a_killed_sweep_leaves_no_staging_that_survives_the_next_run(tmp_path: Path) -> None:
    """SIGKILL during publishing leaves ``.out.dsgen-staging-<pid>-*``; the next run removes it."""
    _materialise(sweep("r{{ index }}"), tmp_path)
    stale_pid = _dead_pid()
    stale = tmp_path / f".out.dsgen-staging-{stale_pid}-abc123"
    stale.mkdir()
    (stale / "manifest.jsonl").write_text("{}\n")
    # and a real kill, mid-run (whatever stage it reached)
    victim = _start(["sweep", "sw.yaml", "-o", "out"], tmp_path)
    time.sleep(0.5)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=TIME_LIMIT)
    if (tmp_path / "out").exists():  # it finished first: make the next run a replacement
        args = ["sweep", "sw.yaml", "-o", "out", "--force"]
    else:
        args = ["sweep", "sw.yaml", "-o", "out"]
    result = dsgen(args, tmp_path)
    assert result.returncode == 0, result.stderr
    hidden = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert hidden == [], hidden
    assert (tmp_path / "out" / "manifest.jsonl").is_file() and (tmp_path / "out" / ".dsgen-output").is_file()


def _dead_pid() -> int:
    """The id of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_an_unexpected_exception_is_one_line_and_exit_70(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.cli_helpers import run_cli

    def broken(*args: object, **kwargs: object) -> object:
        raise KeyError("a bug")

    monkeypatch.setattr("dsgen.api.solve_spec", broken)
    path = tmp_path / "s.yaml"
    path.write_text(spec(), encoding="utf-8")
    result = run_cli(["solve", str(path)], capsys)
    assert result.exit_code == 70
    assert result.stderr.strip().splitlines() == [
        "error: internal error: KeyError: 'a bug' (a bug in dsgen; rerun with --debug for the traceback)"
    ]
    with pytest.raises(KeyError):
        run_cli(["solve", str(path), "--debug"], capsys)
