"""The DeepSpeed releases dsgen models, by name: what a user's ``--deepspeed-version`` or
``training.deepspeed_version`` may say, and what each name stands for.

A leaf module (standard library only), so that the spec loader, the memory model and the
validator read one list. Validation differences between the releases are data in
:mod:`dsgen.validate.versions`; memory differences are in :mod:`dsgen.estimate.memory`
(:data:`dsgen.estimate.memory.ZERO12_DEVICE_FLATTENING_SINCE`) and in the long-context search
(:data:`dsgen.long_context.ALST_SINCE`).
"""

from __future__ import annotations

import re

SUPPORTED: tuple[str, ...] = ("0.14", "0.16", "0.19")
DEFAULT_VERSION = "0.19"
#: The release each name was read from (wheels diffed for validation, source read for memory).
RELEASES = {"0.14": "0.14.5", "0.16": "0.16.9", "0.19": "0.19.8"}


def normalize_version(text: str) -> str:
    """Map ``0.19``, ``0.19.8`` or ``v0.16.9`` to a supported name; ValueError otherwise."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?", text.strip())
    name = f"{match.group(1)}.{match.group(2)}" if match else None
    if name not in SUPPORTED:
        raise ValueError(f"unsupported DeepSpeed version {text!r}; choose one of {', '.join(SUPPORTED)}")
    return name


def release_key(version: str) -> tuple[int, ...]:
    """The full release a supported name stands for, as a comparable tuple: ``"0.16"`` -> (0, 16, 9)."""
    return tuple(int(part) for part in RELEASES[normalize_version(version)].split("."))
