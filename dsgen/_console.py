"""The ``dsgen`` console script: process start-up and shut-down around :func:`dsgen.cli.main`.

A cold ``dsgen new`` is mostly interpreter work that produces nothing. Importing typer, Jinja2,
PyYAML and dsgen creates tens of thousands of long-lived objects, and with CPython's default
settings the cyclic garbage collector examines them again and again while they are being
created; at exit the interpreter then tears every module down one by one. Measured on a 2-core
machine (``bench/solve_speed.py``), the two together were about a sixth of the command's wall
time. So the console script

* raises the collector's first-generation threshold from 700 to :data:`GEN0_THRESHOLD` tracked
  objects, more than a whole ``dsgen new`` creates, so a short command runs no collection at all.
  The collector stays on: a long sweep still frees its cyclic garbage, in batches. Each rendered
  config leaves some behind, because ``json.dumps(..., indent=2)`` builds a cycle of closures;
* ends the process with :func:`os._exit` once the command has finished and the standard streams
  are flushed, skipping module teardown. Every file dsgen writes is closed (and renamed into
  place) before its command returns, and no command leaves work for ``atexit``.

``python -m dsgen`` goes through here too. Importing :mod:`dsgen.cli` and calling ``main()``, as
the tests do, keeps the ordinary interpreter behaviour.

It is kept because the saving is measured, not assumed (issue 16: kept only if it still holds once
records became stdlib dataclasses). One cold ``dsgen new`` of the 8B example, through this module
and through a plain ``dsgen.cli.main()``, 40 interleaved pairs on the 2-core VM under load: medians
632 and 772 ms, minima 171 and 203 ms, median per-pair saving 90 ms; callgrind, which does not
move with load, 640 M and 706 M instructions (66 M, 9 %, saved). ``bench/solve_speed.py`` prints
the same comparison in its rounds.
"""

from __future__ import annotations

import gc
import os
import sys

#: Net new tracked objects before a first-generation collection (CPython's default is 700). A
#: whole cold ``dsgen new`` creates about 42,000 on CPython 3.11.
GEN0_THRESHOLD = 100_000


def _flush_standard_streams() -> int:
    """Flush stdout and stderr; ExitCode.READER_GONE when the reader of a pipe has gone away."""
    from dsgen.errors import ExitCode  # already imported by dsgen.cli

    status = 0
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            status = int(ExitCode.READER_GONE)
    return status


def run() -> None:
    """Entry point of the ``dsgen`` console script."""
    gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])
    from dsgen.cli import main

    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    flushed = _flush_standard_streams()
    os._exit(code or flushed)
