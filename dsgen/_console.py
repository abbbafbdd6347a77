"""The ``dsgen`` console script: process start-up and shut-down around :func:`dsgen.cli.main`.

A cold ``dsgen new`` is mostly interpreter work that produces nothing: importing typer, Jinja2,
PyYAML and dsgen allocates a few hundred thousand long-lived objects, and CPython's cyclic
garbage collector walks them again and again while they are created; at exit the interpreter
tears every module down one by one. Measured on a 2-core machine (``bench/solve_speed.py``) the
two together were about a sixth of the command's wall time. So the console script

* pauses the cyclic collector while the command line is imported, then freezes what the imports
  built (:func:`gc.freeze`: collections no longer scan it) and collects normally from then on;
* ends the process with :func:`os._exit` once the command has finished and the standard streams
  are flushed, skipping module teardown. Every file dsgen writes is closed (and renamed into
  place) before its command returns, and no command leaves work for ``atexit``.

``python -m dsgen`` goes through here too; importing :mod:`dsgen.cli` and calling ``main()`` (as
the tests do) keeps the ordinary interpreter behaviour.
"""

from __future__ import annotations

import gc
import os
import sys


def _flush_standard_streams() -> int:
    """Flush stdout and stderr; 1 when the reader of a pipe has gone away (``dsgen ... | head``)."""
    status = 0
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            status = 1
    return status


def run() -> None:
    """Entry point of the ``dsgen`` console script."""
    gc.disable()
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
