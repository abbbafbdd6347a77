"""Write output atomically and exclusively, and never destroy what dsgen did not write.

Two shapes of output exist: one file (``dsgen new`` with the ``deepspeed`` target, ``doctor
--fix``) and a directory of files (a multi-file target bundle, a sweep). Both follow one contract:

- all or nothing: content is staged next to its destination and renamed into place, so a reader
  never sees a half-written output and a failure (or a kill) leaves the previous one intact;
- exclusive: without ``force`` an existing destination is an error, also when another dsgen
  process creates it between our check and our rename (the final step refuses to replace);
- ``force`` replaces only what dsgen itself wrote: a regular file, or a directory carrying the
  :data:`MARKER` file that every published directory gets. A symlink at the destination is never
  followed and is replaced only with ``force``;
- a staging directory left by a killed run is named after its process id and removed by the next
  run that publishes to the same destination.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from dsgen.errors import DsgenError

MARKER = ".dsgen-output"  # JSON list of the files dsgen wrote into a published directory
_STAGING = ".dsgen-staging-"
_RETIRED = ".dsgen-retired-"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def os_reason(exc: OSError) -> str:
    """The operating system's words for ``exc`` ("Permission denied"), without Python's repr."""
    return exc.strerror or str(exc)


def cannot_write(path: Path, exc: OSError) -> DsgenError:
    """The one-line error for an OS failure while writing ``path`` (bad environment: exit 2).

    It names the path the user asked for, not the temporary name the failing call saw, because
    that is the path the user can do something about.
    """
    return DsgenError(f"cannot write {path}: {os_reason(exc)}")


def _parent(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _ensure_parent(path: Path) -> Path:
    """Create the destination's parent directories (``-o out/ds.json`` needs no ``mkdir``)."""
    directory = _parent(path)
    if directory.exists() and not directory.is_dir():
        raise DsgenError(f"{directory} exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def write_atomic(path: Path, text: str, *, force: bool) -> None:
    """Write ``text`` to the file ``path`` through a temporary file and a rename.

    Without ``force`` an existing path (a dangling symlink included) is an error and nothing is
    written; the final step links the temporary file into place, which fails if another writer
    got there first. A directory or a special file (a device, a FIFO) is refused even with
    ``force``: the rename would replace the node itself, not write through it.
    """
    try:
        _write_atomic(path, text, force=force)
    except OSError as exc:
        raise cannot_write(path, exc) from None


def _write_atomic(path: Path, text: str, *, force: bool) -> None:
    if os.path.lexists(path):
        if not force:
            raise DsgenError(f"{path} already exists", hint="pass --force to overwrite it")
        if path.is_dir() and not path.is_symlink():
            raise DsgenError(f"{path} is a directory")
        if not path.is_symlink() and not path.is_file():
            raise DsgenError(f"{path} exists and is not a regular file; dsgen will not replace it")
    directory = _ensure_parent(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp_name, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual file mode
        if force:
            os.replace(tmp_name, path)
        else:
            try:
                os.link(tmp_name, path)  # fails with EEXIST if a concurrent writer created it
            except FileExistsError:
                raise DsgenError(
                    f"{path} already exists (written while dsgen was working)", hint="pass --force to overwrite it"
                ) from None
    finally:
        with contextlib.suppress(OSError):
            Path(tmp_name).unlink(missing_ok=True)


def _check_relative(name: str) -> PurePosixPath:
    rel = PurePosixPath(name)
    if rel.is_absolute() or not rel.parts or any(part in ("", ".", "..") for part in rel.parts) or name == MARKER:
        raise ValueError(f"not a safe relative output name: {name!r}")
    return rel


def is_dsgen_output(directory: Path) -> bool:
    """Whether ``directory`` is one that dsgen published (it carries the marker file)."""
    return directory.is_dir() and not directory.is_symlink() and (directory / MARKER).is_file()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _remove_stale(parent: Path, name: str) -> None:
    """Remove staging and retired directories of ``name`` whose process has died."""
    pattern = re.compile(rf"^\.{re.escape(name)}(?:{_STAGING}|{_RETIRED})(\d+)-")
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            match = pattern.match(entry.name)
            if match and not _pid_alive(int(match.group(1))):
                shutil.rmtree(entry, ignore_errors=True)


def check_directory_destination(dest: Path, *, force: bool) -> None:
    """Refuse a destination directory before any work is done (the same checks publishing makes)."""
    if os.path.lexists(dest):
        if not force:
            raise DsgenError(f"{dest} already exists", hint="pass --force to replace it")
        if dest.is_symlink():
            return  # replacing the link itself, never what it points to
        if not dest.is_dir():
            raise DsgenError(f"{dest} exists and is not a directory")
        if not is_dsgen_output(dest):
            raise DsgenError(
                f"{dest} is not a directory dsgen wrote (no {MARKER} file); --force will not delete it",
                hint="name a new directory, or remove this one yourself",
            )


def publish_directory(
    dest: Path, files: Mapping[str, str], *, force: bool, executable: frozenset[str] = frozenset()
) -> None:
    """Write ``files`` (relative POSIX name -> text) as the directory ``dest``, all or nothing.

    Names in ``executable`` get mode 0755 (launch scripts). See the module docstring for the
    contract; any OS failure becomes one :class:`DsgenError` naming ``dest``.
    """
    rels = {name: _check_relative(name) for name in files}
    check_directory_destination(dest, force=force)
    try:
        parent = _ensure_parent(dest)
        _remove_stale(parent, dest.name)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}{_STAGING}{os.getpid()}-", dir=parent))
    except OSError as exc:
        raise cannot_write(dest, exc) from None
    try:
        staging.chmod(0o777 & ~_umask())  # mkdtemp creates 0700; the published directory gets the usual mode
        for name, text in files.items():
            target = staging.joinpath(*rels[name].parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            if name in executable:
                target.chmod(0o777 & ~_umask())
        (staging / MARKER).write_text(json.dumps(sorted(files), indent=1) + "\n", encoding="utf-8")
        _swap_into_place(staging, dest, force=force)
    except OSError as exc:
        raise cannot_write(dest, exc) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap_into_place(staging: Path, dest: Path, *, force: bool) -> None:
    """Rename the finished staging directory to ``dest``; an old one is removed only afterwards."""
    if not os.path.lexists(dest):
        try:
            os.rename(staging, dest)  # refuses a non-empty directory another writer published meanwhile
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise DsgenError(
                    f"{dest} already exists (written while dsgen was working)", hint="pass --force to replace it"
                ) from None
            raise
        return
    if not force:
        raise DsgenError(f"{dest} already exists", hint="pass --force to replace it")
    if dest.is_symlink():
        dest.unlink()
        os.rename(staging, dest)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{dest.name}{_RETIRED}{os.getpid()}-", dir=dest.parent))
    retired.rmdir()
    os.rename(dest, retired)
    try:
        os.rename(staging, dest)
    except OSError:
        os.rename(retired, dest)
        raise
    shutil.rmtree(retired, ignore_errors=True)
