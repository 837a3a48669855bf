"""Evaluation batched across a host's clients.

At an evaluation round most clients are scored with an encoder they share with
others: the global encoder of every shared-encoder method, one cluster model
per cluster, one prototype mixture per group where memberships are hard. Scored
one client at a time, each of them pays for loading the encoder and for a
forward pass over a handful of test images, and at cross-device scale that
per-client overhead, not the arithmetic, is the cost.

During `ClientHost.evaluate`, `ClientContext.score(params, head)` on a shared
encoder therefore returns a `PendingScore` and records the request here. An
encoder is shared when it is one of the call's broadcast objects (or a
ModelParams' encoder among them), or an array a method derived from them through
`shared_array` (HDC-FL's mixture for a hard membership). When every client of
the call has been seen (or as soon as a method reads a pending score), `flush`
groups the requests by encoder, loads each encoder once, encodes the test images
of all its clients together, and applies each client's own head to its own rows.
An encoder equal to a shared one in every value (a mixture that puts all its
weight on the global encoder) is scored as that shared encoder.
A client's own encoder (Local, Ditto, a soft mixture) is scored at once, one
client at a time, exactly as before.

The encoder runs in eval mode (BatchNorm reads its running statistics), so a
sample's features do not depend on its neighbours' values; kernels may still
round differently for batches of different sizes. Shared encoders therefore
always encode in forward passes of exactly `encode_rows(device)` images (the last
one padded with zeros; 64 on a CPU, 1,024 on a GPU): a client's scores then do not depend on which clients share
its host or how many hosts there are, on every CPU measured (content- and
position-independent rounding within a batch size). Each client's logits come
from its own head on its own rows and its loss is the float64 sum of per-chunk
cross-entropy sums over the same 512-image chunks as the per-client path, so
the two paths differ only by the batch-size rounding of the encoder's kernels
(tests/test_batched_scoring.py states the tolerance and finds them equal where
the kernels do not depend on the batch size).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable, Mapping

import numpy as np
import torch
from torch import nn

from hdcfl_ray.contract import EvalResult, EvalStats, ModelParams
from hdcfl_ray.models import FlatIndex, SplitModel, load_flat_into

# the images of one forward pass of a shared encoder (the last one padded): small enough
# that padding a group's last pass wastes little, large enough to run at full speed on a
# CPU (64 and 512 images per pass run at the same rate per image, measured)
ENCODE_ROWS = 64
# on a GPU a 64-image pass leaves most of the device idle (a launch-bound kernel per
# layer): a paper round's 10,000 test images then cost more than the round's training
ENCODE_ROWS_CUDA = 1024


def encode_rows(device: torch.device) -> int:
    """The fixed pass size of shared-encoder scoring on `device` (fixed per device, so
    a client's scores do not depend on which clients are scored beside it)."""
    return ENCODE_ROWS_CUDA if device.type == "cuda" else ENCODE_ROWS
# the chunks a client's loss is summed over on either path (the per-client path's batch size)
SCORING_CHUNK = 512
_STATS_FIELDS = frozenset(field for field in EvalStats.__dataclass_fields__)


def array_key(array: np.ndarray) -> tuple[Any, ...]:
    """Identity of an array's memory: two views of the same buffer share a key, so
    clients handed the same broadcast object land in one group. Valid while the
    array is alive (a request holds it until it is scored)."""
    interface = array.__array_interface__
    return (interface["data"][0], array.shape, interface["strides"], array.dtype.str)


@dataclass
class ScoreRequest:
    encoder: np.ndarray
    head: np.ndarray
    inputs: torch.Tensor
    labels: torch.Tensor
    own_classes: torch.Tensor
    result: EvalStats | None = None


class PendingScore:
    """An `EvalStats` still to be computed. Reading any of its fields scores every
    pending request of the batch first, so a method that looks at a score at once
    gets the same value, only without the batching."""

    __slots__ = ("_batch", "_request")

    def __init__(self, batch: EvaluationBatch, request: ScoreRequest) -> None:
        self._batch = batch
        self._request = request

    def resolved(self) -> EvalStats:
        if self._request.result is None:
            self._batch.flush()
        assert self._request.result is not None
        return self._request.result

    def __getattr__(self, name: str) -> Any:
        if name in _STATS_FIELDS:
            return getattr(self.resolved(), name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"PendingScore({self._request.result!r})"


def _resolved_stats(value: Any) -> Any:
    return value.resolved() if type(value) is PendingScore else value


class EvaluationBatch:
    """The score requests of one `ClientHost.evaluate` call."""

    def __init__(self, model: SplitModel, encoder_index: FlatIndex, head_index: FlatIndex, window_rows: int = 8192) -> None:
        self.model = model
        self.encoder_index = encoder_index
        weight = next(entry for entry in head_index.entries if entry.name == "weight")
        bias = next(entry for entry in head_index.entries if entry.name == "bias")
        self._weight, self._bias = weight, bias
        self.window_rows = window_rows
        self._pending: list[ScoreRequest] = []
        self._shared: dict[tuple[Any, ...], np.ndarray] = {}  # key -> the array (kept alive)
        self._derived: dict[Hashable, np.ndarray] = {}
        self.encoder_loads = 0  # encoders loaded by flushes (what batching saves; for tests)

    def share(self, value: Any) -> None:
        """Mark the arrays of a broadcast object as shared encoders: an array, a
        ModelParams' encoder, or those inside a mapping, list or tuple."""
        if isinstance(value, np.ndarray):
            self._shared[array_key(value)] = value
        elif isinstance(value, ModelParams):
            self.share(value.encoder)
        elif isinstance(value, Mapping):
            for item in value.values():
                self.share(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                self.share(item)

    def shared_array(self, key: Hashable, build: Callable[[], np.ndarray]) -> np.ndarray:
        """The array `build` makes, made once per call for every client asking with
        `key`, and shared (see `ClientContext.shared_array`)."""
        if key not in self._derived:
            array = np.asarray(build())
            self._derived[key] = array
            self._shared[array_key(array)] = array
        return self._derived[key]

    def defer(
        self, encoder: np.ndarray, head: np.ndarray, inputs: torch.Tensor, labels: torch.Tensor, own_classes: torch.Tensor
    ) -> PendingScore | None:
        """A shared encoder's score, pending; None for any other encoder or an empty
        test set (the caller scores those at once, one client at a time)."""
        if int(labels.shape[0]) == 0:
            return None
        encoder = np.asarray(encoder)
        if array_key(encoder) not in self._shared:
            encoder = self._equal_shared(encoder)
        if array_key(encoder) not in self._shared:
            return None
        request = ScoreRequest(encoder, np.asarray(head), inputs, labels, own_classes)
        self._pending.append(request)
        return PendingScore(self, request)

    def _equal_shared(self, encoder: np.ndarray) -> np.ndarray:
        """The shared array holding exactly `encoder`'s values (e.g. a mixture with weight
        0 on everything but the global encoder), else `encoder`: equal weights score
        equally, whichever object carries them."""
        for shared in self._shared.values():
            if (
                shared.shape == encoder.shape
                and shared.dtype == encoder.dtype
                and np.array_equal(shared[:16], encoder[:16])
                and np.array_equal(shared, encoder)
            ):
                return shared
        return encoder

    def resolve(self, result: EvalResult) -> EvalResult:
        """`result` with every pending score replaced by its EvalStats."""
        references = {name: _resolved_stats(stats) for name, stats in result.references.items()}
        if all(references[name] is stats for name, stats in result.references.items()):
            return result
        return replace(result, references=references)

    @torch.no_grad()
    def flush(self) -> None:
        """Score every pending request, one encoder load per distinct encoder."""
        pending, self._pending = self._pending, []
        groups: dict[tuple[Any, ...], list[ScoreRequest]] = {}
        for request in pending:
            groups.setdefault(array_key(request.encoder), []).append(request)
        self.model.encoder.eval()
        self.model.head.eval()
        for requests in groups.values():
            load_flat_into(self.model.encoder, requests[0].encoder, self.encoder_index)
            self.encoder_loads += 1
            for window in self._windows(requests):
                self._score_window(window)

    def _windows(self, requests: list[ScoreRequest]) -> list[list[ScoreRequest]]:
        windows: list[list[ScoreRequest]] = [[]]
        rows = 0
        for request in requests:
            size = int(request.labels.shape[0])
            if windows[-1] and rows + size > self.window_rows:
                windows.append([])
                rows = 0
            windows[-1].append(request)
            rows += size
        return windows

    def _score_window(self, window: list[ScoreRequest]) -> None:
        rows = [request.inputs for request in window]
        pass_size = encode_rows(rows[0].device)
        padding = -sum(int(part.shape[0]) for part in rows) % pass_size
        if padding:
            rows.append(rows[0].new_zeros((padding, *rows[0].shape[1:])))
        inputs = rows[0] if len(rows) == 1 else torch.cat(rows)
        if inputs.dim() == 4 and rows[0].is_contiguous(memory_format=torch.channels_last):
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        encoder: nn.Module = self.model.encoder
        features = torch.cat([encoder(inputs[start : start + pass_size]) for start in range(0, int(inputs.shape[0]), pass_size)])
        device = features.device
        sizes = [int(request.labels.shape[0]) for request in window]
        features = features[: sum(sizes)]
        labels = torch.cat([request.labels for request in window])
        logits = self._window_logits(window, features, sizes)
        # Per-image losses and right answers for the whole window at once, summed per
        # client chunk in float64 (index_add_ adds rows in order: the same sums
        # whichever clients share the window).
        chunk_sizes = [min(SCORING_CHUNK, size - start) for size in sizes for start in range(0, size, SCORING_CHUNK)]
        chunk_of_row = torch.repeat_interleave(torch.arange(len(chunk_sizes), device=device), torch.as_tensor(chunk_sizes, device=device))
        client_of_row = torch.repeat_interleave(torch.arange(len(window), device=device), torch.as_tensor(sizes, device=device))
        own_masks = torch.zeros((len(window), logits.shape[1]), dtype=torch.bool, device=device)
        for row, request in enumerate(window):
            own_masks[row, request.own_classes] = True
        losses = nn.functional.cross_entropy(logits, labels, reduction="none").double()
        right = (logits.argmax(dim=1) == labels).double()
        # argmax over the client's own classes only (as restricted_predictions)
        right_own = (logits.masked_fill(~own_masks[client_of_row], float("-inf")).argmax(dim=1) == labels).double()
        sums = torch.zeros((3, len(chunk_sizes)), dtype=torch.float64, device=device)
        sums[0].index_add_(0, chunk_of_row, losses)
        sums[1].index_add_(0, chunk_of_row, right)
        sums[2].index_add_(0, chunk_of_row, right_own)
        loss_values, correct_values, own_values = sums.tolist()  # one read per window
        chunk = 0
        for request, size in zip(window, sizes):
            loss_total = 0.0
            right_count = right_own_count = 0
            for _ in range(0, size, SCORING_CHUNK):
                loss_total += loss_values[chunk]
                right_count += int(correct_values[chunk])
                right_own_count += int(own_values[chunk])
                chunk += 1
            request.result = EvalStats(
                accuracy=right_count / size, loss=loss_total / size, num_samples=size, accuracy_own_classes=right_own_count / size
            )

    def _window_logits(self, window: list[ScoreRequest], features: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Every row's logits from its own client's head (float32): one product when
        the whole window shares one head (a global model), else one per client."""
        weight, bias = self._weight, self._bias
        head_keys = {array_key(request.head) for request in window}
        if len(head_keys) == 1:
            head = torch.from_numpy(np.asarray(window[0].head, dtype=np.float32)).to(features.device)
            return nn.functional.linear(features, head[weight.offset : weight.stop].view(weight.shape), head[bias.offset : bias.stop].view(bias.shape)).float()
        # every head of the window crosses to the device once
        heads = torch.from_numpy(np.stack([np.asarray(request.head, dtype=np.float32) for request in window])).to(features.device)
        parts = []
        offset = 0
        for row, size in enumerate(sizes):
            head_weight = heads[row, weight.offset : weight.stop].view(weight.shape)
            head_bias = heads[row, bias.offset : bias.stop].view(bias.shape)
            parts.append(nn.functional.linear(features[offset : offset + size], head_weight, head_bias))
            offset += size
        return torch.cat(parts).float()
