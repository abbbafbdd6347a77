"""Reading a user's input file with bounds set before anything is spent on it.

Every file dsgen reads (spec, sweep, sweep base, DeepSpeed config, ``hf_config``) is a few
kilobytes. A path can name something else: ``/dev/zero`` or ``/dev/urandom`` never end, a FIFO
blocks ``open`` until someone writes, a directory is not text, and a 50 MB file makes the parsers
build hundreds of megabytes of tokens and positions. So a file is opened without blocking, must
be a regular file, and is read only up to :data:`MAX_INPUT_BYTES`; past that it is refused with
one message instead of being parsed.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError, Location

#: Largest input file dsgen reads. Real configs and specs are kilobytes (the largest of the 345
#: corpus configs is under 10 KiB); 2 MiB keeps the parsers' working set far below a gigabyte.
MAX_INPUT_BYTES = 2 * 1024 * 1024


def read_bytes(path: str | Path, what: str, *, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``), or a :class:`DsgenError`."""
    where = Location(str(path))
    label = f"{what} file" if what else "file"
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if what:
            raise DsgenError(f"{label} not found", location=where) from None
        raise DsgenError("cannot read file: No such file or directory", location=where) from None
    except OSError as exc:
        raise DsgenError(f"cannot read {label}: {exc.strerror or exc}", location=where) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise DsgenError(f"cannot read {label}: it is {kind}", location=where)
        if info.st_size > limit:
            raise DsgenError(_too_large(label, limit), location=where)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # st_size can lie (procfs, a file growing while read)
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise DsgenError(_too_large(label, limit), location=where)
        return b"".join(chunks)
    except OSError as exc:
        raise DsgenError(f"cannot read {label}: {exc.strerror or exc}", location=where) from None
    finally:
        os.close(fd)


def read_text(path: str | Path, what: str, *, limit: int = MAX_INPUT_BYTES, encoding: str = "utf-8") -> str:
    """:func:`read_bytes` decoded as UTF-8; other encodings are one :class:`DsgenError`."""
    raw = read_bytes(path, what, limit=limit)
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise DsgenError(
            f"{what + ' ' if what else ''}file is not UTF-8 text (byte {exc.start}: {exc.reason})",
            location=Location(str(path)),
        ) from None


def _too_large(label: str, limit: int) -> str:
    return f"{label} is larger than {limit // (1024 * 1024)} MiB; dsgen reads only files of that size or smaller"


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON object from a bounded regular file (:func:`read_text`), or a :class:`DsgenError`
    naming ``what`` and, for a syntax error, the line and column."""
    file = Path(path)
    try:
        data = json.loads(read_text(file, what))
    except json.JSONDecodeError as exc:
        raise DsgenError(f"{file}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise DsgenError(f"{file}: {what} must be a JSON object")
    return data
