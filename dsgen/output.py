"""Write output files atomically and never clobber an existing file by accident."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from dsgen.errors import DsgenError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, text: str, *, force: bool) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename.

    A reader never sees a half-written file, and a failure leaves any previous file intact.
    Without ``force`` an existing file is an error (exit 2) and nothing is written.
    """
    if path.exists() and not force:
        raise DsgenError(f"{path} already exists", hint="pass --force to overwrite it")
    if path.is_dir():
        raise DsgenError(f"{path} is a directory")
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
        Path(tmp_name).unlink(missing_ok=True)
        raise
