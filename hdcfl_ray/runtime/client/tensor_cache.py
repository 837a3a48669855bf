"""A byte-bounded cache of each client's transformed tensors inside a host.

Transforming a client's images (uint8 -> normalised float, rotation) once and
reusing the result is what keeps local training close to a plain torch loop;
the bound keeps a host with many clients from holding every dataset twice."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable

import torch

TensorPair = tuple[torch.Tensor, torch.Tensor]


class TensorCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, TensorPair] = OrderedDict()
        self._bytes = 0

    def get(self, key: Hashable, build: Callable[[], TensorPair]) -> TensorPair:
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        value = build()
        size = sum(tensor.element_size() * tensor.nelement() for tensor in value)
        if size > self.max_bytes:
            return value
        while self._entries and self._bytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= sum(tensor.element_size() * tensor.nelement() for tensor in evicted)
        self._entries[key] = value
        self._bytes += size
        return value
