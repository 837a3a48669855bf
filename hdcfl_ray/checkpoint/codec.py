"""A safe encoding of run state: JSON for structure, one .npz for arrays.

Only plain values, numpy arrays, lists, tuples, dicts and dataclasses defined
in this package are accepted; decoding imports nothing outside `hdcfl_ray`
and constructs only dataclasses, so a checkpoint cannot run code. ObjectRefs
are stored as their values and put back into the object store on decode.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import sys
from typing import Any, Callable

import numpy as np

PACKAGE = "hdcfl_ray."
# Modules whose dataclasses a checkpoint holds, by the name a checkpoint written before
# hdcfl_ray/runtime was laid out by concept, or before the method contract became its
# own layer (algorithms/base.py), gives them: such a run still resumes.
MOVED_MODULES = {
    "hdcfl_ray.algorithms.base": "hdcfl_ray.contract.values",
    "hdcfl_ray.algorithms.ala": "hdcfl_ray.algorithms.fedala_weights",
    "hdcfl_ray.runtime.async_server": "hdcfl_ray.runtime.server.async_server",
    "hdcfl_ray.runtime.host_pool": "hdcfl_ray.runtime.server.host_pool",
    "hdcfl_ray.runtime.messages": "hdcfl_ray.runtime.server.messages",
}


class CheckpointFormatError(ValueError):
    """A checkpoint holds something this codec does not write."""


class Encoder:
    def __init__(self, fetch: Callable[[Any], Any] | None = None) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.fetch = fetch

    def encode(self, value: Any) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, (float, np.floating)):
            number = float(value)
            return number if math.isfinite(number) else {"__float__": repr(number)}
        if isinstance(value, np.ndarray):
            key = f"a{len(self.arrays)}"
            self.arrays[key] = value
            return {"__array__": key}
        if isinstance(value, tuple):
            return {"__tuple__": [self.encode(item) for item in value]}
        if isinstance(value, list):
            return [self.encode(item) for item in value]
        if isinstance(value, dict):
            return {"__dict__": [[self.encode(k), self.encode(v)] for k, v in value.items()]}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            cls = type(value)
            if not cls.__module__.startswith(PACKAGE):
                raise CheckpointFormatError(f"cannot checkpoint {cls.__module__}.{cls.__qualname__}")
            fields = {field.name: self.encode(getattr(value, field.name)) for field in dataclasses.fields(value)}
            return {"__dataclass__": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
        if _is_object_ref(value):
            if self.fetch is None:
                raise CheckpointFormatError("an ObjectRef needs a fetch function to be checkpointed")
            return {"__ref__": self.encode(self.fetch(value))}
        raise CheckpointFormatError(f"cannot checkpoint a value of type {type(value).__name__}")


class Decoder:
    def __init__(self, arrays: dict[str, np.ndarray], put: Callable[[Any], Any] | None = None) -> None:
        self.arrays = arrays
        self.put = put

    def decode(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.decode(item) for item in value]
        if not isinstance(value, dict):
            return value
        if "__array__" in value:
            return np.array(self.arrays[value["__array__"]], copy=True)
        if "__float__" in value:
            return float(value["__float__"])
        if "__tuple__" in value:
            return tuple(self.decode(item) for item in value["__tuple__"])
        if "__dict__" in value:
            return {_hashable(self.decode(k)): self.decode(v) for k, v in value["__dict__"]}
        if "__ref__" in value:
            inner = self.decode(value["__ref__"])
            return self.put(inner) if self.put is not None else inner
        if "__dataclass__" in value:
            return self._dataclass(value["__dataclass__"], value["fields"])
        raise CheckpointFormatError(f"unknown entry {sorted(value)[:3]}")

    def _dataclass(self, name: str, fields: dict[str, Any]) -> Any:
        module_name, _, qualname = name.partition(":")
        if not module_name.startswith(PACKAGE) or "." in qualname:
            raise CheckpointFormatError(f"refusing to build {name!r}: not a dataclass of this package")
        module_name = MOVED_MODULES.get(module_name, module_name)
        cls = getattr(importlib.import_module(module_name), qualname, None)
        if cls is None or not dataclasses.is_dataclass(cls):
            raise CheckpointFormatError(f"refusing to build {name!r}: not a dataclass of this package")
        instance = object.__new__(cls)
        known = {field.name: field for field in dataclasses.fields(cls)}
        for field_name, encoded in fields.items():
            if field_name not in known:
                raise CheckpointFormatError(f"{name} has no field {field_name!r}")
            object.__setattr__(instance, field_name, self.decode(encoded))
        # a field added to the class after the checkpoint was written takes its default
        # (a server state's optimiser moments)
        for field_name, field in known.items():
            if field_name in fields:
                continue
            if field.default is not dataclasses.MISSING:
                object.__setattr__(instance, field_name, field.default)
            elif field.default_factory is not dataclasses.MISSING:
                object.__setattr__(instance, field_name, field.default_factory())
        return instance


def writable(value: Any) -> Any:
    """`value` with every read-only array replaced by a writable copy, its structure
    (package dataclasses, dicts, lists, tuples) and everything else kept as is.

    A snapshot that reaches a Ray actor as an argument arrives through the object
    store, whose arrays are read-only views; a method that updates its state in
    place (FedSoft's importance rows) must get arrays it can write."""
    if isinstance(value, np.ndarray):
        return value if value.flags.writeable else value.copy()
    if isinstance(value, list):
        return [writable(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(writable(item) for item in value)
    if isinstance(value, dict):
        return {key: writable(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and type(value).__module__.startswith(PACKAGE):
        for field in dataclasses.fields(value):
            object.__setattr__(value, field.name, writable(getattr(value, field.name)))
        return value
    return value


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


# the in-process stand-ins for ObjectRefs a backend hands out (the local backend's
# host-thread results), registered by the runtime that defines them: the codec stays
# below the runtime and imports none of its types
IN_PROCESS_REFS: list[type] = []


def register_in_process_ref(kind: type) -> None:
    if kind not in IN_PROCESS_REFS:
        IN_PROCESS_REFS.append(kind)


def _is_object_ref(value: Any) -> bool:
    """A Ray ObjectRef, or a backend's in-process one (a host thread's result)."""
    if isinstance(value, tuple(IN_PROCESS_REFS)):
        return True
    ray = sys.modules.get("ray")  # no ObjectRef exists in a process that never imported Ray
    return ray is not None and isinstance(value, ray.ObjectRef)
