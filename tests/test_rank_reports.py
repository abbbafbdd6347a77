"""tests/rank_reports.py: the ranks of a multi-process run report through one file each, so what a
test reads back cannot be interleaved the way lines on their shared stdout were (issue 48)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import rank_reports
from tests.conftest import REPO_ROOT


@pytest.fixture
def reports_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as a rank of a launch in ``tmp_path``, as ds_oracle's launchers set it up."""
    for key, value in rank_reports.prepare(tmp_path).items():
        monkeypatch.setenv(key, value)
    return tmp_path


def test_records_come_back_by_rank_then_in_the_order_written(reports_env: Path) -> None:
    rank_reports.write("tp", 1, {"rank": 1, "step": 1})
    rank_reports.write("tp", 0, {"rank": 0, "step": 1})
    rank_reports.write("tp", 1, {"rank": 1, "step": 2})
    rank_reports.write("tp", 10, {"rank": 10, "step": 1})  # by number, not by name: 10 after 1
    rank_reports.write("done", 0, {"rank": 0})
    got = [(r["rank"], r["step"]) for r in rank_reports.read(reports_env, "tp")]
    assert got == [(0, 1), (1, 1), (1, 2), (10, 1)]
    assert rank_reports.read(reports_env, "done") == [{"rank": 0}]
    assert rank_reports.read(reports_env, "other") == []


def test_a_new_launch_does_not_see_the_last_ones_reports(reports_env: Path) -> None:
    rank_reports.write("tp", 0, {"run": 1})
    rank_reports.prepare(reports_env)
    assert rank_reports.read(reports_env, "tp") == []
    assert rank_reports.read(reports_env / "never-launched", "tp") == []


def test_a_record_cut_off_mid_write_is_left_out_and_a_bad_line_is_refused() -> None:
    assert rank_reports.parse_lines('{"a": 1}\n{"a": 2') == [{"a": 1}]  # the rank died writing the 2nd
    with pytest.raises(ValueError, match="not a JSON object"):
        rank_reports.parse_lines("[1, 2]\n")


def test_run_by_hand_the_record_goes_to_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(rank_reports.ENV_VAR, raising=False)
    assert rank_reports.write("DSGEN_TP", 0, {"rank": 0}) is None
    assert capsys.readouterr().out == 'DSGEN_TP {"rank": 0}\n'


# Each "rank" floods the shared stdout with unterminated fragments (what made the 4-rank AutoTP
# launch read 2 records of 4) and writes its records through rank_reports in between.
_RANK_PROGRAM = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[3])
    from tests import rank_reports
    rank, count = int(sys.argv[1]), int(sys.argv[2])
    for step in range(count):
        os.write(1, f"DSGEN_TP rank={rank} seen=".encode())
        rank_reports.write("tp", rank, {"rank": rank, "step": step, "seen": list(range(step * 50))})
        os.write(1, b"%d" % step)
    """
)


def test_ranks_writing_at_once_lose_no_record(reports_env: Path) -> None:
    ranks, count = 4, 200
    env = {**os.environ, rank_reports.ENV_VAR: str(rank_reports.directory(reports_env))}
    with (reports_env / "shared_stdout.log").open("wb") as shared:  # one stdout for all, as under torchrun
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _RANK_PROGRAM, str(rank), str(count), str(REPO_ROOT)], env=env, stdout=shared
            )
            for rank in range(ranks)
        ]
        assert [proc.wait(timeout=120) for proc in procs] == [0] * ranks
    records = rank_reports.read(reports_env, "tp")
    assert [(rec["rank"], rec["step"]) for rec in records] == [(r, s) for r in range(ranks) for s in range(count)]
    assert all(rec["seen"] == list(range(rec["step"] * 50)) for rec in records)
