"""Reading pickled CIFAR batch files without letting them run arbitrary code.

A pickle may name any importable callable; `pickle.load` would call it. These
files need only numpy array reconstruction and the byte-string codec that
protocol-2 pickles use, so everything else is refused.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from hdcfl_ray.errors import ScenarioError

try:
    from numpy._core.multiarray import _reconstruct as _numpy_reconstruct
except ImportError:  # numpy < 2 has no numpy._core
    from numpy.core.multiarray import _reconstruct as _numpy_reconstruct


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    # Protocol-2 pickles written by Python 3 store bytes as _codecs.encode(text, "latin1");
    # other codecs are not needed and are not offered.
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"codec {encoding!r} is not allowed, only latin1")
    return text.encode("latin1")


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}


class ArrayOnlyUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals numpy arrays need."""

    def __init__(self, file: Any, source: Path) -> None:
        # latin1 lets Python 2 byte strings (array buffers, dict keys) load unchanged.
        super().__init__(file, encoding="latin1")
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED_GLOBALS.get((module, name))
        if allowed is None:
            raise ScenarioError(
                f"{self._source}: refused to load: the file references {module}.{name}, which a "
                "CIFAR batch file never needs. It is not an original CIFAR file; replace it with "
                "one extracted from the official archive."
            )
        return allowed


def load_array_pickle(path: Path) -> dict[str, Any]:
    """Load a pickled dict of arrays/lists; bytes keys become str keys."""
    try:
        with path.open("rb") as file:
            content = ArrayOnlyUnpickler(file, path).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        raise ScenarioError(f"{path}: not a readable CIFAR batch file ({error}); re-extract it") from error
    if not isinstance(content, dict):
        raise ScenarioError(f"{path}: expected a pickled dict, found {type(content).__name__}; re-extract it")
    return {key.decode("latin1") if isinstance(key, bytes) else key: value for key, value in content.items()}
