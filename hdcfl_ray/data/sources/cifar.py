"""CIFAR-10 and CIFAR-100 from the python-version archives torchvision also uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.sources.restricted_pickle import load_array_pickle
from hdcfl_ray.errors import ScenarioError

DEFAULT_ROOT = Path("./data")


@dataclass(frozen=True)
class CifarLayout:
    """Where one CIFAR variant keeps its files and which keys hold labels and names."""

    name: str
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    label_key: str
    names_key: str
    torchvision_class: str  # its url, filename and tgz_md5 locate and check the archive

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train_files, self.test_file, self.meta_file)


CIFAR10 = CifarLayout(
    name="cifar10",
    folder="cifar-10-batches-py",
    train_files=tuple(f"data_batch_{number}" for number in range(1, 6)),
    test_file="test_batch",
    meta_file="batches.meta",
    label_key="labels",
    names_key="label_names",
    torchvision_class="CIFAR10",
)

CIFAR100 = CifarLayout(
    name="cifar100",
    folder="cifar-100-python",
    train_files=("train",),
    test_file="test",
    meta_file="meta",
    label_key="fine_labels",
    names_key="fine_label_names",
    torchvision_class="CIFAR100",
)


def load_cifar(layout: CifarLayout, root: str | Path | None = None, download: bool = False) -> ImageDataset:
    """Read `<root>/<layout.folder>`; fetch the archive first when files are missing and `download`."""
    root = DEFAULT_ROOT if root is None else Path(root)
    folder = root / layout.folder
    if _missing_files(layout, folder) and download:
        _download(layout, root)
    missing = _missing_files(layout, folder)
    if missing:
        raise ScenarioError(
            f"dataset: the {layout.name} files are not in {folder} (looked for {', '.join(layout.files)}; "
            f"missing {', '.join(missing)}). Either put the extracted {layout.folder} folder into {root} "
            f"(dataset.path names the folder that contains it), or set dataset.download: true on a "
            f"machine that is online."
        )
    train_images, train_labels = zip(*(_read_batch(folder / name, layout) for name in layout.train_files))
    test_images, test_labels = _read_batch(folder / layout.test_file, layout)
    meta = load_array_pickle(folder / layout.meta_file)
    if layout.names_key not in meta:
        raise ScenarioError(f"{folder / layout.meta_file}: no {layout.names_key!r} entry; re-extract the archive")
    classes = tuple(_as_text(name) for name in meta[layout.names_key])
    for name, labels in zip((*layout.train_files, layout.test_file), (*train_labels, test_labels)):
        if labels.size and (labels.min() < 0 or labels.max() >= len(classes)):
            raise ScenarioError(
                f"{folder / name}: labels must be class indices 0..{len(classes) - 1} ({len(classes)} classes in "
                f"{layout.meta_file}); found {int(labels.min())}..{int(labels.max())}. Re-extract the archive"
            )
    return ImageDataset(
        name=layout.name,
        train_images=np.concatenate(train_images),
        train_labels=np.concatenate(train_labels),
        test_images=test_images,
        test_labels=test_labels,
        classes=classes,
    )


def _missing_files(layout: CifarLayout, folder: Path) -> list[str]:
    return [name for name in layout.files if not (folder / name).is_file()]


def _read_batch(path: Path, layout: CifarLayout) -> tuple[np.ndarray, np.ndarray]:
    batch = load_array_pickle(path)
    data = batch.get("data")
    labels = batch.get(layout.label_key)
    if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels is None:
        raise ScenarioError(
            f"{path}: not a {layout.name} batch (expected 'data' of shape (N, 3072) and "
            f"'{layout.label_key}'); re-extract the archive"
        )
    labels_array = np.asarray(labels, dtype=np.int64)
    if labels_array.shape != (data.shape[0],):
        raise ScenarioError(f"{path}: {data.shape[0]} images but {labels_array.shape[0]} labels; re-extract it")
    # Rows are stored channel-planar (R plane, G plane, B plane); images are kept channel-last.
    images = data.astype(np.uint8, copy=False).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels_array


def _as_text(name: Any) -> str:
    return name.decode("utf-8") if isinstance(name, bytes) else str(name)


def _download(layout: CifarLayout, root: Path) -> None:
    # torchvision only fetches and checks the archive; reading stays with the restricted
    # unpickler, because torchvision's dataset classes call pickle.load on the files.
    import torchvision.datasets
    from torchvision.datasets.utils import download_and_extract_archive

    archive = getattr(torchvision.datasets, layout.torchvision_class)
    try:
        download_and_extract_archive(
            archive.url, download_root=str(root), filename=archive.filename, md5=archive.tgz_md5
        )
    except (OSError, RuntimeError) as error:
        raise ScenarioError(
            f"dataset.download: fetching {archive.url} into {root} failed ({error}); check the "
            f"network, or download the archive elsewhere and extract its {layout.folder} folder into {root}"
        ) from error
