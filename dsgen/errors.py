"""dsgen's single error type and the process exit codes.

Every failure a user can cause (a bad spec, a missing file, an impossible batch) is raised as
:class:`DsgenError`. It carries what a person needs to fix the input: the key path, the file and
line it came from, and a hint. The CLI prints it as one ``error: ...`` line on stderr and exits
with the error's own ``exit_code``: 2 (bad input, the default) for most, 3 for
:class:`InfeasibleError`, 1 when a rendered config fails validation. Nothing in dsgen prints
tracebacks for user mistakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes shared by every command (part of the output contract)."""

    OK = 0
    FINDINGS = 1  # validation found errors in a config
    BAD_INPUT = 2  # unreadable or invalid input, bad usage
    INFEASIBLE = 3  # no plan fits the hardware
    INTERNAL = 70  # a bug in dsgen: an unexpected exception (EX_SOFTWARE in BSD's sysexits.h)
    READER_GONE = 141  # stdout's reader went away (``| head``): 128 + SIGPIPE, as a shell reports it


@dataclass(frozen=True)
class Location:
    """Where a value came from: a file and a 1-based line, or a command-line override."""

    file: str | None = None
    line: int | None = None

    def prefix(self) -> str:
        if self.file and self.line:
            return f"{self.file}:{self.line}: "
        if self.file:
            return f"{self.file}: "
        return ""


class DsgenError(Exception):
    """A problem with the user's input, reported as one clear line (plus an optional hint)."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        location: Location | None = None,
        hint: str | None = None,
        exit_code: ExitCode = ExitCode.BAD_INPUT,
    ) -> None:
        self.message = message
        self.path = path
        self.location = location or Location()
        self.hint = hint
        self.exit_code = exit_code
        super().__init__(self.render())

    def render(self) -> str:
        """The user-facing text: ``file:line: key.path: message`` and the hint on its own line."""
        head = self.location.prefix()
        if self.path:
            head += f"{self.path}: "
        text = head + self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class InfeasibleError(DsgenError):
    """Raised when the search finds no plan that fits; carries the closest miss in the message."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint, exit_code=ExitCode.INFEASIBLE)
