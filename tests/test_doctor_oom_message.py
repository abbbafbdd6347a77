"""PyTorch's out-of-memory messages as users pasted them into public issues, each parsed into
the numbers it states (expected values read off the message text itself)."""

from __future__ import annotations

import pytest

from dsgen.doctor.oom_message import parse_oom
from dsgen.errors import DsgenError

MIB = 1 << 20
GIB = 1 << 30


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-3)


# (source URL, message, format, tried, capacity, allocated, reserved but unallocated, process in use, fragmentation)
MESSAGES = [
    (
        "https://github.com/pytorch/pytorch/issues/16417",
        "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; "
        "8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)",
        "legacy-cached",
        12.50 * MIB,
        10.92 * GIB,
        8.57 * MIB,
        4.68 * MIB,
        None,
        False,
    ),
    (
        "https://github.com/anhaidgroup/deepmatcher/issues/74",
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 1.96 GiB total capacity; "
        "923.43 MiB already allocated; 15.62 MiB free; 954.00 MiB reserved in total by PyTorch)",
        "legacy-reserved",
        20 * MIB,
        1.96 * GIB,
        923.43 * MIB,
        (954.00 - 923.43) * MIB,
        None,
        True,
    ),
    (
        "https://github.com/hiyouga/LlamaFactory/issues/1221",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.14 GiB (GPU 5; 31.75 GiB total "
        "capacity; 28.28 GiB already allocated; 1.95 GiB free; 28.28 GiB reserved in total by PyTorch) If "
        "reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See "
        "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
        "legacy-reserved",
        3.14 * GIB,
        31.75 * GIB,
        28.28 * GIB,
        0,
        None,
        False,
    ),
    (
        "https://github.com/carolchenyx/MGFN./issues/35",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty "
        "of 6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and "
        "2.30 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
        "PYTORCH_CUDA_ALLOC_CONF",
        "current",
        1.70 * GIB,
        6.00 * GIB,
        2.93 * GIB,
        2.30 * GIB,
        None,
        True,
    ),
    (
        "https://github.com/pytorch/pytorch/issues/16417",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total "
        "capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has "
        "23.60 GiB memory in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
        "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        "current",
        22 * MIB,
        23.65 * GIB,
        22.90 * GIB,
        194.87 * MIB,
        23.60 * GIB,
        True,
    ),
    (
        "https://github.com/murong-xu/CADS/issues/4",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total capacity "
        "of 31.47 GiB of which 12.73 GiB is free. Including non-PyTorch memory, this process has 18.73 GiB "
        "memory in use. Of the allocated memory 9.08 GiB is allocated by PyTorch, and 9.35 GiB is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
        "current",
        22.78 * GIB,
        31.47 * GIB,
        9.08 * GIB,
        9.35 * GIB,
        18.73 * GIB,
        False,
    ),
    (
        "https://github.com/hiyouga/LlamaFactory/issues/1936",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 136.00 MiB. GPU 0 has a total "
        "capacty of 23.65 GiB of which 93.81 MiB is free. Process 62201 has 398.00 MiB memory in use. Process "
        "62203 has 398.00 MiB memory in use. Process 62200 has 21.98 GiB memory in use. Of the allocated memory "
        "21.51 GiB is allocated by PyTorch, and 2.30 MiB is reserved by PyTorch but unallocated.",
        "current",
        136 * MIB,
        23.65 * GIB,
        21.51 * GIB,
        2.30 * MIB,
        None,
        False,
    ),
    (
        "https://github.com/ZHZisZZ/dllm/issues/9",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 14.9 GiB.",
        "current",
        14.9 * GIB,
        None,
        None,
        None,
        None,
        False,
    ),
    (
        "https://github.com/huggingface/trl/issues/3172",
        "CUDA out of memory. Tried to allocate 130.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which "
        "12.81 MiB is free. Process 3427 has 0 bytes memory in use. Process 3423 has 0 bytes memory in use. "
        "Including non-PyTorch memory, this process has 0 bytes memory in use. Of the allocated memory 10.47 GiB "
        "is allocated by PyTorch, and 93.52 MiB is reserved by PyTorch but unallocated.",
        "current",
        130 * MIB,
        79.10 * GIB,
        10.47 * GIB,
        93.52 * MIB,
        None,  # "0 bytes" beside 10.47 GiB of tensors: the process figure was not available
        False,
    ),
]


@pytest.mark.parametrize(
    ("url", "text", "fmt", "tried", "capacity", "allocated", "unallocated", "in_use", "fragmentation"),
    MESSAGES,
    ids=[f"{i}-{m[2]}" for i, m in enumerate(MESSAGES)],
)
def test_real_messages(
    url: str,
    text: str,
    fmt: str,
    tried: float,
    capacity: float | None,
    allocated: float | None,
    unallocated: float | None,
    in_use: float | None,
    fragmentation: bool,
) -> None:
    assert url.startswith("https://github.com/")
    m = parse_oom(text)
    assert m.format == fmt
    assert m.tried == approx(tried)
    for got, want in (
        (m.capacity, capacity),
        (m.allocated, allocated),
        (m.reserved_unallocated, unallocated),
        (m.process_in_use, in_use),
    ):
        if want is None:
            assert got is None
        else:
            assert got == pytest.approx(want, abs=MIB)
    assert m.fragmentation is fragmentation


def test_line_breaks_inside_the_message_are_ignored() -> None:
    text = MESSAGES[4][1].replace(". ", ".\n")
    assert parse_oom(text).process_in_use == parse_oom(MESSAGES[4][1]).process_in_use


def test_a_word_broken_by_the_terminal_is_read() -> None:
    """https://github.com/modelscope/ms-swift/issues/4023 as pasted: the terminal broke "memory"."""
    text = (
        "CUDA out of memory. Tried to allocate 462.00 MiB. GPU 4 has a total capacity of 79.11 GiB of which "
        "462.56 MiB is free. Process 179754 has 78.61 GiB memory in use. Of the allocated memor\n"
        "y 74.57 GiB is allocated by PyTorch, and 92.46 MiB is reserved by PyTorch but unallocated."
    )
    m = parse_oom(text)
    assert m.allocated == pytest.approx(74.57 * GIB, abs=MIB)
    assert m.reserved_unallocated == pytest.approx(92.46 * MIB, abs=MIB)
    assert m.free == pytest.approx(462.56 * MIB, abs=MIB)


@pytest.mark.parametrize("text", ["", "RuntimeError: CUDA error: device-side assert triggered", "Tried to allocate"])
def test_other_text_is_bad_input(text: str) -> None:
    with pytest.raises(DsgenError) as info:
        parse_oom(text)
    assert "--error" in info.value.message
