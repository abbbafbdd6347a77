"""Real DeepSpeed as the test oracle for dsgen's rendered configs.

dsgen's own validator encodes what we *believe* DeepSpeed accepts; these helpers ask DeepSpeed
itself, so a test can prove a rendered config is accepted (or rejected) by the pinned version:

* :func:`parse_with_deepspeed` / :func:`deepspeed_verdict` - in-process and cheap (milliseconds
  after a one-off ~3 s import): builds ``deepspeed.runtime.config.DeepSpeedConfig`` exactly as
  ``deepspeed.initialize`` would on a job with ``dp_size`` data-parallel ranks. This covers the
  removed-key checks, the pydantic sections (unknown keys, types) and the batch arithmetic, which
  depends on the data-parallel world size - hence the simulated world size.
* :func:`train_steps` - out-of-process and slow (seconds per run, plus a one-off JIT build of
  DeepSpeed's CPU ops): launches ``tests/ds_train_worker.py`` under ``torchrun`` on DeepSpeed's
  CPU accelerator and runs real optimizer steps. This catches what only engine construction and
  training reveal (ZeRO stage x precision x optimizer x offload combinations).

Every launch here (:func:`run_torchrun`, :func:`launch_script`) gives its ranks a fresh report
directory (:mod:`tests.rank_reports`): what a test checks comes back through one file per rank,
never parsed from the ranks' shared stdout, where lines from several processes interleave.

This is a support module, not a test file; ``deepspeed`` and ``transformers`` are imported
lazily so that collecting the test suite stays fast and works without them installed (tests
guard themselves with ``conftest.require_module``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tests import rank_reports

WORKER = Path(__file__).resolve().parent / "ds_train_worker.py"

# Keep in sync with ds_train_worker.STEP_REPORT / DONE_REPORT (the worker is not importable
# here without importing torch, which would defeat the lazy imports).
STEP_REPORT = "step"
DONE_REPORT = "done"

# Loads (JIT-building on first use) DeepSpeed CPU ops by builder class name, as the worker would.
_PREBUILD_PROGRAM = """
import sys
from deepspeed.accelerator import get_accelerator
for name in sys.argv[1:]:
    builder = get_accelerator().create_op_builder(name)
    if builder is not None and builder.is_compatible(verbose=False):
        builder.load(verbose=False)
        print(f"built {name}", flush=True)
"""
_BUILT_OPS: set[str] = set()
_BUILD_LOCK = threading.Lock()

# Serialises the monkeypatching of deepspeed.comm: the patch is process-global, so two threads
# parsing with different dp sizes at once would otherwise see each other's world size.
_PATCH_LOCK = threading.Lock()


@functools.cache
def _deepspeed_config_module() -> ModuleType:
    """Import ``deepspeed.runtime.config`` once per process (the import costs ~3 s).

    ``DS_ACCELERATOR`` is pinned to ``cpu`` first (unless the caller already chose one, or
    DeepSpeed was imported earlier) so the in-process parse sees the same accelerator as CI and
    as the training worker, even on a developer machine that has a GPU.
    """
    if "deepspeed" not in sys.modules:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.runtime.config as ds_config

    return ds_config


@contextlib.contextmanager
def _simulated_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """Make DeepSpeed's comm layer report ``world_size``/``rank`` for the duration.

    ``DeepSpeedConfig.__init__`` asks ``deepspeed.comm`` for the world size to derive and check
    the batch triple; without an initialised process group it silently falls back to 1, which
    would make every multi-rank batch check wrong. Patching the module ``DeepSpeedConfig`` itself
    calls (``deepspeed.runtime.config.dist``) works whether or not torch.distributed is
    initialised, and needs no process group at all.
    """
    dist = _deepspeed_config_module().dist
    with _PATCH_LOCK:
        saved = dist.get_world_size, dist.get_rank
        dist.get_world_size = lambda group=None: world_size
        dist.get_rank = lambda group=None: rank
        try:
            yield
        finally:
            dist.get_world_size, dist.get_rank = saved


def _world_for(config: dict[str, Any], dp_size: int, world_size: int | None) -> int:
    """The world size under which DeepSpeed computes ``dp_size`` data-parallel ranks for ``config``.

    Without an ``mpu``, DeepSpeed takes the data-parallel size to be
    ``world / sequence_parallel_size`` when the config has ``sequence_parallel_size`` and the
    whole world otherwise (reference §5.3), so the simulated world is ``dp_size * sp``.
    """
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if world_size is not None:
        return world_size
    sp = config.get("sequence_parallel_size")
    # Anything but a positive int is DeepSpeed's to reject, with the plain dp world.
    return dp_size * sp if isinstance(sp, int) and not isinstance(sp, bool) and sp > 0 else dp_size


def parse_with_deepspeed(config: dict[str, Any], dp_size: int, *, world_size: int | None = None) -> Any:
    """Construct ``DeepSpeedConfig(config)`` as a job with ``dp_size`` data-parallel ranks sees it.

    Raises whatever DeepSpeed raises (``AssertionError`` for the batch triple, pydantic's
    ``ValidationError`` for bad keys/types, ``DeepSpeedConfigError`` for removed keys, ...).
    Returns the ``DeepSpeedConfig`` so a test can also check what DeepSpeed derived (e.g.
    ``.gradient_accumulation_steps``, ``.world_size``).

    ``world_size`` overrides the simulated world (by default ``dp_size``, times
    ``sequence_parallel_size`` if the config has one) for cases where DeepSpeed's own derivation
    is under test, e.g. AutoTP, where ``DeepSpeedConfig`` sees the full world, not world / tp.

    The caller's dict is deep-copied first: DeepSpeed keeps the dict it gets and its sections
    may normalise it; the caller's config must stay what dsgen rendered.
    """
    world = _world_for(config, dp_size, world_size)
    ds_config = _deepspeed_config_module()
    with _simulated_world(world):
        return ds_config.DeepSpeedConfig(copy.deepcopy(config))


def deepspeed_verdict(config: dict[str, Any], dp_size: int, *, world_size: int | None = None) -> tuple[bool, str]:
    """``(accepted, error text)`` from :func:`parse_with_deepspeed`; error text is ``""`` if accepted.

    For property tests that compare dsgen's validator with DeepSpeed's verdict. The text is
    ``"<ExceptionType>: <message>"`` so a mismatch report says what DeepSpeed objected to. Only
    exceptions from DeepSpeed's parse are caught: a bad ``dp_size`` or failing to import
    DeepSpeed is a harness error, not a verdict.
    """
    world = _world_for(config, dp_size, world_size)
    ds_config = _deepspeed_config_module()
    try:
        with _simulated_world(world):
            ds_config.DeepSpeedConfig(copy.deepcopy(config))
    except Exception as exc:  # DeepSpeed raises many unrelated types; all mean "rejected"
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


@dataclass
class TrainResult:
    """Outcome of one :func:`train_steps` run.

    ``log`` is the combined stdout+stderr of torchrun and every rank, so an assertion message
    built from it shows DeepSpeed's own traceback. ``info`` holds the worker's final report
    (optimizer class, parameter dtype, ZeRO stage, ...) so tests can check DeepSpeed ran the
    code path the config asked for, not just that it did not crash.
    """

    returncode: int
    losses: list[float]
    log: str
    info: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    timed_out: bool = False
    build_s: float = 0.0  # time spent JIT-building DeepSpeed ops before the run (0 when cached)

    @property
    def ok(self) -> bool:
        """Exited 0 and every reported loss is finite."""
        return self.returncode == 0 and all(math.isfinite(x) for x in self.losses)

    def describe(self) -> str:
        """One-line summary plus the full log, for assertion messages."""
        head = (
            f"returncode={self.returncode} timed_out={self.timed_out} losses={self.losses} "
            f"info={self.info} duration={self.duration_s:.1f}s build={self.build_s:.1f}s"
        )
        return f"{head}\n--- torchrun log ---\n{self.log}"


def _losses(steps: list[dict[str, Any]]) -> list[float]:
    """The mean loss of each optimizer step, in step order, from rank 0's step reports."""
    by_step = {int(r["step"]): float(r["loss"]) for r in steps}
    return [by_step[k] for k in sorted(by_step)]


def _info(done: list[dict[str, Any]]) -> dict[str, str]:
    """Rank 0's final report as strings (empty when the run ended before it)."""
    return {key: str(value) for key, value in done[-1].items()} if done else {}


def worker_env() -> dict[str, str]:
    """Environment for torchrun and its ranks (run_torchrun, prebuild_ops).

    * ``DS_ACCELERATOR=cpu``: the oracle always exercises the CPU code paths CI has.
    * this interpreter's ``bin`` first on ``PATH``: DeepSpeed JIT-builds its CPU ops with the
      ``ninja`` found on PATH, and the pip ``ninja`` (a DeepSpeed dependency) lives there. It also
      keeps the build cache valid: ninja 1.13 (pip) and older system ninjas hash build commands
      differently, so alternating between them rebuilds every op (~1 min each) every time.
    * ``OMP_NUM_THREADS=1``: what torchrun would pick anyway; set explicitly to skip its banner.
    * offline Hugging Face: the tiny model is built from a config; nothing may be downloaded.
    """
    env = dict(os.environ)
    env.update(
        DS_ACCELERATOR="cpu",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    # A test run inside another distributed job must not make torchrun join it.
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


#: What a rank prints when it aborts in gloo's teardown (SIGABRT; issue 20 and tests/hf_trainer_script.py).
GLOO_ABORT = "terminate called without an active exception"


def launch_script(bundle_dir: Path, script: Path | None, args: list[str], *, cwd: Path) -> tuple[int, str]:
    """Start a rendered bundle's own ``launch.sh`` with ``script`` as its training script (the
    bundle reads ``TRAIN_SCRIPT``; None for the trl target, which runs TRL's own) on this machine's
    CPU ranks: (exit status, log), the log also written to ``cwd/launch.log``. The ranks' reports
    are then ``rank_reports.read(cwd, kind)``."""
    from tests.conftest import free_port

    prebuild_ops(["ShareMemCommBuilder", "FusedAdamBuilder"])
    env = worker_env()
    env.update(MASTER_PORT=str(free_port()), **rank_reports.prepare(cwd))
    if script is not None:
        env["TRAIN_SCRIPT"] = str(script)
    proc = subprocess.run(
        [str(bundle_dir / "launch.sh"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    log = proc.stdout + proc.stderr
    (cwd / "launch.log").write_text(log)
    return proc.returncode, log


def run_launch_script(bundle_dir: Path, script: Path | None, args: list[str], *, cwd: Path) -> str:
    """:func:`launch_script` that fails the test unless every rank exits 0; returns the log."""
    returncode, log = launch_script(bundle_dir, script, args, cwd=cwd)
    assert returncode == 0, log[-6000:]
    return log


def _ops_for(config: dict[str, Any]) -> list[str]:
    """The DeepSpeed CPU op builders a training run with ``config`` will load (best effort).

    Every CPU run loads the shared-memory comm op (``TorchBackend``); Adam/AdamW use the CPU
    ``FusedAdam`` op, or ``DeepSpeedCPUAdam`` with optimizer offload. A miss only costs speed:
    the worker JIT-builds anything not built here, within the run's own timeout.
    """
    ops = ["ShareMemCommBuilder"]
    zero = config.get("zero_optimization")
    offload = isinstance(zero, dict) and isinstance(zero.get("offload_optimizer"), dict)
    offload = offload and zero["offload_optimizer"].get("device") in ("cpu", "nvme")
    optimizer = config.get("optimizer")
    kind = str(optimizer.get("type", "")).lower() if isinstance(optimizer, dict) else ""
    if kind in ("adam", "adamw"):
        ops.append("CPUAdamBuilder" if offload else "FusedAdamBuilder")
    return ops


def prebuild_ops(ops: list[str], *, timeout: float = 1800) -> tuple[float, str]:
    """JIT-build DeepSpeed CPU ops once per process, outside any training run's timeout.

    The first build of each op takes about a minute on two idle cores (several when the machine
    is busy) and the ranks of a run wait for it, so without this the first training test's
    timeout would have to cover compilation. It runs in a subprocess with the same environment
    as the worker (same ``ninja``, same flags), so the worker then finds the ops in the torch
    extensions cache. Returns ``(seconds spent, log)``; failures are not raised - the training run
    that follows meets the same build error and reports it with DeepSpeed's context.
    """
    with _BUILD_LOCK:
        missing = [op for op in ops if op not in _BUILT_OPS]
        if not missing:
            return 0.0, ""
        start = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _PREBUILD_PROGRAM, *missing],
                env=worker_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.output if isinstance(exc.output, str) else ""
            return time.monotonic() - start, f"[ds_oracle] op prebuild timed out after {timeout:.0f}s\n{out}"
        if proc.returncode == 0:
            _BUILT_OPS.update(missing)
            return time.monotonic() - start, ""
        return time.monotonic() - start, f"[ds_oracle] op prebuild failed ({proc.returncode}):\n{proc.stdout}"


def run_torchrun(args: list[str], *, ranks: int, cwd: Path, timeout: float) -> tuple[int, str, bool, float]:
    """Run ``torchrun --standalone --nproc_per_node=RANKS ARGS`` in :func:`worker_env`.

    Returns ``(return code, combined log, timed out, seconds)``; never raises for a failed run.
    torchrun gets its own session (process group), so a timeout kills it *and* every rank it
    spawned; the log then ends with a line saying so. The ranks' reports are then
    ``rank_reports.read(cwd, kind)``.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *args]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**worker_env(), **rank_reports.prepare(cwd)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    timed_out = False
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        log += f"\n[ds_oracle] killed after {timeout:.0f}s timeout\n"
    return proc.returncode, log, timed_out, time.monotonic() - start


class OracleRunError(RuntimeError):
    """A torchrun oracle run failed, timed out or did not report every rank. The message ends with
    the log tail; ``log`` holds all of it."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


def merge_config(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` laid over it, nested mappings merged key by key (a case's
    ``ds_config_overrides``)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def measure_case(
    worker: Path,
    record_kind: str,
    case: dict[str, Any],
    *,
    ranks: int,
    timeout: float,
    what: str,
    ops: list[str] | None = None,
) -> list[dict[str, Any]]:
    """One case's records: :func:`measure_cases` with a single case."""
    return measure_cases(worker, record_kind, [case], ranks=ranks, timeout=timeout, what=what, ops=ops)[0]


def measure_cases(
    worker: Path,
    record_kind: str,
    cases: list[dict[str, Any]],
    *,
    ranks: int,
    timeout: float,
    what: str,
    ops: list[str] | None = None,
) -> list[list[dict[str, Any]]]:
    """Run ``worker --case CASES.json`` once on ``ranks`` CPU ranks for every case in ``cases``
    (each holds its ``ds_config``) and return, per case, the one record per rank it reports as
    ``record_kind``: the launch and parse every measuring harness shares (``finetune_oracle``,
    ``mp_oracle``, ``grpo_worker``).

    One launch for several cases saves each further case the start of a torchrun job (the ranks'
    imports of torch, transformers and DeepSpeed, the process group): the worker runs the cases in
    turn in the same processes and tags each record with its ``case_index``. A worker given one
    case (a JSON object, not a list) reports untagged records.

    DeepSpeed's CPU ops the configs need (``ops``; by default read from each case's ``ds_config``,
    for a worker that composes its own config) are built first (:func:`prebuild_ops`). Raises
    :class:`OracleRunError`, naming ``what`` ran, if torchrun fails, times out, or not every rank
    reports every case. Each record also gets ``run_wall_s`` (the torchrun wall time) and
    ``prebuild_s``."""
    if ops is None:
        ops = sorted({op for case in cases for op in _ops_for(case["ds_config"])})
    build_s, build_log = prebuild_ops(ops)
    with tempfile.TemporaryDirectory(prefix="dsgen_oracle_") as tmp:
        case_path = Path(tmp) / "case.json"
        case_path.write_text(json.dumps(cases if len(cases) > 1 else cases[0], indent=2))
        returncode, log, timed_out, duration = run_torchrun(
            [str(worker), "--case", str(case_path)], ranks=ranks, cwd=Path(tmp), timeout=timeout * len(cases)
        )
        records = rank_reports.read(Path(tmp), record_kind)  # one file per rank (tests/rank_reports.py)
    by_case: list[list[dict[str, Any]]] = [[] for _ in cases]
    for record in records:
        by_case[record.pop("case_index", 0) if len(cases) > 1 else 0].append(record)
    for case_records in by_case:
        case_records.sort(key=lambda r: r["rank"])
    reported = [[r["rank"] for r in case_records] for case_records in by_case]
    if returncode != 0 or timed_out or any(ranks_seen != list(range(ranks)) for ranks_seen in reported):
        raise OracleRunError(
            f"{what} run failed: returncode={returncode} timed_out={timed_out} ranks reported per case={reported} "
            f"duration={duration:.1f}s\n--- log tail ---\n{(build_log + log)[-8000:]}",
            build_log + log,
        )
    for case_records in by_case:
        for record in case_records:
            record["run_wall_s"] = round(duration, 2)
            record["prebuild_s"] = round(build_s, 2)
    return by_case


@dataclass(frozen=True)
class TrainCase:
    """One :func:`train_cases` run: ``config``'s training for ``steps`` optimizer steps.

    The config's batch keys must be for the launch's data-parallel ranks
    (``train_batch_size == micro * accumulation * ranks``); the worker runs
    ``gradient_accumulation_steps`` micro-batches per step, as DeepSpeed counts them.
    ``checkpointing`` turns on HF activation checkpointing in the model, as a plan with
    activation checkpointing would (DeepSpeed's own ``activation_checkpointing`` config section
    only affects ``deepspeed.checkpointing`` users, so the config alone cannot express it).
    ``client_optimizer`` (``"adafactor"``) makes the worker build that optimizer and pass it to
    ``deepspeed.initialize``, as the script must when the config has no optimizer block."""

    config: dict[str, Any]
    steps: int = 2
    model: str = "tiny-llama"
    checkpointing: bool = False
    seq_len: int = 32
    client_optimizer: str | None = None


def train_cases(cases: list[TrainCase], *, tmp_path: Path, ranks: int = 2, timeout: float = 600) -> list[TrainResult]:
    """Train every case in one torchrun launch on ``ranks`` CPU processes: the worker runs them in
    turn in the same rank processes (undoing what each leaves behind, ``tests/worker_state.py``),
    which spares each further case the ranks' imports and process-group start.

    A case's ``returncode`` is 0 when its run completed: the launch exited 0, or the case is not
    the last and reported its end (rank 0 reports it after every rank has passed the case's closing
    barrier); otherwise it is the launch's. Every result carries the whole launch's log.
    Never raises for a failed run. ``timeout`` is per case and covers the run only: the DeepSpeed
    ops the configs need are built first by :func:`prebuild_ops` (once per process, with its own
    timeout; ``build_s`` says how long). On timeout the whole process group is killed."""
    build_s, build_log = prebuild_ops(sorted({op for case in cases for op in _ops_for(case.config)}))
    tmp_path.mkdir(parents=True, exist_ok=True)
    listed = []
    for index, case in enumerate(cases):
        config_path = tmp_path / f"ds_config.{index}.json"
        config_path.write_text(json.dumps(case.config, indent=2))
        listed.append(
            {
                "config_path": str(config_path),
                "steps": case.steps,
                "model": case.model,
                "seq_len": case.seq_len,
                "activation_checkpointing": case.checkpointing,
                "client_optimizer": case.client_optimizer,
            }
        )
    cases_path = tmp_path / "cases.json"
    cases_path.write_text(json.dumps(listed, indent=2))
    # cwd: anything DeepSpeed writes relative to it lands in the test's tmp dir
    returncode, log, timed_out, duration = run_torchrun(
        [str(WORKER), "--cases", str(cases_path)], ranks=ranks, cwd=tmp_path, timeout=timeout * len(cases)
    )
    log = build_log + log
    (tmp_path / "train.log").write_text(log)
    steps: list[list[dict[str, Any]]] = [[] for _ in cases]
    done: list[list[dict[str, Any]]] = [[] for _ in cases]
    for kind, by_case in ((STEP_REPORT, steps), (DONE_REPORT, done)):
        for record in rank_reports.read(tmp_path, kind):
            by_case[int(record.pop("case_index"))].append(record)
    results = []
    for index in range(len(cases)):
        completed = bool(done[index]) and index < len(cases) - 1  # the last case's end is the launch's
        results.append(
            TrainResult(
                returncode=0 if returncode == 0 or completed else returncode,
                losses=_losses(steps[index]),
                log=log,
                info=_info(done[index]),
                duration_s=duration,
                timed_out=timed_out,
                build_s=build_s,
            )
        )
    return results


def train_steps(
    config: dict[str, Any],
    *,
    tmp_path: Path,
    ranks: int = 2,
    steps: int = 2,
    model: str = "tiny-llama",
    timeout: float = 600,
    checkpointing: bool = False,
    seq_len: int = 32,
    client_optimizer: str | None = None,
) -> TrainResult:
    """Train ``model`` for ``steps`` optimizer steps with ``config`` on ``ranks`` CPU processes:
    :func:`train_cases` with one :class:`TrainCase` (whose fields these arguments are)."""
    case = TrainCase(config, steps, model, checkpointing, seq_len, client_optimizer)
    return train_cases([case], tmp_path=tmp_path, ranks=ranks, timeout=timeout)[0]
