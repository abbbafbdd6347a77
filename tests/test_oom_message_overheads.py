"""bench/oom_message_overheads.py reads the two overheads a published message measures.

Expected values are read off the message text by hand: the process's memory less what PyTorch
allocated and holds unallocated, and the unallocated share of what is allocated.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import bench_module

GIB = 1 << 30
LLAMA_FACTORY_1221 = (  # https://github.com/hiyouga/LlamaFactory/issues/1221 (legacy wording)
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.14 GiB (GPU 5; 31.75 GiB total "
    "capacity; 28.28 GiB already allocated; 1.95 GiB free; 28.28 GiB reserved in total by PyTorch)"
)
CURRENT = (  # the current wording, as docs/my-run-crashed.md's doctor example quotes it
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.28 GiB. GPU 0 has a total capacity of "
    "39.38 GiB of which 2.12 GiB is free. Including non-PyTorch memory, this process has 37.25 GiB memory in "
    "use. Of the allocated memory 33.10 GiB is allocated by PyTorch, and 3.63 GiB is reserved by PyTorch but "
    "unallocated."
)


@pytest.fixture
def rows(tmp_path: Path) -> list:
    data = tmp_path / "messages.yaml"
    messages = [
        {"id": "lf1221", "source": "x", "message": LLAMA_FACTORY_1221, "expandable_segments": None},
        {"id": "current", "source": "x", "message": CURRENT, "expandable_segments": False},
    ]
    data.write_text(yaml.safe_dump({"messages": messages}))
    return bench_module("oom_message_overheads").read_rows(data)


def test_each_message_gives_its_unallocated_share_and_outside_memory(rows: list) -> None:
    legacy, current = rows
    assert legacy.wording == "legacy" and current.wording == "current"
    assert legacy.reserved_unallocated == pytest.approx(0, abs=0.01 * GIB)  # reserved 28.28 = allocated 28.28
    assert legacy.outside_allocator is None  # the legacy wording has no process figure
    assert current.unallocated_share == pytest.approx(3.63 / 33.10, rel=1e-3)
    assert current.outside_allocator == pytest.approx((37.25 - 33.10 - 3.63) * GIB, abs=0.01 * GIB)
    assert not legacy.fragmentation_alone and not current.fragmentation_alone  # 0 < 3.14, 3.63 < 9.28


def test_the_report_prints_both_terms(rows: list, capsys: pytest.CaptureFixture[str]) -> None:
    bench = bench_module("oom_message_overheads")
    bench.summarise(rows)
    out = capsys.readouterr().out
    assert "2 published messages (1 in the current wording, 1 legacy)" in out
    assert "median 0.52 GiB" in out  # the one current message: 37.25 - 33.10 - 3.63
    assert "at or below dsgen's 5% slack: 1 of 2 (50%)" in out  # 0 % and 11 %


def test_a_single_listed_process_is_read_as_the_failing_one_and_zero_bytes_as_absent() -> None:
    """In a container PyTorch lists the failing process by NVML's id ("Process p has M"); one listed
    process is read as it, flagged as read. "0 bytes" is not a process's memory."""
    bench = bench_module("oom_message_overheads")
    parse_oom = bench.parse_oom
    listed = (  # https://github.com/hiyouga/LlamaFactory/issues/5590
        "CUDA out of memory. Tried to allocate 3.74 GiB. GPU 0 has a total capacty of 79.15 GiB of which 1.33 GiB "
        "is free. Process 55179 has 77.81 GiB memory in use. Of the allocated memory 57.88 GiB is allocated by "
        "PyTorch, and 17.62 GiB is reserved by PyTorch but unallocated."
    )
    held, read = bench.process_figure(parse_oom(listed))
    assert read and held == pytest.approx(77.81 * GIB, abs=0.01 * GIB)
    assert bench.outside_allocator(held, parse_oom(listed)) == pytest.approx(
        (77.81 - 57.88 - 17.62) * GIB, abs=0.01 * GIB
    )
    zero = listed.replace("Process 55179 has 77.81 GiB", "Process 55179 has 0 bytes")
    assert bench.process_figure(parse_oom(zero)) == (None, True)
    two = listed.replace("Process 55179", "Process 1 has 398.00 MiB memory in use. Process 55179")
    assert bench.process_figure(parse_oom(two)) == (None, False)  # which one failed is not known
