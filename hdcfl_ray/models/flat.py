"""Flat parameter vectors: one contiguous float32 array per model part.

Encoders and heads travel between the driver and the client actors as a single
1-D numpy array plus a `FlatIndex` naming the slice of every state entry, so
averaging, prototype mixing and descriptors are plain vector arithmetic and
Ray's object store carries one buffer per part.

The vector covers every floating-point entry of `module.state_dict()`, in
state-dict order: parameters and float buffers (BatchNorm running mean and
variance). Integer buffers such as `num_batches_tracked` are counters, not
weights; they are left out and stay as the receiving module's own.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from math import prod

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class FlatEntry:
    """Where one state entry lives in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int
    size: int

    @property
    def stop(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class FlatIndex:
    """The layout of a module's flat vector; equal indexes mean compatible vectors."""

    entries: tuple[FlatEntry, ...]

    @classmethod
    def of(cls, module: nn.Module) -> "FlatIndex":
        entries: list[FlatEntry] = []
        offset = 0
        for name, tensor in module.state_dict().items():
            if not tensor.is_floating_point():
                continue
            shape = tuple(int(dim) for dim in tensor.shape)
            size = prod(shape)
            entries.append(FlatEntry(name=name, shape=shape, offset=offset, size=size))
            offset += size
        return cls(entries=tuple(entries))

    @property
    def total_size(self) -> int:
        return self.entries[-1].stop if self.entries else 0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(entry.name for entry in self.entries)


def flatten_module(module: nn.Module) -> np.ndarray:
    """Every floating-point state entry of `module`, concatenated into a new float32 array."""
    float_tensors = [tensor for tensor in module.state_dict().values() if tensor.is_floating_point()]
    if not float_tensors:
        return np.zeros(0, dtype=np.float32)
    devices = {tensor.device for tensor in float_tensors}
    # On a single device the concatenation happens there and crosses to the CPU
    # once; torch.cat always allocates, so the array never aliases the module.
    staging_device = devices.pop() if len(devices) == 1 else torch.device("cpu")
    pieces = [tensor.detach().reshape(-1).to(device=staging_device, dtype=torch.float32) for tensor in float_tensors]
    return torch.cat(pieces).cpu().numpy()


def load_flat_into(module: nn.Module, vector: np.ndarray, index: FlatIndex | None = None) -> None:
    """Copy `vector` into the module's tensors in place (same storage, same device).

    `vector` may be read-only, as arrays from Ray's object store are; it is only
    read. Passing the index saves rebuilding it; it must describe this module.
    """
    layout = index if index is not None else FlatIndex.of(module)
    source_array = checked_flat_vector(vector, layout)
    state = module.state_dict()
    source = readonly_tensor(source_array)
    # One transfer per device rather than one per entry when the module is on a GPU.
    source_by_device: dict[torch.device, torch.Tensor] = {torch.device("cpu"): source}
    with torch.no_grad():
        for entry in layout.entries:
            target = state.get(entry.name)
            if target is None:
                raise ValueError(f"flat index entry {entry.name!r} is not in the module's state dict")
            if tuple(target.shape) != entry.shape:
                raise ValueError(
                    f"flat index entry {entry.name!r} has shape {entry.shape} but the module's tensor has {tuple(target.shape)}"
                )
            if target.device not in source_by_device:
                source_by_device[target.device] = source.to(target.device)
            values = source_by_device[target.device][entry.offset : entry.stop]
            target.copy_(values.view(entry.shape))


def checked_flat_vector(vector: np.ndarray, index: FlatIndex) -> np.ndarray:
    """`vector` as the contiguous 1-D float32 array a module laid out as `index` loads
    (converted only where it is not one already); ValueError for another length."""
    array = _as_float32_vector(vector)
    if array.shape[0] != index.total_size:
        raise ValueError(f"flat vector has {array.shape[0]} values but the index describes {index.total_size}")
    return array


def unflatten(vector: np.ndarray, index: FlatIndex) -> dict[str, torch.Tensor]:
    """The named tensors of a flat vector, as fresh CPU float32 tensors (for inspection)."""
    owned = torch.from_numpy(np.array(_as_float32_vector(vector), dtype=np.float32, copy=True))
    if owned.shape[0] != index.total_size:
        raise ValueError(f"flat vector has {owned.shape[0]} values but the index describes {index.total_size}")
    return {entry.name: owned[entry.offset : entry.stop].view(entry.shape) for entry in index.entries}


def _as_float32_vector(vector: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(vector, dtype=np.float32)
    if array.ndim != 1:
        raise ValueError(f"a flat vector is 1-D, got shape {array.shape}")
    return array


def readonly_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor over `array`'s memory, to copy from (it may be read-only)."""
    # torch warns that a tensor over a read-only array could be written through;
    # this one is only ever a copy source, so the warning would be noise.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
        return torch.from_numpy(array)
