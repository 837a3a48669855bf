"""Stripes: a procedural image source. Class c is a sine grating at angle
c * 180 / num_classes degrees with a random phase and frequency, plus noise.
It needs no download and is generated from the run's seed."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hdcfl_ray.contract import Section
from hdcfl_ray.contract.data import Images, SourceSpec


class StripesParams(Section):
    """The scenario's dataset.stripes section."""

    num_classes: int = Field(6, ge=2, le=36, description="orientations, one class each")
    image_size: int = Field(16, ge=8, description="image side in pixels")
    train_per_class: int = Field(100, ge=1, description="training images per class")
    test_per_class: int = Field(30, ge=1, description="test images per class")
    noise: float = Field(0.2, ge=0.0, description="std of the pixel noise (the grating spans 0..1)")


def _draw(params: StripesParams, per_class: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    labels = np.repeat(np.arange(params.num_classes), per_class)
    side = params.image_size
    ys, xs = np.mgrid[0:side, 0:side].astype(np.float64) / side
    angles = labels * np.pi / params.num_classes
    frequency = rng.uniform(2.0, 4.0, size=labels.shape[0]) * 2 * np.pi
    phase = rng.uniform(0, 2 * np.pi, size=labels.shape[0])
    along = np.cos(angles)[:, None, None] * xs + np.sin(angles)[:, None, None] * ys
    values = 0.5 + 0.5 * np.sin(frequency[:, None, None] * along + phase[:, None, None])
    values += rng.normal(0.0, params.noise, size=values.shape)
    images = np.clip(values * 255.0, 0, 255).round().astype(np.uint8)[..., None]
    return images, labels


def stripes(params: StripesParams, seed: int) -> Images:
    train_rng, test_rng = (np.random.default_rng(child) for child in np.random.SeedSequence([seed, 0x57]).spawn(2))
    train_images, train_labels = _draw(params, params.train_per_class, train_rng)
    test_images, test_labels = _draw(params, params.test_per_class, test_rng)
    names = tuple(f"{round(c * 180 / params.num_classes)}deg" for c in range(params.num_classes))
    return Images(train_images, train_labels, test_images, test_labels, params.num_classes, class_names=names)


SOURCE = SourceSpec(
    name="stripes",
    summary="procedural sine gratings, one orientation per class (no download); an example plugin",
    load=stripes,
    params=StripesParams,
)
