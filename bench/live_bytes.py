"""Bytes of live tensor storages created by operators, and their high point (CPU measurement).

Shared by the benches that measure a working set on CPU (bench/backward_peak_accuracy.py,
bench/long_context_worker.py): a ``TorchDispatchMode`` sees every operator's outputs and keeps a
weak reference per storage, so a storage counts from the operator that created it until it is
freed. Storages that existed before (parameters, buffers, the batch) are excluded with
:meth:`LiveBytes.exclude`: an operator that returns a view of one (``weight.t()``) would otherwise
count it as new.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages operators have created that are still alive, and their high point."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._excluded: set[int] = set()

    def exclude(self, tensors: Any) -> None:
        """Never count the storages of ``tensors`` (an iterable of tensors), nor views of them."""
        self._excluded.update(t.untyped_storage().data_ptr() for t in tensors)

    def _count(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or key in self._refs or key in self._excluded:
            return  # a view of a storage already counted, or of one that existed before

        def freed(_ref: Any, key: int = key, nbytes: int = nbytes) -> None:
            self._refs.pop(key, None)
            self.live -= nbytes

        self._refs[key] = weakref.ref(storage, freed)
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def restart_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                self._count(value)
        return out
