"""Sweep run names: a Jinja2 template rendered in a sandbox with limits, and the checks on the names.

A name template is user input executed once per run. Jinja's :class:`SandboxedEnvironment` stops
attribute escapes but not cost: ``{{ 'a' * 10**10 }}`` allocates 10 GB, ``10**10**10`` never
finishes, a recursive macro recurses until Python gives up, and nested loops multiply. So
:class:`_LimitedEnvironment` bounds what each operation may build, counts calls, stops rendering
after :data:`MAX_RENDER_SECONDS`, and stops reading output past :data:`MAX_NAME_LENGTH`; any
exception the template raises becomes one name-template :class:`DsgenError`.

A name is also a directory name next to the manifest, so it is checked here, before any run is
solved: its characters, its length, and the names dsgen itself writes.
"""

from __future__ import annotations

import functools
import operator
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jinja2 import StrictUndefined, Template, TemplateSyntaxError
from jinja2.sandbox import SandboxedEnvironment

from dsgen.errors import DsgenError
from dsgen.output import MARKER

#: Longest run name: one path component (255 bytes on Linux and macOS file systems).
MAX_NAME_LENGTH = 255
#: Wall time one name may take to render (real templates take microseconds).
MAX_RENDER_SECONDS = 1.0
#: Longest string or list one ``*``, ``%`` or ``**`` in a template may produce.
MAX_VALUE_SIZE = 4096
#: Calls (filters, functions, macros) one rendering may make.
MAX_CALLS = 10_000

#: Filters whose numeric arguments are output sizes.
_SIZING_FILTERS = frozenset({"center", "indent", "truncate", "wordwrap", "batch", "slice"})
#: Functions and methods whose numeric arguments are output sizes.
_SIZING_CALLS = frozenset({"safe_range", "range", "ljust", "rjust", "center", "zfill", "expandtabs"})
#: A printf or str.format width/precision of four or more digits ('%09999d', '{:>99999}').
_WIDE_FORMAT = re.compile(r"[%:][^%{}:]*?\d{4}")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]*$")
MANIFEST_JSONL = "manifest.jsonl"
MANIFEST_CSV = "manifest.csv"
REPORT_HTML = "report.html"  # the sweep's HTML report (dsgen.reporting.html.sweep_page)
SUBMIT_SCRIPT = "submit.sh"  # Slurm: one sbatch --array per resource shape (dsgen.sweeps.submit)
ARRAY_SCRIPT = "array.sh"  # Slurm: the job script of those arrays
KUSTOMIZATION = "kustomization.yaml"  # Kubernetes: every run's manifests
#: Names a run directory may not take: the files dsgen writes beside the run directories.
RESERVED_NAMES = frozenset(
    {MANIFEST_JSONL, MANIFEST_CSV, REPORT_HTML, MARKER, SUBMIT_SCRIPT, ARRAY_SCRIPT, KUSTOMIZATION}
)


class _TemplateLimit(Exception):
    """A name template went over one of this module's limits."""


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple) else 0


class _LimitedEnvironment(SandboxedEnvironment):
    """The sandbox, with ``*``, ``%`` and ``**`` bounded and calls counted."""

    intercepted_binops = frozenset({"*", "%", "**"})

    def __init__(self) -> None:
        super().__init__(undefined=StrictUndefined, autoescape=False)
        self.calls = 0
        # filters are called directly by the compiled template, not through call(): wrap them
        self.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs
        self.filters = {name: self._bounded(func, name in _SIZING_FILTERS) for name, func in self.filters.items()}

    def _bounded(self, func: Callable[..., Any], sizing: bool) -> Callable[..., Any]:
        @functools.wraps(func)  # keeps jinja_pass_arg (context/environment filters)
        def bounded(*args: Any, **kwargs: Any) -> Any:
            self._check_call(args, kwargs, sizing=sizing)
            result = func(*args, **kwargs)
            if _size(result) > MAX_VALUE_SIZE:
                raise _TemplateLimit(f"a filter built a value longer than {MAX_VALUE_SIZE} items")
            return result

        return bounded

    def _check_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, sizing: bool) -> None:
        """Count the call; with ``sizing`` (a call whose numbers are output sizes: center, indent,
        range, str.ljust, ...) refuse numbers over :data:`MAX_VALUE_SIZE`."""
        self.calls += 1
        if self.calls > MAX_CALLS:
            raise _TemplateLimit(f"more than {MAX_CALLS:,} calls (a recursive macro?)")
        for value in (*args, *kwargs.values()):
            if sizing and isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_VALUE_SIZE:
                raise _TemplateLimit(f"calls with numbers over {MAX_VALUE_SIZE} are not allowed")
            if isinstance(value, str) and _WIDE_FORMAT.search(value):
                raise _TemplateLimit("format widths of 1000 or more are not allowed")

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "*":
            for seq, count in ((left, right), (right, left)):
                if _size(seq) and isinstance(count, int) and _size(seq) * max(count, 0) > MAX_VALUE_SIZE:
                    raise _TemplateLimit(f"'*' would build a value longer than {MAX_VALUE_SIZE} items")
            if isinstance(left, int) and isinstance(right, int) and (left.bit_length() + right.bit_length()) > 256:
                raise _TemplateLimit("'*' on integers this large is not allowed")
            return operator.mul(left, right)
        if operator_name == "**":
            if isinstance(right, int | float) and abs(right) > 256:
                raise _TemplateLimit("'**' with an exponent over 256 is not allowed")
            if isinstance(left, int) and left.bit_length() > 256:
                raise _TemplateLimit("'**' on integers this large is not allowed")
            return operator.pow(left, right)
        if isinstance(left, str) and _WIDE_FORMAT.search(left):  # '%099999999d' % 1 pads to any width
            raise _TemplateLimit("format widths of 1000 or more are not allowed")
        result = operator.mod(left, right)
        if _size(result) > MAX_VALUE_SIZE:
            raise _TemplateLimit(f"'%' built a value longer than {MAX_VALUE_SIZE} characters")
        return result

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        # the sandbox wraps str.format at attribute access; __wrapped__ is the bound method
        bound_to = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)  # "{:>9999}".format(...)
        sizing = getattr(__obj, "__name__", "") in _SIZING_CALLS
        __self._check_call((bound_to, *args), kwargs, sizing=sizing)
        result = super().call(__context, __obj, *args, **kwargs)
        if _size(result) > MAX_VALUE_SIZE:
            raise _TemplateLimit(f"a call built a value longer than {MAX_VALUE_SIZE} items")
        return result


def compile_name_template(text: str, where: Callable[[], Any]) -> Template:
    """The compiled template, or a :class:`DsgenError` at ``where()`` (a Location)."""
    env = _LimitedEnvironment()
    try:
        return env.from_string(text)
    except TemplateSyntaxError as exc:
        raise DsgenError(f"invalid name template: {exc.message}", path="name", location=where()) from None
    except Exception as exc:
        raise DsgenError(f"invalid name template: {type(exc).__name__}", path="name", location=where()) from None


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`_TemplateLimit` in this thread after ``seconds`` (main thread only; elsewhere
    the call and size limits still hold)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _TemplateLimit(f"rendering took more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def render_name(template: Template, context: dict[str, Any], index: int, text: str, where: Callable[[], Any]) -> str:
    """Run ``index``'s name, checked with :func:`check_run_name`; every failure is one DsgenError."""
    env = template.environment
    if isinstance(env, _LimitedEnvironment):
        env.calls = 0
    parts: list[str] = []
    length = 0
    try:
        with _deadline(MAX_RENDER_SECONDS):
            for chunk in template.generate(**context):
                parts.append(chunk)
                length += len(chunk)
                if length > 4 * MAX_NAME_LENGTH:
                    raise _TemplateLimit(f"the name is longer than {MAX_NAME_LENGTH} characters")
    except RecursionError:
        reason = "it recurses too deeply"
    except MemoryError:
        reason = "it ran out of memory"
    except Exception as exc:
        reason = str(exc) if isinstance(exc, _TemplateLimit) else f"{type(exc).__name__}: {exc}"
    else:
        return check_run_name("".join(parts).strip(), index, where)
    raise DsgenError(
        f"name template {_cut(text)!r} failed for run {index}: {_cut(reason, 200)}", path="name", location=where()
    )


def check_run_name(name: str, index: int, where: Callable[[], Any]) -> str:
    """``name`` if it can be a run directory; else a DsgenError (checked before any run is solved)."""
    if len(name) > MAX_NAME_LENGTH:
        raise DsgenError(
            f"run {index} gets a name of {len(name)} characters; at most {MAX_NAME_LENGTH} are allowed",
            path="name",
            location=where(),
            hint="shorten the name template",
        )
    if name in RESERVED_NAMES:
        raise DsgenError(
            f"run {index} gets the name {name!r}, which dsgen uses for its own file in the output directory",
            path="name",
            location=where(),
            hint="reserved names: " + ", ".join(sorted(RESERVED_NAMES)),
        )
    if not SAFE_NAME.fullmatch(name) or ".." in name:
        raise DsgenError(
            f"run {index} gets the unsafe directory name {_cut(repr(name))}",
            path="name",
            location=where(),
            hint="names may use letters, digits and . _ + = - only; no path separators, no '..'",
        )
    return name


def _cut(text: str, width: int = 80) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
