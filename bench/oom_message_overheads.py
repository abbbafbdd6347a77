"""dsgen's fixed GPU overhead and allocator slack against published out-of-memory messages.

A PyTorch CUDA out-of-memory message is a measurement taken by the run itself at its worst moment.
Two of dsgen's GPU terms (docs/memory-model.md, ``overhead``) can be read off it directly:

* **Memory outside PyTorch's allocator.** The current wording (torch >= 2.1) states what the
  process holds in all ("this process has X memory in use", from NVML) beside what PyTorch's
  caching allocator has reserved (allocated + "reserved by PyTorch but unallocated"). The
  difference is the CUDA context, its kernels and the communication library's buffers: dsgen's
  fixed term, ``CUDA_CONTEXT_BYTES + COMM_LIBRARY_BYTES``.
* **Fragmentation.** Before it raises, the caching allocator frees every cached segment that holds
  no tensor and retries (c10/cuda/CUDACachingAllocator.cpp: "the allocator will attempt to free
  all cached blocks that are not split and retry the allocation"). What the message still calls
  reserved but unallocated is free space inside segments that also hold live tensors: the
  fragmentation dsgen prices as ``ALLOCATOR_SLACK`` of the dynamic allocations, which is at most
  that share of everything allocated.

The messages are bench/data/oom_messages.yaml: verbatim, with their sources. They are parsed by the
doctor's own parser (``dsgen doctor --error``), whose wordings tests/test_doctor_oom_message.py pins
to real messages.

Run: python bench/oom_message_overheads.py [--json rows.json]   (under a second)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsgen.doctor.oom_message import OomMessage, parse_oom  # noqa: E402
from dsgen.estimate.memory import ALLOCATOR_SLACK, COMM_LIBRARY_BYTES, CUDA_CONTEXT_BYTES  # noqa: E402
from dsgen.units import GIB  # noqa: E402

DATA = ROOT / "bench" / "data" / "oom_messages.yaml"
FIXED_OVERHEAD = CUDA_CONTEXT_BYTES + COMM_LIBRARY_BYTES


@dataclass(frozen=True)
class MessageRow:
    """One published message and the two overheads it measures (bytes; None where its wording lacks them)."""

    id: str
    wording: str
    expandable_segments: bool | None
    tried: int
    allocated: int | None
    reserved_unallocated: int | None
    outside_allocator: int | None  # process in use - reserved by PyTorch (current wording only)
    process_read: bool = False  # the process figure is the one listed process's (see process_figure)
    fragmentation_alone: bool = False  # OomMessage.fragmentation: more free inside held segments than the request

    @property
    def unallocated_share(self) -> float | None:
        """Reserved but unallocated, as a share of what PyTorch had allocated."""
        if self.reserved_unallocated is None or not self.allocated:
            return None
        return self.reserved_unallocated / self.allocated


def process_figure(message: OomMessage) -> tuple[int | None, bool]:
    """What the failing process held in all, and whether that is read, not stated.

    "This process has M" is stated. A message that lists exactly one other process
    (``OomMessage.listed_processes``) is read as naming the failing one (the flag says so). A
    figure of 0 bytes is NVML's, not the process's, and counts as absent (the doctor's parser
    drops "this process has 0 bytes" the same way)."""
    if message.process_in_use is not None:
        return message.process_in_use, False
    if len(message.listed_processes) != 1:
        return None, False
    return message.listed_processes[0] or None, True


def outside_allocator(held: int | None, message: OomMessage) -> int | None:
    """Memory the process holds outside PyTorch's caching allocator, where the message says both."""
    if held is None or message.allocated is None or message.reserved_unallocated is None:
        return None
    return held - message.allocated - message.reserved_unallocated


def read_rows(path: Path = DATA) -> list[MessageRow]:
    entries = yaml.safe_load(path.read_text())["messages"]
    rows = []
    for entry in entries:
        message = parse_oom(entry["message"])
        held, read = process_figure(message)
        rows.append(
            MessageRow(
                id=entry["id"],
                wording="current" if message.format == "current" else "legacy",
                expandable_segments=entry.get("expandable_segments"),
                tried=message.tried,
                allocated=message.allocated,
                reserved_unallocated=message.reserved_unallocated,
                outside_allocator=outside_allocator(held, message),
                process_read=read,
                fragmentation_alone=message.fragmentation,
            )
        )
    return rows


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile); the one value thrice for a single value."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, median, high


def share_at_or_below(values: list[float], line: float) -> str:
    below = sum(v <= line for v in values)
    return f"{below} of {len(values)} ({below / len(values):.0%})"


def gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def print_table(rows: list[MessageRow]) -> None:
    print(
        f"{'message':44} {'wording':8} {'exp.seg':7} {'tried':>10} {'allocated':>10} {'unalloc.':>10} {'share':>6} {'outside':>10}"
    )
    for r in rows:
        share = f"{r.unallocated_share:.1%}" if r.unallocated_share is not None else "-"
        outside = gib(r.outside_allocator) if r.outside_allocator is not None else "-"
        allocated = gib(r.allocated) if r.allocated is not None else "-"
        unallocated = gib(r.reserved_unallocated) if r.reserved_unallocated is not None else "-"
        print(
            f"{r.id[:44]:44} {r.wording:8} {r.expandable_segments!s:7} {gib(r.tried):>10} "
            f"{allocated:>10} {unallocated:>10} {share:>6} {outside:>10}"
        )


def summarise(rows: list[MessageRow]) -> None:
    current = sum(r.wording == "current" for r in rows)
    print(f"\n{len(rows)} published messages ({current} in the current wording, {len(rows) - current} legacy)")

    for label, keep in (
        ("'this process has' stated", lambda r: not r.process_read),
        ("stated, or the one process listed", lambda r: True),
    ):
        outside = [r.outside_allocator for r in rows if r.outside_allocator is not None and keep(r)]
        if not outside:
            continue
        low, median, high = quartiles(outside)
        print(
            f"memory outside PyTorch's allocator (process in use - reserved; {label}: {len(outside)} messages): "
            f"median {gib(median)}, middle half {gib(low)} - {gib(high)}, range {gib(min(outside))} - {gib(max(outside))}; "
            f"at or below dsgen's fixed term {gib(FIXED_OVERHEAD)}: {share_at_or_below(outside, FIXED_OVERHEAD)}"
        )
    print(
        f"  dsgen's fixed term: CUDA context {gib(CUDA_CONTEXT_BYTES)} + communication library {gib(COMM_LIBRARY_BYTES)}"
    )

    groups: list[tuple[str, Callable[[MessageRow], bool]]] = [("every message", lambda r: True)]
    if any(r.expandable_segments for r in rows):  # the setting changes what fragments: show it apart
        groups.append(("expandable_segments not stated or off", lambda r: r.expandable_segments is not True))
        groups.append(("expandable_segments on", lambda r: r.expandable_segments is True))
    for label, keep in groups:
        shares = [r.unallocated_share for r in rows if keep(r) and r.unallocated_share is not None]
        if not shares:
            continue
        low, median, high = quartiles(shares)
        print(
            f"reserved but unallocated at the failure, share of allocated ({label}, {len(shares)}): "
            f"median {median:.1%}, middle half {low:.1%} - {high:.1%}, max {max(shares):.1%}; "
            f"at or below dsgen's {ALLOCATOR_SLACK:.0%} slack: {share_at_or_below(shares, ALLOCATOR_SLACK)}"
        )
    alone = [r.id for r in rows if r.fragmentation_alone]
    print(
        f"failures with more free space inside held segments than the request (fragmentation, as the doctor "
        f"reads it): {len(alone)} of {len(rows)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--data", type=Path, default=DATA, help="the messages (default: %(default)s)")
    args = parser.parse_args(argv)
    rows = read_rows(args.data)
    print_table(rows)
    summarise(rows)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
