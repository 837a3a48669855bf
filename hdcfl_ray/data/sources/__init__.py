"""Data sources: `load_dataset` turns a DatasetConfig into one decoded ImageDataset."""

from __future__ import annotations

import dataclasses

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.config.schema import DatasetConfig
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.pretrain_pool import pool_rows
from hdcfl_ray.data.sources.cifar import CIFAR10, CIFAR100, load_cifar
from hdcfl_ray.data.sources.digits import load_digits_dataset
from hdcfl_ray.data.sources.image_folder import load_image_folder
from hdcfl_ray.data.sources.natural_ids import encode_ids, named_rows
from hdcfl_ray.data.sources.parquet_images import load_parquet_images
from hdcfl_ray.data.sources.registry import builtin_sources
from hdcfl_ray.data.sources.synthetic import make_synthetic
from hdcfl_ray.errors import ScenarioError

__all__ = ["dataset_num_classes_hint", "load_dataset", "load_pretrain_pool"]


def load_dataset(config: DatasetConfig, seed: int, id_column: str | None = None) -> ImageDataset:
    """Build the configured dataset for the clients: the training split without the
    pretraining pool (`dataset.pretrain_pool`), then at most max_train/test_samples
    of it (seeded). `id_column`: the column of who made each sample (the scenario's
    `partition.partition_by`), read into the dataset's ids; None reads none."""
    return _load(config, seed, "clients", id_column)


def load_pretrain_pool(config: DatasetConfig, seed: int) -> ImageDataset:
    """The pretraining pool as the training split, and the clients' test split."""
    if config.pretrain_pool is None:
        raise ScenarioError(
            "dataset.pretrain_pool: not set, so no training images are held out for pretraining; set a fraction, "
            "e.g. --set dataset.pretrain_pool=0.2 (and the same value in the scenarios that load the weights, "
            "so their clients never see the pool)"
        )
    return _load(config, seed, "pool")


def _train_rows(size: int, config: DatasetConfig, train_seed: np.random.SeedSequence, part: str) -> np.ndarray | None:
    """The training rows the clients share (the pool held out, then the seeded subset),
    or the pool's; None = every row."""
    if config.pretrain_pool is None:
        return _seeded_subset(size, config.max_train_samples, train_seed)
    kept, pool = pool_rows(size, config.pretrain_pool, config.pretrain_pool_seed)
    if part == "pool":
        return pool
    subset = _seeded_subset(len(kept), config.max_train_samples, train_seed)
    return kept if subset is None else kept[subset]


def _load(config: DatasetConfig, seed: int, part: str, id_column: str | None = None) -> ImageDataset:
    train_seed, test_seed = seeding.data_streams(seed)

    def train_rows(size: int) -> np.ndarray | None:
        return _train_rows(size, config, train_seed, part)

    def test_rows(size: int) -> np.ndarray | None:
        return _seeded_subset(size, config.max_test_samples, test_seed)

    if config.name == "huggingface":  # reads only the selected rows, as parquet_images does
        from hdcfl_ray.data.sources.huggingface import load_huggingface

        return load_huggingface(config, seed, select_train=train_rows, select_test=test_rows, id_column=id_column)
    if config.name == "parquet_images":
        _require_path(config)
        # The rows are picked from the row counts before decoding: the same rows as
        # decoding everything and selecting afterwards, at a fraction of the time.
        return load_parquet_images(
            config.path,
            config.image_column,
            config.label_column,
            config.train_file,
            config.test_file,
            select_train=train_rows,
            select_test=test_rows,
            id_column=id_column,
            missing_ids=config.missing_ids,
        )
    dataset = _load_source(config, seed, id_column)
    train_keep = train_rows(dataset.train_labels.shape[0])
    test_keep = test_rows(dataset.test_labels.shape[0])
    changes: dict[str, np.ndarray] = {}
    if train_keep is not None:
        changes.update(train_images=dataset.train_images[train_keep], train_labels=dataset.train_labels[train_keep])
        if dataset.train_ids is not None:
            changes.update(train_ids=dataset.train_ids[train_keep])
    if test_keep is not None:
        changes.update(test_images=dataset.test_images[test_keep], test_labels=dataset.test_labels[test_keep])
        if dataset.test_ids is not None:
            changes.update(test_ids=dataset.test_ids[test_keep])
    return dataclasses.replace(dataset, **changes) if changes else dataset


def dataset_num_classes_hint(config: DatasetConfig) -> int | None:
    """The number of classes when it is known without reading any data, else None."""
    known = {"digits": 10, "cifar10": 10, "cifar100": 100, "synthetic": config.num_classes}
    if config.name in known:
        return known[config.name]
    from hdcfl_ray.data.sources.registry import source_specs

    spec = source_specs().get(config.name)
    return None if spec is None else spec.num_classes


_PATH_EXPECTED = {
    "parquet_images": "the folder holding train.parquet and test.parquet (or the train file itself)",
    "image_folder": "the folder with one sub-folder of images per class",
}

# the sources that read who made each sample (partition.partition_by); a plugin's says so in its Images
_READS_IDS = ("huggingface", "parquet_images", "text", "leaf_json", "shakespeare_plays")


def _require_path(config: DatasetConfig) -> None:
    if config.path is None:
        raise ScenarioError(
            f"dataset.path is required when dataset.name is {config.name}: set it to {_PATH_EXPECTED[config.name]}"
        )


def _load_source(config: DatasetConfig, seed: int, id_column: str | None = None) -> ImageDataset:
    """Every image of a source that decodes all of them (Parquet is read row-selected in `_load`)."""
    if id_column is not None and config.name in builtin_sources() and config.name not in _READS_IDS:
        raise ScenarioError(
            f"partition.partition_by: dataset.name {config.name} has no column of who made each sample; a natural "
            f"partition needs a source that has one ({', '.join(_READS_IDS)}), or a plugin source that returns ids"
        )
    if config.name == "text":
        from hdcfl_ray.data.sources.text import load_text

        return load_text(config, seed, id_column)
    if config.name == "leaf_json":
        from hdcfl_ray.data.sources.leaf import load_leaf

        return load_leaf(config, seed, id_column)
    if config.name == "shakespeare_plays":
        from hdcfl_ray.data.sources.shakespeare_plays import load_shakespeare_plays

        return load_shakespeare_plays(config, seed, id_column)
    if config.name == "digits":
        return load_digits_dataset(config.test_fraction, seed)
    if config.name == "cifar10":
        return load_cifar(CIFAR10, config.path, config.download)
    if config.name == "cifar100":
        return load_cifar(CIFAR100, config.path, config.download)
    if config.name == "synthetic":
        return make_synthetic(
            config.num_classes, config.image_size, config.channels, config.train_samples, config.test_samples, seed
        )
    if config.name == "image_folder":
        _require_path(config)
        return load_image_folder(config.path, config.test_fraction, seed)
    return _load_plugin(config, seed, id_column)


def _load_plugin(config: DatasetConfig, seed: int, id_column: str | None = None) -> ImageDataset:
    """A plugin source's images (SourceSpec.load with its dataset.<name> section)."""
    from hdcfl_ray.config.schema import plugin_section
    from hdcfl_ray.data.sources.registry import source_specs

    spec = source_specs().get(config.name)
    if spec is None:
        raise ScenarioError(f"dataset.name: unknown source {config.name!r}")
    images = spec.load(plugin_section(config, spec), seed)
    classes = images.class_names or tuple(str(label) for label in range(images.num_classes))
    if len(classes) != images.num_classes:
        raise ScenarioError(f"dataset.name {config.name}: {len(classes)} class names for {images.num_classes} classes")
    splits = {
        "train": (np.ascontiguousarray(images.train_images, dtype=np.uint8), np.asarray(images.train_labels, dtype=np.int64)),
        "test": (np.ascontiguousarray(images.test_images, dtype=np.uint8), np.asarray(images.test_labels, dtype=np.int64)),
    }
    ids: dict[str, object] = {}
    notices: tuple[str, ...] = ()
    if id_column is not None:
        if images.train_ids is None or images.test_ids is None:
            raise ScenarioError(
                f"partition.partition_by: the plugin source {config.name!r} returns no ids of who made each sample "
                "(Images.train_ids / test_ids), so it cannot be divided by them"
            )
        owners = {"train": np.asarray(images.train_ids).tolist(), "test": np.asarray(images.test_ids).tolist()}
        for split, (split_images, split_labels) in splits.items():
            where = f"the plugin source {config.name!r} ({split})"
            named, dropped = named_rows(owners[split], id_column, where, config.missing_ids)
            if named is not None:
                splits[split] = (split_images[named], split_labels[named])
                owners[split] = [owners[split][index] for index in named]
            notices += dropped
        codes, names = encode_ids([*owners["train"], *owners["test"]], id_column, config.name)
        num_train = len(owners["train"])
        ids = {"train_ids": codes[:num_train], "test_ids": codes[num_train:], "id_names": names}
    return ImageDataset(
        name=config.name,
        train_images=splits["train"][0],
        train_labels=splits["train"][1],
        test_images=splits["test"][0],
        test_labels=splits["test"][1],
        classes=tuple(classes),
        notices=notices,
        **ids,  # type: ignore[arg-type]
    )


def _seeded_subset(size: int, keep: int | None, seed: np.random.SeedSequence) -> np.ndarray | None:
    """Indices of `keep` samples picked by a seeded shuffle, in their original order."""
    if keep is None or keep >= size:
        return None
    return np.sort(np.random.default_rng(seed).permutation(size)[:keep])
