"""How many bytes a value moved between server and client counts for.

A message is counted by the data it carries, the same on every backend: the
`nbytes` of each numpy array (a `ModelParams` is its encoder plus its head), the
width of each scalar (8 bytes for a Python int or float, 1 for a bool, a numpy
scalar's itemsize), the UTF-8 length of a string. Containers (mappings, lists,
tuples, the package's dataclasses) count as the sum of what they hold; the names
of models and values and the containers themselves are framing, not data, and
count nothing, so a count does not depend on how a transport serialises. A
reference to a stored object (a Ray ObjectRef, an in-process future, a
`StoreRef`) counts as the object it names, fetched through `resolve` (on Ray a
zero-copy read on the server's node), because that object is what the receiver
reads. Anything else counts as its pickled length, what Ray would move for it.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from hdcfl_ray.runtime.server.messages import StoreRef

SCALAR_BYTES = 8  # a Python int or float travels as a 64-bit number


def payload_bytes(value: Any, resolve: Callable[[Any], Any]) -> int:
    """The bytes `value` counts for (module docstring); `resolve` reads a stored object
    from its reference (the transport's `get`)."""
    if value is None:
        return 0
    if isinstance(value, (bool, np.bool_)):
        return 1
    if isinstance(value, (int, float)):
        return SCALAR_BYTES
    if isinstance(value, complex):
        return 2 * SCALAR_BYTES
    if isinstance(value, (np.ndarray, np.generic)):
        return int(value.nbytes)
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, Mapping):
        return sum(payload_bytes(item, resolve) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(item, resolve) for item in value)
    if isinstance(value, StoreRef):
        return payload_bytes(resolve(value.ref), resolve)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(payload_bytes(getattr(value, field.name), resolve) for field in dataclasses.fields(value))
    nbytes = getattr(value, "nbytes", None)  # a tensor or buffer of another library
    if isinstance(nbytes, int):
        return nbytes
    resolved = resolve(value)
    if resolved is not value:  # a reference: count what it names
        return payload_bytes(resolved, resolve)
    return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
