"""The console entry (``python -m dsgen`` / the ``dsgen`` script) ends the process itself with
``os._exit``: everything printed must still arrive whole and the exit codes must be the CLI's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "llama-3.1-8b-8xh100.yaml"


def _dsgen(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "dsgen", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_json_output_arrives_whole_through_a_pipe(tmp_path: Path) -> None:
    done = _dsgen("solve", str(EXAMPLE), "--json", "--top", "50", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)  # a truncated buffer would not parse
    assert body["feasible"] is True
    assert len(body["ranked"]) > 1


def test_new_writes_the_file_and_reports_it(tmp_path: Path) -> None:
    out = tmp_path / "ds.json"
    done = _dsgen("new", str(EXAMPLE), "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"wrote {out}")
    assert json.loads(out.read_text())["train_batch_size"] > 0


def test_exit_codes_survive_the_fast_exit(tmp_path: Path) -> None:
    bad = _dsgen("new", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert bad.returncode == 2
    assert "spec file not found" in bad.stderr
    infeasible = _dsgen(
        "solve",
        str(EXAMPLE),
        "--set",
        "hardware.gpu=t4",
        "--set",
        "training.attention=sdpa",  # the example writes flash, which a T4 cannot run (exit 2)
        "--set",
        "constraints.offload_optimizer=none",
        cwd=tmp_path,
    )
    assert infeasible.returncode == 3, infeasible.stderr
    usage = _dsgen(cwd=tmp_path)
    assert usage.returncode == 2
    assert "Commands:" in usage.stdout + usage.stderr


def test_the_collector_stays_on_and_frees_cycles_in_a_long_command(tmp_path: Path) -> None:
    """Start-up runs no collection, but a command that keeps making cyclic garbage (a long sweep
    does) still has it freed: memory stays bounded."""
    script = (
        "import gc, dsgen.cli, dsgen._console\n"
        "def main():\n"
        "    import sys\n"
        "    before = gc.get_stats()[0]['collections']\n"
        "    for _ in range(5 * dsgen._console.GEN0_THRESHOLD):\n"
        "        cycle = []\n"
        "        cycle.append(cycle)\n"
        "    del cycle\n"
        "    print(gc.isenabled(), gc.get_stats()[0]['collections'] - before, len(gc.get_objects()))\n"
        "    sys.stdout.flush()\n"
        "dsgen.cli.main = main\n"
        "dsgen._console.run()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    enabled, collections, alive = done.stdout.split()
    assert enabled == "True"
    assert int(collections) >= 4
    # 500,000 self-referencing lists were made; only the collector can free them
    from dsgen._console import GEN0_THRESHOLD

    assert int(alive) < 2 * GEN0_THRESHOLD


def test_a_short_command_runs_no_collection(tmp_path: Path) -> None:
    """The point of the raised threshold: a whole ``dsgen new`` stays under it."""
    script = (
        "import gc, sys, dsgen._console\n"
        "import dsgen.cli\n"
        "real_main = dsgen.cli.main\n"
        "def main():\n"
        "    before = sum(s['collections'] for s in gc.get_stats())\n"
        "    try:\n"
        "        real_main()\n"
        "    finally:\n"
        "        print('collections', sum(s['collections'] for s in gc.get_stats()) - before, file=sys.stderr)\n"
        "dsgen.cli.main = main\n"
        f"sys.argv = ['dsgen', 'new', {str(EXAMPLE)!r}, '-o', {str(tmp_path / 'ds.json')!r}]\n"
        "dsgen._console.run()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "collections 0" in done.stderr
