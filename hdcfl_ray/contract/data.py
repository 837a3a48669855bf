"""The declarations that make a partition, a data source or a client transform.

Like a method (`MethodSpec`), each is one frozen object: its name (the scenario's
`partition.kind`, `dataset.name` or `partition.transform`), a one-line summary,
its parameters as a Section (a plugin's keys live in a section of their own,
`partition.<name>` or `dataset.<name>`) and the function that does the work.
The built-in ones are declared the same way; an installed package adds its own
through the entry point groups in `hdcfl_ray.plugins` (docs/extending.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

import numpy as np

from hdcfl_ray.contract.method import NoParams
from hdcfl_ray.contract.section import Section

ParamsT = TypeVar("ParamsT", bound=Section)

_NAME = re.compile(r"[a-z][a-z0-9_]*")


def _check(kind: str, name: str, params: Any) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{kind} name {name!r}: use lower-case letters, digits and _ (it is a YAML value and key)")
    if not (isinstance(params, type) and issubclass(params, Section)):
        raise TypeError(f"{kind} {name!r}: params must be a Section subclass, got {params!r}")


@dataclass(frozen=True)
class Split:
    """What a partition returns: one int64 index array per client into the training
    split, and the planted group of each client when the partition plants one.
    `test_indices`, when given, are each client's own test samples (indices into the
    test split: a natural partition tests a client on its ids' held-out samples);
    otherwise the runtime draws them with the client's class proportions."""

    client_indices: tuple[np.ndarray, ...]
    true_groups: tuple[int, ...] | None = None
    test_indices: tuple[np.ndarray, ...] | None = None


@dataclass(frozen=True)
class PartitionSpec(Generic[ParamsT]):
    """A partition's declaration. `split(params, labels, num_clients, rng)` divides the
    training labels over the clients (seeded by `rng` alone); the runtime draws each
    client's test images with the client's class proportions afterwards.

    With `uses_ids` the partition divides by who made each sample (the column the
    scenario names in `partition.partition_by`): it is called as
    `split(params, labels, num_clients, rng, ids=SampleIds(...))`."""

    name: str  # the scenario's partition.kind (and the name of its partition.<name> section)
    summary: str
    split: Callable[..., Split]
    params: type[ParamsT] = NoParams  # type: ignore[assignment]
    uses_ids: bool = False

    def __post_init__(self) -> None:
        _check("partition", self.name, self.params)


@dataclass(frozen=True)
class SampleIds:
    """Who made each sample: int codes per split into `names` (the values of the id
    column, e.g. writer ids), for a partition that divides by them. `groups`, when the
    source knows one, is the planted group of each id (in the order of `names`), e.g.
    the play of each speaking role."""

    train: np.ndarray
    test: np.ndarray
    names: tuple[str, ...]
    groups: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Images:
    """What a data source returns: uint8 images (N, H, W, C) and int labels per split;
    `train_ids` / `test_ids`, when the source knows who made each sample, one value per
    image (any values: writer names, user numbers)."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    class_names: tuple[str, ...] | None = None
    train_ids: np.ndarray | None = None
    test_ids: np.ndarray | None = None


@dataclass(frozen=True)
class SourceSpec(Generic[ParamsT]):
    """A data source's declaration. `load(params, seed)` returns every image of the
    source; the runtime then holds out the pretraining pool and keeps
    dataset.max_train_samples / max_test_samples of it, as for a built-in source."""

    name: str  # the scenario's dataset.name (and the name of its dataset.<name> section)
    summary: str
    load: Callable[[ParamsT, int], Images]
    params: type[ParamsT] = NoParams  # type: ignore[assignment]
    num_classes: int | None = None  # when known without reading any data

    def __post_init__(self) -> None:
        _check("data source", self.name, self.params)


@dataclass(frozen=True)
class TransformSpec:
    """A per-client feature shift, applied to a client's train and test images alike.

    `apply(batch, level, generator)` takes float32 pixel values in 0..255, shaped
    (B, C, H, W), and returns the shifted batch in the same range and shape; a
    transform that draws noise draws it from `generator` (a torch.Generator seeded
    per client and split, so a client sees the same shifted images every round).
    `identity` is the level at which the images are left as they are (no call);
    `check(level)` returns what is wrong with a level, or None."""

    name: str  # the scenario's partition.transform
    summary: str
    apply: Callable[[Any, float, Any], Any]
    identity: float = 0.0
    check: Callable[[float], str | None] | None = None
    level_name: str = "severity"

    def __post_init__(self) -> None:
        _check("transform", self.name, NoParams)


@dataclass(frozen=True)
class EncoderSpec:
    """An encoder architecture: `build(in_channels, feature_dim, width)` returns a
    torch module mapping (B, C, H, W) images to (B, feature_dim) features. `reads_text`:
    the encoder reads character sequences (a text source's samples, (B, 1, L, 1) as
    models/char_lstm.py describes) instead of images."""

    name: str  # the scenario's model.encoder
    summary: str
    build: Callable[[int, int, int], Any]
    reads_text: bool = False

    def __post_init__(self) -> None:
        _check("encoder", self.name, NoParams)
