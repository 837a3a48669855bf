"""The in-memory form every data source produces: decoded uint8 images, once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ImageDataset:
    """Train and test splits as uint8 arrays of shape (N, H, W, C) and int64 labels.

    Sources decode on the driver; the runtime places these arrays in the Ray object
    store once, and client actors read them without copies.
    """

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    classes: tuple[str, ...]
    # Natural data: who made each sample (a writer, a speaking role, a user), as int codes
    # into `id_names`; a natural partition gives each client the samples of its ids
    train_ids: np.ndarray | None = None
    test_ids: np.ndarray | None = None
    id_names: tuple[str, ...] = ()
    # the planted group of each id when the source knows one (shakespeare_plays: the play
    # of each role), as codes into `group_names`, in the order of `id_names`; () = none
    id_groups: tuple[int, ...] = ()
    group_names: tuple[str, ...] = ()
    # Text: each "image" is a sequence of L character ids, (L, 1, 1), and the classes are the
    # characters (next-character prediction); data/sources/text.py
    text: bool = False
    # the files the samples were read from, with their sha256 (the manifest records them)
    source_files: tuple[tuple[str, str], ...] = ()
    # what reading left out that the run should say (rows without an id, with
    # dataset.missing_ids: drop): preflight prints them as warnings
    notices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for split, images, labels, ids in (
            ("train", self.train_images, self.train_labels, self.train_ids),
            ("test", self.test_images, self.test_labels, self.test_ids),
        ):
            if images.dtype != np.uint8 or images.ndim != 4:
                raise ValueError(f"{self.name} {split} images must be uint8 (N, H, W, C), got {images.dtype} {images.shape}")
            if labels.shape != (images.shape[0],):
                raise ValueError(f"{self.name} {split}: {images.shape[0]} images but labels of shape {labels.shape}")
            if ids is not None and ids.shape != (images.shape[0],):
                raise ValueError(f"{self.name} {split}: {images.shape[0]} samples but ids of shape {ids.shape}")
        if self.id_groups and (len(self.id_groups) != len(self.id_names) or not set(self.id_groups) <= set(range(len(self.group_names)))):
            raise ValueError(f"{self.name}: {len(self.id_groups)} id groups for {len(self.id_names)} ids and {len(self.group_names)} group names")

    @property
    def has_ids(self) -> bool:
        return self.train_ids is not None

    @property
    def sample_noun(self) -> str:
        """What one sample is, for messages: images, or character sequences."""
        return "sequences" if self.text else "images"

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def channels(self) -> int:
        return int(self.train_images.shape[3])

    @property
    def image_size(self) -> int:
        return int(self.train_images.shape[1])
