"""The DeepSpeed releases dsgen models: what ``dsgen validate --deepspeed-version`` checks
against (a parser profile) and what a spec's ``training.deepspeed_version`` may name (a release).

A leaf module (standard library only), so that the spec loader, the memory model and the
validator read one list. Validation differences between the profiles are data in
:mod:`dsgen.validate.versions`; what a release changes in memory is next to the term it changes
(:data:`dsgen.estimate.memory.ZERO12_DEVICE_FLATTENING_SINCE`,
:data:`dsgen.doctor.config_to_plan.PINNED_OFFLOAD_DEFAULT_SINCE`) and in the long-context search
(:data:`dsgen.search.long_context.ALST_SINCE`).
"""

from __future__ import annotations

import re
from functools import cache

#: The parser profiles, each read from one release's wheel (``dsgen.validate.versions``).
RELEASES = {"0.14": "0.14.5", "0.16": "0.16.9", "0.19": "0.19.8"}
SUPPORTED: tuple[str, ...] = tuple(RELEASES)
#: The releases a spec may name: any 0.14.0 .. 0.19.x (memory follows the exact release).
OLDEST_MINOR, NEWEST_MINOR = 14, 19
#: fp16/bf16 became strict pydantic models in 0.17.1: the first release the 0.19 profile describes.
STRICT_PRECISION_SINCE: tuple[int, ...] = (0, 17, 1)

_FORM = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def normalize_release(text: str) -> str:
    """A release a spec may name, as ``0.X.Y``: a profile name stands for the release it was read
    from (``0.16`` -> ``0.16.9``); any other minor needs its patch release, because memory changed
    within minors (0.18.7, 0.19.5). ValueError otherwise."""
    match = _FORM.fullmatch(text.strip())
    if match is not None and match.group(1) == "0" and OLDEST_MINOR <= int(match.group(2)) <= NEWEST_MINOR:
        name = f"0.{int(match.group(2))}"
        if match.group(3) is not None:
            return f"{name}.{int(match.group(3))}"
        if name in RELEASES:
            return RELEASES[name]
    raise ValueError(
        f"unsupported DeepSpeed release {text!r}; give 0.14, 0.16 or 0.19, or a release "
        f"0.{OLDEST_MINOR}.0 to 0.{NEWEST_MINOR}.x with its patch number (e.g. 0.18.5)"
    )


@cache  # asked for every validation rule of every config the doctor's fix search checks
def release_key(release: str) -> tuple[int, ...]:
    """A release (or profile name) as a comparable tuple: ``"0.18.5"`` -> (0, 18, 5)."""
    return tuple(int(part) for part in normalize_release(release).split("."))


def profile_of(release: str) -> str:
    """The parser profile a release is checked with: the nearest one read from a wheel (0.14 for
    0.14.x, 0.16 for 0.15.0 .. 0.17.0, 0.19 from 0.17.1, when fp16/bf16 became strict)."""
    key = release_key(release)
    if key < (0, 15, 0):
        return "0.14"
    return "0.16" if key < STRICT_PRECISION_SINCE else "0.19"


def normalize_version(text: str) -> str:
    """The parser profile a release (or profile name) is checked with: ``0.19`` and ``0.19.8`` ->
    ``0.19``, ``v0.15.4`` -> ``0.16`` (:func:`profile_of`); ValueError as :func:`normalize_release`."""
    return profile_of(normalize_release(text))
