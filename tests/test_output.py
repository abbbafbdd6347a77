"""The output contract of dsgen/output.py: atomic, exclusive, and --force only over dsgen's own output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsgen.errors import DsgenError
from dsgen.output import MARKER, publish_directory, write_atomic


def test_write_atomic_creates_missing_parent_directories(tmp_path: Path) -> None:
    target = tmp_path / "out" / "nested" / "ds.json"
    write_atomic(target, "{}\n", force=False)
    assert target.read_text() == "{}\n"


def test_write_atomic_refuses_a_dangling_symlink_without_force(tmp_path: Path) -> None:
    link = tmp_path / "ds.json"
    link.symlink_to(tmp_path / "missing.json")
    with pytest.raises(DsgenError, match="already exists"):
        write_atomic(link, "{}", force=False)
    assert link.is_symlink() and not (tmp_path / "missing.json").exists()
    write_atomic(link, "{}", force=True)
    assert not link.is_symlink() and link.read_text() == "{}"


def test_write_atomic_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text("old")
    with pytest.raises(DsgenError):
        write_atomic(tmp_path / "ds.json", "new", force=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json"]
    assert (tmp_path / "ds.json").read_text() == "old"


def test_publish_directory_writes_files_marker_and_modes(tmp_path: Path) -> None:
    dest = tmp_path / "run"
    publish_directory(
        dest, {"ds_config.json": "{}", "launch.sh": "#!/bin/bash\n"}, force=False, executable=frozenset({"launch.sh"})
    )
    assert sorted(p.name for p in dest.iterdir()) == [MARKER, "ds_config.json", "launch.sh"]
    assert json.loads((dest / MARKER).read_text()) == ["ds_config.json", "launch.sh"]
    assert os.access(dest / "launch.sh", os.X_OK) and not os.access(dest / "ds_config.json", os.X_OK)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no staging left


def test_publish_directory_is_exclusive_without_force(tmp_path: Path) -> None:
    dest = tmp_path / "run"
    publish_directory(dest, {"a.json": "1"}, force=False)
    with pytest.raises(DsgenError, match="already exists"):
        publish_directory(dest, {"a.json": "2"}, force=False)
    assert (dest / "a.json").read_text() == "1"
    publish_directory(dest, {"b.json": "3"}, force=True)
    assert sorted(p.name for p in dest.iterdir()) == [MARKER, "b.json"]


def test_force_never_deletes_a_directory_dsgen_did_not_write(tmp_path: Path) -> None:
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "thesis.tex").write_text("precious")
    with pytest.raises(DsgenError, match="not a directory dsgen wrote"):
        publish_directory(dest, {"a.json": "1"}, force=True)
    assert (dest / "thesis.tex").read_text() == "precious"


def test_publish_refuses_unsafe_names(tmp_path: Path) -> None:
    for name in ("../escape.json", "/abs.json", MARKER, "a/../../b"):
        with pytest.raises(ValueError):
            publish_directory(tmp_path / "run", {name: "x"}, force=False)
    assert not (tmp_path / "run").exists()


def test_staging_of_a_killed_run_is_removed_by_the_next(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    stale = tmp_path / f".run.dsgen-staging-{int(dead.stdout)}-abc"
    stale.mkdir()
    (stale / "ds_config.json").write_text("half")
    live = tmp_path / f".run.dsgen-staging-{os.getpid()}-xyz"  # a run of this process: still going
    live.mkdir()
    publish_directory(tmp_path / "run", {"a.json": "1"}, force=False)
    assert not stale.exists() and live.exists()
