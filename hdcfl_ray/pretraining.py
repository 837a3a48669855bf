"""`hdcfl-ray pretrain`: train an encoder and a head centrally on the pretraining
pool (`dataset.pretrain_pool`, images no client holds) and save them as a
weights file that `model.pretrained` loads with `weights_only=True`.

This is the CPU-scale stand-in for the paper's ImageNet initialisation: a
representation learned on data outside the federation. The file holds the
encoder's and the head's state dicts and a `pretrain` record (the scenario,
the pool, the training settings and the test accuracy); a run that loads it
copies that record into its manifest, and refuses to start if its own
`dataset.pretrain_pool` would put the pool's images back into its clients' data.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np

from hdcfl_ray import seeding
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.models.pretrained import SEEDED_SOURCES, check_pool_held_out, initialisation_facts, pretrain_record  # noqa: F401  (re-exported)

Transform = Literal["none", "scenario"]


@dataclass(frozen=True)
class EpochReport:
    epoch: int
    train_loss: float
    test_accuracy: float


@dataclass(frozen=True)
class PretrainSummary:
    path: Path
    pool_images: int
    epochs: tuple[EpochReport, ...]
    seconds: float


def _rotations(scenario: Scenario, count: int, transform: Transform) -> np.ndarray:
    """One rotation per image: none, or the partition's angles spread evenly over the images (seeded)."""
    partition = scenario.partition
    angles = partition.angles if partition.kind == "rotation" else None
    if partition.kind == "feature_shift" and partition.transform == "rotation":
        angles = partition.levels
    if transform == "none" or not angles:
        return np.zeros(count)
    order = seeding.rng(scenario.seed, "pretrain", 0).permutation(count)
    rotations = np.empty(count)
    rotations[order] = np.resize(np.asarray(angles, dtype=np.float64), count)
    return rotations


def _float_inputs(images: np.ndarray, rotations: np.ndarray) -> Any:
    """Transformed float tensors in the images' order, each image at its own rotation."""
    import torch

    from hdcfl_ray.data.transforms import to_float_batch

    parts: dict[float, Any] = {}
    for angle in np.unique(rotations):
        members = np.flatnonzero(rotations == angle)
        parts[float(angle)] = (members, to_float_batch(images[members], float(angle)))
    first = next(iter(parts.values()))[1]
    inputs = torch.empty((len(images), *first.shape[1:]), dtype=first.dtype)
    for members, batch in parts.values():
        inputs[torch.as_tensor(members)] = batch
    return inputs


def pretrain(
    scenario: Scenario,
    out: Path,
    *,
    epochs: int,
    batch_size: int | None = None,
    lr: float | None = None,
    transform: Transform = "none",
    progress: Callable[[EpochReport], None] | None = None,
) -> PretrainSummary:
    """Train on the pool for `epochs` passes with the scenario's model and optimizer
    (`lr` and `batch_size` override the protocol's), scoring on the test split after
    each, and write the weights file `out` (replaced whole, never half-written)."""
    import torch

    from hdcfl_ray.data.sources import load_pretrain_pool
    from hdcfl_ray.models import build_split_model
    from hdcfl_ray.portable.machine import arithmetic_facts
    from hdcfl_ray.runtime.backends.choice import local_cpus
    from hdcfl_ray.runtime.client.device import choose_device, configure_cuda
    from hdcfl_ray.training.local_training import evaluate, train_locally
    from hdcfl_ray.training.precision import autocast, resolve_precision

    if epochs < 1:
        raise ScenarioError(f"--epochs: {epochs}; train at least one epoch")
    if Path(out).is_dir():
        raise ScenarioError(f"--out {out}: this is a folder; give the weights file's name, e.g. {Path(out) / 'pool.pt'}")
    runtime = scenario.runtime
    if runtime.portable:  # the same weights on every machine: pinned libraries, one thread, float32
        from hdcfl_ray.portable import require_pinned_process

        require_pinned_process("pretraining")
    started = time.perf_counter()
    pool = load_pretrain_pool(scenario.dataset, scenario.seed)
    torch.set_num_threads(1 if runtime.portable else local_cpus(runtime))
    device = choose_device(runtime)
    configure_cuda(runtime, device)
    precision = resolve_precision("fp32" if runtime.portable else runtime.precision, device)
    # from the seeded initialisation, whatever model.pretrained names (perhaps this very file)
    model = build_split_model(
        scenario.model.model_copy(update={"pretrained": None}), in_channels=pool.channels, num_classes=pool.num_classes, seed=scenario.seed
    ).to(device)
    inputs = _float_inputs(pool.train_images, _rotations(scenario, len(pool.train_labels), transform)).to(device)
    labels = torch.as_tensor(pool.train_labels, dtype=torch.long, device=device)
    test_inputs = _float_inputs(pool.test_images, _rotations(scenario, len(pool.test_labels), transform)).to(device)
    test_labels = torch.as_tensor(pool.test_labels, dtype=torch.long, device=device)
    optimizer = scenario.protocol.optimizer if lr is None else scenario.protocol.optimizer.model_copy(update={"lr": lr})
    batch = batch_size or scenario.protocol.batch_size
    reports: list[EpochReport] = []
    for epoch in range(1, epochs + 1):
        generator = torch.Generator().manual_seed(seeding.int_seed(scenario.seed, "pretrain", epoch))
        with autocast(precision, device):
            stats = train_locally(model, inputs, labels, epochs=1, batch_size=batch, optimizer_config=optimizer, generator=generator)
            scored = evaluate(model, test_inputs, test_labels)
        if stats.nonfinite:
            raise ScenarioError(f"pretraining diverged in epoch {epoch} (a NaN/Inf loss); lower the learning rate (--lr)")
        reports.append(EpochReport(epoch=epoch, train_loss=stats.mean_loss, test_accuracy=scored.accuracy))
        if progress is not None:
            progress(reports[-1])
    record = {
        "scenario": scenario.name,
        "dataset": scenario.dataset.name,
        "pretrain_pool": float(scenario.dataset.pretrain_pool or 0.0),
        "pretrain_pool_seed": int(scenario.dataset.pretrain_pool_seed),
        "pool_images": int(len(pool.train_labels)),
        "encoder": scenario.model.encoder,
        "width": int(scenario.model.width),
        "feature_dim": int(scenario.model.feature_dim),
        "seed": int(scenario.seed),
        "epochs": int(epochs),
        "batch_size": int(batch),
        "lr": float(optimizer.lr),
        "optimizer": optimizer.name,
        "transform": transform,
        "precision": precision,
        "test_accuracy": float(reports[-1].test_accuracy),
        "test_images": int(len(pool.test_labels)),
        # the mode, the CPU and the instruction sets the weights were computed with, as a run's manifest records them
        "arithmetic": arithmetic_facts(runtime.portable),
        "torch_threads": int(torch.get_num_threads()),
        "device": str(device),
    }
    content = {
        "encoder": {key: value.detach().cpu() for key, value in model.encoder.state_dict().items()},
        "head": {key: value.detach().cpu() for key, value in model.head.state_dict().items()},
        "pretrain": record,
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.tmp")
    torch.save(content, temporary)
    os.replace(temporary, out)
    return PretrainSummary(path=out, pool_images=record["pool_images"], epochs=tuple(reports), seconds=time.perf_counter() - started)
