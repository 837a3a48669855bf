"""Where a client's weights are during a batched training round (`runtime.batched_training`),
so that the round moves every client's weights between host and device together.

In a batched round each client's update runs on a model replica of its own
(training_rendezvous.py). There `ctx.load` writes the flat vectors into the client's row
of one host buffer (`StagingRows`, pinned memory on CUDA) instead of into the replica,
tensor by tensor; when the clients train together, the rows reach the device in one
transfer and are the stacked weights the batched steps start from (on the CPU they are
used where they lie). After the steps, on CUDA, the group's weights come back to the host
in one transfer (`TrainedRows`), checked for NaN and infinity on the device in the same
pass, and each client's `ctx.snapshot()` copies its row. Every value is copied, never
computed, so the bits are those of loading each replica and flattening it.

The replica holds the loaded weights whenever anything reads it: the context copies a
staged row in before it scores or trains a client alone, and a method that reads
`ctx.model` gets the loaded model and, for the rest of its update, loads into the model,
trains from it and snapshots it exactly as without batching (it may keep the modules
and change them, which the context cannot see). Models whose state the flat vectors do
not cover one to one (weights that are not float32, tied weights) are never staged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hdcfl_ray.models import FlatIndex, SplitModel
from hdcfl_ray.models.flat import checked_flat_vector, readonly_tensor

# the devices whose trained weights come back to the host in one transfer per group: on
# the CPU, flattening each client's replica when it takes its snapshot costs less
HOST_COPY_DEVICES = frozenset({"cuda"})
# every block of the staging buffer starts a multiple of 512 bytes in: as aligned as a
# fresh allocation (some CPU kernels round differently on less aligned weights)
_ALIGNMENT = 128  # float32 values


def named_state(model: SplitModel) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers as one module of encoder and head names them
    ("encoder.<name>", "head.<name>"; the batched step's names): parameters first."""
    tensors: dict[str, torch.Tensor] = {}
    for kind in ("named_parameters", "named_buffers"):
        for part in ("encoder", "head"):
            for name, tensor in getattr(getattr(model, part), kind)():
                tensors[f"{part}.{name}"] = tensor
    return tensors


@dataclass(frozen=True)
class _Block:
    """One flat entry of every row: `rows` x `size` values from `offset` in the buffer."""

    name: str  # as `named_state` names it
    shape: tuple[int, ...]
    size: int
    offset: int
    part: int  # 0: the encoder vector, 1: the head vector
    start: int  # where the entry lies in its vector


class StagingRows:
    """A host buffer with a row of weights per replica: for each flat entry (encoder's,
    then head's) a block of `rows` x its size, so that any leading run of rows of an
    entry is one contiguous stacked tensor. Pinned memory when the model is on CUDA."""

    def __init__(self, encoder_index: FlatIndex, head_index: FlatIndex, rows: int, device: torch.device) -> None:
        self.encoder_index, self.head_index, self.rows = encoder_index, head_index, rows
        self.blocks: list[_Block] = []
        offset = 0
        for part, (prefix, index) in enumerate((("encoder", encoder_index), ("head", head_index))):
            for entry in index.entries:
                self.blocks.append(_Block(f"{prefix}.{entry.name}", entry.shape, entry.size, offset, part, entry.offset))
                offset += -(-rows * entry.size // _ALIGNMENT) * _ALIGNMENT
        self.buffer = torch.empty(offset, dtype=torch.float32, device="cpu", pin_memory=device.type == "cuda")
        self._block_tensors = [self.buffer[b.offset : b.offset + rows * b.size].view(rows, b.size) for b in self.blocks]
        self._in_flight: torch.cuda.Event | None = None  # the last transfer out of the buffer

    @classmethod
    def for_model(cls, model: SplitModel, encoder_index: FlatIndex, head_index: FlatIndex, rows: int) -> StagingRows | None:
        """Rows for `rows` replicas of `model`, or None where staging cannot stand in for
        loading (a flat entry that is not a distinct float32 tensor of the model, or a
        parameter no flat entry covers)."""
        tensors = named_state(model)
        names = [f"encoder.{e.name}" for e in encoder_index.entries] + [f"head.{e.name}" for e in head_index.entries]
        if not names or any(name not in tensors or tensors[name].dtype != torch.float32 for name in names):
            return None
        storages = [tensors[name].data_ptr() for name in names if tensors[name].numel()]
        parameters = {f"{part}.{name}" for part in ("encoder", "head") for name, _ in getattr(model, part).named_parameters(remove_duplicate=False)}
        if len(set(storages)) != len(storages) or not parameters <= set(names):
            return None
        if not all(_dense(tensors[name]) for name in names):
            return None
        return cls(encoder_index, head_index, rows, next(iter(tensors.values())).device)

    def _settle(self) -> None:
        """Wait until the buffer's last transfer to the device has read it."""
        if self._in_flight is not None:
            self._in_flight.synchronize()
            self._in_flight = None

    def write(self, row: int, encoder: np.ndarray, head: np.ndarray) -> None:
        """Stage a client's flat vectors in its row (ValueError for vectors of another layout)."""
        vectors = (checked_flat_vector(encoder, self.encoder_index), checked_flat_vector(head, self.head_index))
        sources = [readonly_tensor(vector) for vector in vectors]
        self._settle()
        for block, rows in zip(self.blocks, self._block_tensors):  # torch's copies use the host's threads
            rows[row].copy_(sources[block.part][block.start : block.start + block.size])

    def read(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """A row as new flat vectors (encoder, head)."""
        vectors = (np.empty(self.encoder_index.total_size, np.float32), np.empty(self.head_index.total_size, np.float32))
        targets = [torch.from_numpy(vector) for vector in vectors]
        for block, rows in zip(self.blocks, self._block_tensors):
            targets[block.part][block.start : block.start + block.size].copy_(rows[row])
        return vectors

    def copy_into(self, row: int, model: SplitModel) -> None:
        """Copy a row into the model's tensors (what loading its vectors would write)."""
        tensors = named_state(model)
        with torch.no_grad():
            for block, source in zip(self.blocks, self._block_tensors):
                tensors[block.name].copy_(source[row].view(block.shape))

    def stacked(self, rows: list[int], replicas: list[SplitModel], device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The replicas' weights stacked as `torch.func.stack_module_state` stacks them
        (parameters, buffers; same names, order, shapes and strides), the flat entries
        taken from `rows` of the buffer (one transfer to a GPU) and the rest (integer
        buffers such as BatchNorm's batch count) from the replicas themselves."""
        if device.type == "cpu":
            source = self.buffer
        else:
            source = self.buffer.to(device, non_blocking=True)
            self._in_flight = torch.cuda.Event()
            self._in_flight.record()
        count = len(rows)
        leading = rows == list(range(count))
        picked = None if leading else torch.as_tensor(rows, dtype=torch.long, device=device)
        replica_state = [named_state(replica) for replica in replicas]
        from_rows: dict[str, torch.Tensor] = {}
        for block in self.blocks:
            every_row = source[block.offset : block.offset + self.rows * block.size].view(self.rows, *block.shape)
            stacked = every_row[:count] if picked is None else every_row.index_select(0, picked)
            like = replica_state[0][block.name]
            strides = (like.numel(), *like.stride())  # what torch.stack gives (channels_last kept)
            if stacked.stride() != strides:
                if like.is_contiguous():  # the same order; only the strides of sizes of one differ
                    stacked = stacked.as_strided(stacked.shape, strides, stacked.storage_offset())
                else:
                    stacked = torch.empty_strided(stacked.shape, strides, dtype=stacked.dtype, device=device).copy_(stacked)
            from_rows[block.name] = stacked
        parameters, buffers = {}, {}
        for part in ("encoder", "head"):
            for name, _ in getattr(replicas[0], part).named_parameters():
                parameters[f"{part}.{name}"] = from_rows[f"{part}.{name}"]
        for part in ("encoder", "head"):
            for name, _ in getattr(replicas[0], part).named_buffers():
                key = f"{part}.{name}"
                buffers[key] = from_rows[key] if key in from_rows else torch.stack([state[key] for state in replica_state]).detach()
        return parameters, buffers


def _dense(tensor: torch.Tensor) -> bool:
    """Contiguous in the logical order or in a channels-last order (what stacking keeps)."""
    if tensor.is_contiguous():
        return True
    channels_last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(tensor.dim())
    return channels_last is not None and tensor.is_contiguous(memory_format=channels_last)


class TrainedRows:
    """A group's trained weights on the host: a row per client in flat-vector order
    (encoder, then head), copied from the device in one transfer, and whether each row
    is finite (checked on the device)."""

    def __init__(self, values: torch.Tensor, finite: torch.Tensor, encoder_size: int, ready: torch.cuda.Event | None) -> None:
        self._values, self._finite, self._encoder_size, self._ready = values, finite, encoder_size, ready

    def client(self, position: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """A client's (encoder, head) as new arrays, and whether they are finite."""
        if self._ready is not None:
            self._ready.synchronize()
            self._ready = None
        row = self._values[position].numpy()
        return np.array(row[: self._encoder_size]), np.array(row[self._encoder_size :]), bool(self._finite[position])


def stacked_weights_to_device(staging: StagingRows, rows: list[int], replicas: list[SplitModel], device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A group's stacked weights from its staged rows (`StagingRows.stacked`)."""
    return staging.stacked(rows, replicas, device)


def stacked_rows(parameters: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], staging: StagingRows, count: int) -> torch.Tensor:
    """The group's stacked weights as one [clients, values] tensor on their device, each row
    a client's flat encoder then head (`flatten_module`'s values and order)."""
    every = {**parameters, **buffers}
    return torch.cat([every[block.name].reshape(count, block.size) for block in staging.blocks], dim=1)


def stacked_finite(rows: torch.Tensor) -> torch.Tensor:
    """Whether each row is free of NaN and infinity, on the rows' device."""
    return torch.isfinite(rows).all(dim=1)


def stacked_weights_to_host(rows: torch.Tensor, finite: torch.Tensor, encoder_size: int) -> TrainedRows:
    """The rows and their finiteness in host memory: one transfer each, pinned and
    asynchronous from a GPU (`TrainedRows.client` waits for it)."""
    pinned = rows.device.type == "cuda"
    values = torch.empty(rows.shape, dtype=rows.dtype, device="cpu", pin_memory=pinned).copy_(rows, non_blocking=pinned)
    flags = torch.empty(finite.shape, dtype=finite.dtype, device="cpu", pin_memory=pinned).copy_(finite, non_blocking=pinned)
    ready = None
    if pinned:
        ready = torch.cuda.Event()
        ready.record()
    return TrainedRows(values, flags, encoder_size, ready)


def take_trained_rows(parameters: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], staging: StagingRows, count: int) -> TrainedRows:
    """A group's trained weights, checked and copied to the host."""
    rows = stacked_rows(parameters, buffers, staging, count)
    return stacked_weights_to_host(rows, stacked_finite(rows), staging.encoder_index.total_size)


class ReplicaWeights:
    """One client's replica in a batched round and where its current weights are: its
    staging row (loaded, not yet copied into the replica), the replica, and the host
    copy of what its last batched training left there."""

    def __init__(self, model: SplitModel, staging: StagingRows, row: int) -> None:
        self.model, self.staging, self.row = model, staging, row
        self._staged = False  # the staging row holds the weights last loaded
        self._replica_current = True  # the replica holds the current weights
        self._exposed = False  # the method has the modules: only the replica is trusted
        self._trained: TrainedRows | None = None
        self._trained_position = 0

    @property
    def staged(self) -> bool:
        """Whether the group may start from the staging row."""
        return self._staged

    @property
    def snapshots_from_host_copy(self) -> bool:
        """Whether a host copy of trained weights would serve its snapshots (not once
        the method has the modules)."""
        return not self._exposed

    def load(self, encoder: np.ndarray, head: np.ndarray) -> bool:
        """Stage a load; False when the caller must load the replica itself (the
        method has the modules)."""
        self._trained = None
        if self._exposed:
            self._staged = False
            return False
        self.staging.write(self.row, encoder, head)
        self._staged, self._replica_current = True, False
        return True

    def materialise(self) -> None:
        """Copy staged weights into the replica, if it lacks them (the row stays valid:
        reading the replica does not change it)."""
        if not self._replica_current:
            self.staging.copy_into(self.row, self.model)
            self._replica_current = True

    def expose(self) -> None:
        """The method reads the model: it holds the loaded weights, and from now on it
        alone holds the client's weights (the method may change it unseen)."""
        self.materialise()
        self._exposed = True
        self._staged = False
        self._trained = None

    def written(self, trained: TrainedRows | None = None, position: int = 0) -> None:
        """The replica's weights were written in place (trained, alone or in a group);
        `trained`: the host copy the group took of them."""
        self._staged, self._replica_current = False, True
        self._trained = None if self._exposed else trained
        self._trained_position = position

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, bool] | None:
        """The current weights as new flat vectors, and whether they were checked finite
        on the device, without reading the replica; None when only the replica has them."""
        if self._trained is not None:
            return self._trained.client(self._trained_position)
        if self._staged:
            encoder, head = self.staging.read(self.row)
            return encoder, head, False
        return None
