"""What the doctor tells the user, as one value type shared by its reading and pricing steps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DoctorFinding:
    """Something the doctor wants the user to know; ``error`` makes the config invalid."""

    severity: str  # error | warning | info
    code: str
    message: str
    hint: str | None = None
