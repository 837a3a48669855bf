"""Counting, on the CPU, the operations that would make the host wait for a GPU.

On CUDA the host queues kernels and goes on; it stops and waits when it needs a value
back (`.item()`, `.tolist()`, `bool(tensor)`, a boolean mask, `nonzero`), or when it
copies host memory to the device (a tensor built from a Python list on the device, a
CPU tensor moved there). Those calls look the same at torch's dispatcher on any device,
so a dispatch mode that records them shows, without a GPU, where a loop would stall one."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# values read back to the host, or results whose size the host must learn
_READS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.unique_consecutive, aten._unique2, aten.item}
# tensors made from host data (torch.tensor / as_tensor of Python values), and host-side draws
_HOST_MADE = {aten.lift_fresh, aten.lift_fresh_copy, aten.randperm}


def _has_bool_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else None
    return isinstance(indices, (list, tuple)) and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


# Tensor methods that hand a value to Python or move a tensor between devices: some never
# reach the dispatcher as an operation of their own (tolist, numpy), so they are seen here
_READ_METHODS = {"tolist", "numpy", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "cuda"}


def _names_a_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a `.to(...)` call names a device (any: the loop should move nothing)."""
    if "device" in kwargs:
        return True
    return any(isinstance(arg, (str, torch.device)) for arg in args[1:])


class _DispatchLevel(TorchDispatchMode):
    def __init__(self, syncs: list[str]) -> None:
        super().__init__()
        self.syncs = syncs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in _READS or packet in _HOST_MADE:
            self.syncs.append(str(packet))
        elif packet in (aten.index, aten.index_put, aten.index_put_) and _has_bool_index(args):
            self.syncs.append(f"{packet} with a boolean mask")
        return func(*args, **kwargs)


class _FunctionLevel(TorchFunctionMode):
    def __init__(self, syncs: list[str]) -> None:
        super().__init__()
        self.syncs = syncs

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _READ_METHODS and args and isinstance(args[0], torch.Tensor):
            self.syncs.append(f"Tensor.{name}")
        elif name == "to" and args and isinstance(args[0], torch.Tensor) and _names_a_device(args, kwargs):
            self.syncs.append("Tensor.to(a device)")
        return func(*args, **kwargs)


class HostSyncCounter:
    """Records, by name, every operation inside the `with` block that would make the
    host wait for a GPU: at torch's Python level (a value handed to Python, a tensor
    moved to a device) and at its dispatcher (a scalar read, a mask, host data made a
    tensor, a draw on the host)."""

    def __init__(self) -> None:
        self.syncs: list[str] = []
        self._modes = (_FunctionLevel(self.syncs), _DispatchLevel(self.syncs))

    def __enter__(self) -> "HostSyncCounter":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
