"""Images stored one folder per class: `root/<class>/*.png|jpg|jpeg`, optionally under `train/` and `test/`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources.data_path import absent
from hdcfl_ray.data.sources.decode import decode_images
from hdcfl_ray.data.sources.holdout import stratified_holdout
from hdcfl_ray.errors import ScenarioError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def load_image_folder(root: str | Path, test_fraction: float, seed: int) -> ImageDataset:
    """Classes are the sorted class folder names.

    With `root/train/<class>` and `root/test/<class>` those are the splits; otherwise
    `root/<class>` holds everything and a seeded, stratified `test_fraction` is held out.
    """
    root = Path(root)
    if not root.is_dir():
        raise ScenarioError(
            f"dataset.path: {absent(root)}; expected one sub-folder of images per class "
            f"(root/<class>/*.png), or root/train/<class> and root/test/<class>"
        )
    train_root, test_root = root / "train", root / "test"
    if train_root.is_dir() and test_root.is_dir():
        classes = _class_folders(train_root)
        train_files, train_labels = _list_images(train_root, classes, require_every_class=True)
        test_files, test_labels = _list_images(test_root, classes, require_every_class=False)
        all_files = train_files + test_files
        images = decode_images(all_files, lambda index: str(all_files[index]))
        split = len(train_files)
        train_images, test_images = images[:split], images[split:]
        if len(test_files) == 0:
            raise ScenarioError(f"dataset.path: {test_root} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    else:
        classes = _class_folders(root)
        files, labels = _list_images(root, classes, require_every_class=True)
        images = decode_images(files, lambda index: str(files[index]))
        train, test = stratified_holdout(labels, test_fraction, seed)
        train_images, train_labels, test_images, test_labels = images[train], labels[train], images[test], labels[test]
    return ImageDataset(
        name=root.name or "image_folder",
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        classes=classes,
    )


def _class_folders(root: Path) -> tuple[str, ...]:
    classes = tuple(sorted(entry.name for entry in root.iterdir() if _is_class_folder(entry)))
    if not classes:
        raise ScenarioError(f"dataset.path: {root} has no class sub-folders; put each class's images in root/<class>/")
    return classes


def _list_images(root: Path, classes: tuple[str, ...], require_every_class: bool) -> tuple[list[Path], np.ndarray]:
    unknown = sorted(
        entry.name for entry in root.iterdir() if _is_class_folder(entry) and entry.name not in classes
    )
    if unknown:
        raise ScenarioError(
            f"dataset.path: {root} has class folders {', '.join(unknown)} that the training split "
            f"lacks (training classes: {', '.join(classes)}); rename or remove them"
        )
    files: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        folder = root / name
        found = sorted(path for path in folder.glob("*") if path.suffix.lower() in IMAGE_SUFFIXES)
        if require_every_class and not found:
            raise ScenarioError(f"dataset.path: class folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        files.extend(found)
        labels.extend([label] * len(found))
    return files, np.asarray(labels, dtype=np.int64)


def _is_class_folder(entry: Path) -> bool:
    # Hidden folders (.ipynb_checkpoints, .git) are tool leftovers, never classes.
    return entry.is_dir() and not entry.name.startswith(".")
