"""Loading encoder weights from a local file named by `model.pretrained`.

Files are read with `torch.load(weights_only=True)`, so a file can hold tensors
and plain containers but never code. Nothing is downloaded: a missing file is a
scenario error with the fix in the message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hdcfl_ray.config.schema import ModelConfig, Scenario
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.models.encoders import build_encoder
from hdcfl_ray.models.seeded_rng import global_cpu_rng

# Checkpoints often wrap the state dict under one of these keys.
WRAPPER_KEYS = ("state_dict", "encoder")
# Prefixes left by saving a whole model (`encoder.`) or a DataParallel wrapper (`module.`).
STRIPPED_PREFIXES = ("module.", "encoder.")
KEY_PREVIEW = 5


@dataclass(frozen=True)
class PretrainedLoad:
    """What a load matched: encoder keys the file did not provide, and file keys the encoder has no use for."""

    path: str
    loaded_keys: tuple[str, ...]
    missing_keys: tuple[str, ...]
    unexpected_keys: tuple[str, ...]


def load_pretrained_encoder(encoder: nn.Module, path: str) -> PretrainedLoad:
    """Copy the matching tensors of the file at `path` into `encoder`; raise ScenarioError if none match."""
    file_state = _encoder_state_from_file(path)
    encoder_state = encoder.state_dict()
    encoder_keys = set(encoder_state)
    loaded = sorted(key for key in file_state if key in encoder_keys)
    if not loaded:
        raise ScenarioError(
            f"model.pretrained: '{path}' has no tensor whose name matches the encoder "
            f"(file keys such as {_preview(file_state)}; encoder keys such as {_preview(encoder_keys)}). "
            "Save the weights with torch.save(encoder.state_dict()) from the same model.encoder and width"
        )
    mismatched = [
        f"{key} {tuple(file_state[key].shape)} vs {tuple(encoder_state[key].shape)}"
        for key in loaded
        if file_state[key].shape != encoder_state[key].shape
    ]
    if mismatched:
        raise ScenarioError(
            f"model.pretrained: '{path}' has tensors of the wrong shape for the encoder (file vs encoder: "
            f"{'; '.join(mismatched[:KEY_PREVIEW])}). "
            "Check that model.encoder, model.width and model.feature_dim match the saved encoder"
        )
    try:
        result = encoder.load_state_dict(file_state, strict=False)
    except RuntimeError as error:
        raise ScenarioError(
            f"model.pretrained: '{path}' does not fit the encoder ({_first_line(error)}). "
            "Check that model.encoder, model.width and model.feature_dim match the saved encoder"
        ) from error
    return PretrainedLoad(
        path=path,
        loaded_keys=tuple(loaded),
        missing_keys=tuple(result.missing_keys),
        unexpected_keys=tuple(result.unexpected_keys),
    )


def check_pretrained(config: ModelConfig, in_channels: int) -> PretrainedLoad | None:
    """Load `model.pretrained` into a fresh encoder once, before a run starts, so a
    missing, unreadable or mismatched file stops the run before anything is created.
    The torch RNG is left as it was (the run's models are built from the seed later)."""
    if config.pretrained is None:
        return None
    with global_cpu_rng():
        encoder = build_encoder(config, in_channels)
    return load_pretrained_encoder(encoder, config.pretrained)


def _encoder_state_from_file(path: str) -> dict[str, torch.Tensor]:
    if not Path(path).is_file():
        raise ScenarioError(
            f"model.pretrained: '{path}' does not exist (give a local weights file saved with "
            "torch.save(encoder.state_dict()); nothing is downloaded)"
        )
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    # A damaged file fails inside the unpickler with whatever that meets first
    # (IndexError, KeyError, UnpicklingError, ...): every one of them means this file.
    except Exception as error:
        raise ScenarioError(
            f"model.pretrained: '{path}' could not be read as a weights-only torch file ({_first_line(error)}). "
            "It must hold tensors only, saved with torch.save(encoder.state_dict())"
        ) from error
    state = _unwrap(content, path)
    tensors = {_strip_prefixes(str(key)): value for key, value in state.items() if isinstance(value, torch.Tensor)}
    if not tensors:
        raise ScenarioError(
            f"model.pretrained: '{path}' holds no tensors; save the weights with torch.save(encoder.state_dict())"
        )
    not_finite = sorted(
        key for key, value in tensors.items() if value.is_floating_point() and not bool(torch.isfinite(value).all())
    )
    if not_finite:
        raise ScenarioError(
            f"model.pretrained: '{path}' has NaN or infinite values in {_preview(not_finite)}; "
            "save weights from a model that trained without diverging"
        )
    return tensors


def _unwrap(content: object, path: str) -> Mapping[object, object]:
    if not isinstance(content, Mapping):
        raise ScenarioError(
            f"model.pretrained: '{path}' holds a {type(content).__name__}, not a state dict; "
            "save the weights with torch.save(encoder.state_dict())"
        )
    for wrapper_key in WRAPPER_KEYS:
        inner = content.get(wrapper_key)
        if isinstance(inner, Mapping):
            return inner
    return content


def _strip_prefixes(key: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for prefix in STRIPPED_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                stripped = True
    return key


def _preview(keys: Iterable[object]) -> str:
    names = sorted(str(key) for key in keys)
    shown = ", ".join(names[:KEY_PREVIEW])
    return f"{shown}, ..." if len(names) > KEY_PREVIEW else shown


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# sources whose training split depends on the run seed (generated images, or a test split drawn from the seed)
SEEDED_SOURCES = ("digits", "synthetic", "image_folder")


def pretrain_record(path: str) -> dict[str, Any] | None:
    """The `pretrain` record of a weights file written by `pretrain` (None for other files)."""
    import torch

    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # unreadable files are check_pretrained's to report
        return None
    record = content.get("pretrain") if isinstance(content, dict) else None
    return dict(record) if isinstance(record, dict) else None


def initialisation_facts(scenario: Scenario) -> dict[str, Any]:
    """Where the run's initial encoder came from, for the manifest."""
    path = scenario.model.pretrained
    if path is None:
        return {"encoder": "seeded", "seed": scenario.seed}
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return {"encoder": "pretrained", "file": str(Path(path).resolve()), "sha256": digest, "pretrain": pretrain_record(path)}


def check_pool_held_out(scenario: Scenario) -> None:
    """A run from pretrained weights must hold out the pool they were trained on, or its
    clients would train (and be scored) on images the encoder has already seen."""
    path = scenario.model.pretrained
    record = pretrain_record(path) if path is not None else None
    if record is None or record.get("dataset") != scenario.dataset.name:
        return
    wanted = {"pretrain_pool": float(record["pretrain_pool"]), "pretrain_pool_seed": int(record["pretrain_pool_seed"])}
    have = {"pretrain_pool": float(scenario.dataset.pretrain_pool or 0.0), "pretrain_pool_seed": int(scenario.dataset.pretrain_pool_seed)}
    if have != wanted:
        pool = "null" if scenario.dataset.pretrain_pool is None else f"{scenario.dataset.pretrain_pool:g}"
        raise ScenarioError(
            f"model.pretrained: '{path}' was pretrained on a pool of {record['pool_images']} {record['dataset']} training images "
            f"(dataset.pretrain_pool: {wanted['pretrain_pool']:g}, dataset.pretrain_pool_seed: {wanted['pretrain_pool_seed']}); "
            f"this scenario has dataset.pretrain_pool: {pool}, dataset.pretrain_pool_seed: "
            f"{scenario.dataset.pretrain_pool_seed}, so its clients would hold images the encoder was trained on. "
            "Set the same two values as the pretraining scenario"
        )
    if scenario.dataset.name in SEEDED_SOURCES and int(record["seed"]) != scenario.seed:
        raise ScenarioError(
            f"model.pretrained: '{path}' was pretrained at seed {record['seed']}, and {scenario.dataset.name} draws its "
            f"images or its test split from the run seed, so the pool of seed {record['seed']} is not held out at seed "
            f"{scenario.seed}. Pretrain once per seed (hdcfl-ray pretrain ... --set seed={scenario.seed}), or use a source "
            "with its own test split (cifar10, cifar100, parquet_images)"
        )
