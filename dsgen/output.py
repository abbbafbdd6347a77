"""Write output files atomically and never clobber an existing file by accident."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from dsgen.errors import DsgenError


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


def write_atomic(path: Path, text: str, *, force: bool) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename.

    A reader never sees a half-written file, and a failure leaves any previous file intact.
    Without ``force`` an existing file is an error (exit 2) and nothing is written. An existing
    path that is not a regular file (a device, a FIFO, ``/dev/stdout``) is refused even with
    ``force``: the rename would replace the node itself, not write through it. Any OS failure
    (permissions, a read-only or full file system) becomes a :class:`DsgenError` naming ``path``,
    and the temporary file is removed.
    """
    try:
        _write_atomic(path, text, force=force)
    except OSError as exc:
        raise cannot_write(path, exc) from None


def _write_atomic(path: Path, text: str, *, force: bool) -> None:
    if path.exists() and not force:
        raise DsgenError(f"{path} already exists", hint="pass --force to overwrite it")
    if path.is_dir():
        raise DsgenError(f"{path} is a directory")
    if path.exists() and not path.is_file():
        raise DsgenError(f"{path} exists and is not a regular file; dsgen will not replace it")
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise DsgenError(f"output directory does not exist: {directory}")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp_name, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual file mode
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp_name).unlink(missing_ok=True)
        raise
