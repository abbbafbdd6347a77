"""Read PyTorch's CUDA out-of-memory message into numbers.

PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) has worded it three ways:

* ``legacy-cached`` (torch <= 1.4): ``Tried to allocate X (GPU n; T total capacity; A already
  allocated; F free; C cached)``;
* ``legacy-reserved`` (torch 1.5 - 2.0): ``... A already allocated; F free; R reserved in total
  by PyTorch)``, from 1.10 followed by the ``max_split_size_mb`` hint;
* ``current`` (torch >= 2.1): ``Tried to allocate X. GPU n has a total capacity of T of which F
  is free. [Process p has M memory in use. | Including non-PyTorch memory, this process has M
  memory in use.] Of the allocated memory A is allocated by PyTorch, and U is reserved by
  PyTorch but unallocated.`` (2.1 spells "capacty"; the tail is missing when cut off).

"Reserved but unallocated" memory (reserved - allocated in the legacy wording) is what the
allocator holds in cached blocks that could not serve the request: when it alone would cover
the request, the failure is fragmentation, not a lack of memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsgen.errors import DsgenError

UNITS = {"b": 1, "bytes": 1, "byte": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = r"(\d+(?:\.\d+)?)\s*(bytes|byte|B|KiB|MiB|GiB|TiB)"


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * UNITS[unit.lower()])


def _wrapped(phrase: str) -> str:
    """``phrase`` as a pattern that also matches it broken once inside a word: a terminal wraps a
    long message at a fixed width, the pasted copy keeps the break ("Of the allocated memor" /
    "y 74.57 GiB", ms-swift #4023), and flattening turns it into a space."""
    pairs = zip(phrase, phrase[1:] + " ", strict=True)
    return "".join(re.escape(a) + (" ?" if a.isalpha() and b.isalpha() else "") for a, b in pairs)


def _find(pattern: str, text: str) -> int | None:
    match = re.search(pattern, text, flags=re.IGNORECASE | re.DOTALL)
    return _bytes(match.group(1), match.group(2)) if match else None


@dataclass(frozen=True)
class OomMessage:
    """The numbers in one out-of-memory message (bytes; None when the message lacks them)."""

    format: str  # legacy-cached | legacy-reserved | current
    tried: int
    gpu_index: int | None
    capacity: int | None
    free: int | None
    allocated: int | None  # by PyTorch's tensors
    reserved_unallocated: int | None  # cached by the allocator but not in tensors
    process_in_use: int | None  # this process (current format), incl. CUDA context and NCCL
    # what each other process NVML lists holds ("Process p has M memory in use"; current format).
    # In a container PyTorch does not find its own id among them, so the failing one is listed so
    listed_processes: tuple[int, ...] = ()

    @property
    def fragmentation(self) -> bool:
        """The allocator's cached but unused blocks alone would have covered the request."""
        return self.reserved_unallocated is not None and self.reserved_unallocated >= self.tried


def parse_oom(text: str) -> OomMessage:
    """Parse an out-of-memory message; a text without ``Tried to allocate`` is bad input (exit 2)."""
    flat = " ".join(text.split())
    tried_match = re.search(r"Tried to allocate " + _SIZE, flat, flags=re.IGNORECASE)
    if not tried_match or "out of memory" not in flat.lower():
        raise DsgenError(
            "--error: not a PyTorch CUDA out-of-memory message (expected 'CUDA out of memory. Tried to allocate ...')",
            hint="paste the whole line that starts with torch.OutOfMemoryError / RuntimeError: CUDA out of memory",
        )
    tried = _bytes(tried_match.group(1), tried_match.group(2))
    gpu = re.search(r"GPU (\d+)", flat)
    gpu_index = int(gpu.group(1)) if gpu else None
    if re.search(r"total capac\w*ty of", flat, flags=re.IGNORECASE):
        capacity = _find(r"total capac\w*ty of " + _SIZE, flat)
        free = _find(_wrapped("of which ") + _SIZE + _wrapped(" is free"), flat)
        allocated = _find(_wrapped("Of the allocated memory ") + _SIZE + _wrapped(" is allocated by PyTorch"), flat)
        unallocated = _find(_SIZE + _wrapped(" is reserved by PyTorch but unallocated"), flat)
        # PyTorch asks NVML for the process's memory; where NVML cannot see it (in some containers)
        # the figure reads "0 bytes" beside gigabytes of tensors, which says nothing
        in_use = _find(_wrapped("this process has ") + _SIZE + _wrapped(" memory in use"), flat) or None
        listed = re.findall(r"Process \d+ has " + _SIZE + _wrapped(" memory in use"), flat, flags=re.IGNORECASE)
        listed_sizes = tuple(_bytes(number, unit) for number, unit in listed)
        return OomMessage("current", tried, gpu_index, capacity, free, allocated, unallocated, in_use, listed_sizes)
    if "already allocated" not in flat and not re.search(r"total capacity;", flat):
        # the current wording cut after its first sentence (quoted in a bug report, say)
        return OomMessage("current", tried, gpu_index, None, None, None, None, None)
    capacity = _find(_SIZE + _wrapped(" total capacity"), flat)
    allocated = _find(_SIZE + _wrapped(" already allocated"), flat)
    free = _find(_SIZE + r" free", flat)
    reserved = _find(_SIZE + _wrapped(" reserved in total by PyTorch"), flat)
    cached = _find(_SIZE + r" cached", flat)
    if reserved is None and cached is not None:
        # torch <= 1.4 reported only what the cache held beyond live tensors
        return OomMessage("legacy-cached", tried, gpu_index, capacity, free, allocated, cached, None)
    unallocated = reserved - allocated if reserved is not None and allocated is not None else None
    return OomMessage("legacy-reserved", tried, gpu_index, capacity, free, allocated, unallocated, None)
