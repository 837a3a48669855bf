"""Weighted averaging of flat parameter vectors: the one aggregation rule that
FedAvg's global encoder and HDC-FL's encoder prototypes share.

Both the global encoder and the single-group prototype go through this function
in the same client order, so with full participation they agree bit for bit
(docs/hdcfl.md, section 2).

The fold reads one vector at a time (a round's uploads are never all held). A
large vector (a ResNet-18 encoder: 11 million values) is folded by several threads
at once, each over its own slice: every value goes through the same operations in
the same client order, so the bits do not depend on the thread count
(tests/test_weighted_average_threads.py).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TypeVar, overload

import numpy as np

from hdcfl_ray.contract import ModelParams

Item = TypeVar("Item")


class LazyColumn(Sequence[np.ndarray]):
    """One array per item, read only when indexed and not kept.

    `weighted_average(LazyColumn(uploads, lambda u: u.models["model"].encoder), w)`
    reads one upload at a time: on Ray each upload stays in the object store
    (which spills to disk past its cap) until the fold reaches it, so the server
    never holds a round's uploads at once (streaming aggregation, docs/benchmarks.md).
    A list comprehension over the same uploads would hold all of them."""

    def __init__(self, items: Sequence[Item], read: Callable[[Item], np.ndarray]) -> None:
        self._items = items
        self._read = read

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> "LazyColumn": ...

    def __getitem__(self, index: int | slice) -> "np.ndarray | LazyColumn":
        if isinstance(index, slice):
            return LazyColumn(self._items[index], self._read)
        return self._read(self._items[index])


def weighted_average(vectors: Sequence[np.ndarray] | np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """Return sum_k w_k v_k / sum_k w_k as float32.

    `vectors` is a sequence of equally shaped arrays or a stacked array whose first
    axis indexes them. Accumulation is in float64 and runs in the given order, so the
    same inputs in the same order give the same bits on every call.
    """
    weight_array = np.asarray(weights, dtype=np.float64)
    if weight_array.ndim != 1:
        raise ValueError(f"weights must be one number per vector, got shape {weight_array.shape}")
    count = len(vectors)
    if count == 0:
        raise ValueError("weighted_average needs at least one vector, got none")
    if weight_array.shape[0] != count:
        raise ValueError(f"weighted_average got {count} vectors but {weight_array.shape[0]} weights")
    if not np.all(np.isfinite(weight_array)) or np.any(weight_array < 0):
        raise ValueError(f"weights must be finite and non-negative, got {weight_array.tolist()}")
    total = float(np.sum(weight_array))
    if total <= 0.0:
        raise ValueError(f"weights must have a positive total, got {total}")

    shape = np.shape(vectors[0])
    accumulator = np.zeros(shape, dtype=np.float64)
    flat_accumulator = accumulator.reshape(-1)
    slices = _thread_slices(flat_accumulator.shape[0])
    with _pool(len(slices)) as pool:
        for index in range(count):  # one vector at a time: a LazyColumn's upload is read when its turn comes
            vector = np.asarray(vectors[index])
            if vector.shape != shape:
                raise ValueError(f"vector {index} has shape {vector.shape}, expected {shape} like vector 0")
            scale = weight_array[index] / total
            flat = vector.reshape(-1)
            if pool is None:
                _fold_into(flat_accumulator, flat, scale)
            else:  # each thread its own slice of the vector: the same operations on each value
                list(pool.map(lambda part: _fold_into(flat_accumulator[part], flat[part], scale), slices))
    return accumulator.astype(np.float32)


def _fold_into(accumulator: np.ndarray, vector: np.ndarray, scale: float) -> None:
    """accumulator += scale * float64(vector), one cache-sized block at a time: the same
    operations on every value as the whole-vector expression (so the same bits),
    without two temporaries as long as the vector. numpy lets go of the GIL in each
    operation, so threads folding disjoint slices run at once."""
    scratch = np.empty(min(_BLOCK, vector.shape[0]), dtype=np.float64)
    for start in range(0, vector.shape[0], _BLOCK):
        block = vector[start : start + _BLOCK]
        buffer = scratch[: block.shape[0]]
        np.copyto(buffer, block, casting="safe")
        np.multiply(buffer, scale, out=buffer)
        np.add(accumulator[start : start + _BLOCK], buffer, out=accumulator[start : start + _BLOCK])


def _thread_slices(size: int) -> list[slice]:
    """Disjoint slices of a vector of `size` values, one per thread that pays off: a
    thread per `_PER_THREAD` values, at most one per core this process may use."""
    threads = max(1, min(_usable_cores(), size // _PER_THREAD))
    bounds = [size * part // threads for part in range(threads + 1)]
    return [slice(bounds[part], bounds[part + 1]) for part in range(threads)]


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextmanager
def _pool(threads: int) -> Iterator[ThreadPoolExecutor | None]:
    if threads < 2:
        yield None
        return
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="weighted-average") as pool:
        yield pool


_BLOCK = 1 << 16  # 64 Ki floats: 512 KiB of float64 scratch, fits in L2
_PER_THREAD = 1 << 20  # values per thread: below about a million, starting threads costs more than they save


def weighted_average_model(items: Sequence[Item], read: Callable[[Item], ModelParams], weights: Sequence[float]) -> ModelParams:
    """The weighted average of the full models `read(item)` (encoder and head, each one
    `weighted_average` in the given order), reading one item's model at a time."""
    return ModelParams(
        encoder=weighted_average(LazyColumn(items, lambda item: read(item).encoder), weights),
        head=weighted_average(LazyColumn(items, lambda item: read(item).head), weights),
    )
