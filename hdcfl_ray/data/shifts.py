"""Per-group feature shifts: a client's images pass through one transform at one
level (a rotation angle, a corruption severity), its train and test images alike.

`partition.kind: feature_shift` puts client i in group i mod G and gives it
`partition.transform` at `partition.levels[i mod G]`; `partition.kind: rotation`
with `angles` is the same with the rotation transform. The built-in corruptions
follow CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019, make_cifar_c.py): severity
1..5 picks that benchmark's constant for 32x32 images, 0 leaves the images alone.

Nothing here imports torch at module level: the schema reads the names."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

from hdcfl_ray.contract.data import TransformSpec

# CIFAR-10-C's constants per severity 1..5 (make_cifar_c.py)
NOISE_STD = (0.04, 0.06, 0.08, 0.09, 0.10)  # of the [0, 1] pixel range
CONTRAST_FACTOR = (0.75, 0.5, 0.4, 0.3, 0.15)
BLUR_SIGMA = (0.4, 0.6, 0.7, 0.8, 1.0)  # pixels


@dataclass(frozen=True)
class Shift:
    """One client's feature shift."""

    transform: str = "rotation"
    level: float = 0.0

    def is_identity(self) -> bool:
        return self.level == transform_spec(self.transform).identity


NO_SHIFT = Shift()


def _severity_problem(level: float) -> str | None:
    if level != int(level) or not 0 <= level <= 5:
        return f"{level} is not a severity 0..5 (0 = unchanged, 1..5 = CIFAR-10-C's levels)"
    return None


def _rotate(batch: Any, degrees: float, generator: Any = None) -> Any:
    quarter_turns = round(degrees / 90.0)
    if abs(degrees - 90.0 * quarter_turns) < 1e-9:
        if quarter_turns % 4 == 0:
            return batch
        import torch

        return torch.rot90(batch, quarter_turns % 4, dims=(2, 3))
    # torchvision is imported only here: it adds a second to every actor's start.
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as tvf

    # Rotating raw pixel values makes the fill value 0 mean black, as it would for a photo.
    return tvf.rotate(batch, float(degrees), interpolation=InterpolationMode.BILINEAR, fill=0.0)


def _gaussian_noise(batch: Any, severity: float, generator: Any) -> Any:
    import torch

    std = NOISE_STD[int(severity) - 1] * 255.0
    noise = torch.randn(batch.shape, generator=generator, dtype=torch.float32).to(batch.device)
    return (batch + noise * std).clamp_(0.0, 255.0)


def _contrast(batch: Any, severity: float, generator: Any = None) -> Any:
    factor = CONTRAST_FACTOR[int(severity) - 1]
    means = batch.mean(dim=(2, 3), keepdim=True)  # per image and channel, as CIFAR-10-C
    return ((batch - means) * factor + means).clamp_(0.0, 255.0)


def _gaussian_blur(batch: Any, severity: float, generator: Any = None) -> Any:
    import torch
    import torch.nn.functional as F

    sigma = BLUR_SIGMA[int(severity) - 1]
    radius = int(math.ceil(4.0 * sigma))  # scikit-image's truncate=4
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float32, device=batch.device)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = kernel / kernel.sum()
    channels = batch.shape[1]
    # separable, with edge pixels repeated (scikit-image's mode "nearest")
    padded = F.pad(batch, (radius, radius, radius, radius), mode="replicate")
    rows = F.conv2d(padded, kernel.view(1, 1, 1, -1).repeat(channels, 1, 1, 1), groups=channels)
    return F.conv2d(rows, kernel.view(1, 1, -1, 1).repeat(channels, 1, 1, 1), groups=channels)


BUILTIN_TRANSFORMS: tuple[TransformSpec, ...] = (
    TransformSpec(
        "rotation",
        "rotate counter-clockwise by the level in degrees (multiples of 90 exact, others bilinear, black corners)",
        _rotate,
        level_name="degrees",
    ),
    TransformSpec(
        "gaussian_noise",
        "add Gaussian pixel noise, std 0.04/0.06/0.08/0.09/0.10 of the range at severity 1..5 (CIFAR-10-C), "
        "fixed per client and image",
        _gaussian_noise,
        check=_severity_problem,
    ),
    TransformSpec(
        "contrast",
        "pull each image's channels towards their mean by 0.75/0.5/0.4/0.3/0.15 at severity 1..5 (CIFAR-10-C)",
        _contrast,
        check=_severity_problem,
    ),
    TransformSpec(
        "gaussian_blur",
        "Gaussian blur, sigma 0.4/0.6/0.7/0.8/1.0 pixels at severity 1..5 (CIFAR-10-C)",
        _gaussian_blur,
        check=_severity_problem,
    ),
)


@cache
def _builtin() -> dict[str, TransformSpec]:
    return {spec.name: spec for spec in BUILTIN_TRANSFORMS}


def transform_specs() -> dict[str, TransformSpec]:
    """The built-in transforms and those of installed or named plugins, by name."""
    from hdcfl_ray.plugins import merged

    return merged("transforms", _builtin())


def transform_spec(name: str) -> TransformSpec:
    builtin = _builtin().get(name)
    if builtin is not None:
        return builtin
    specs = transform_specs()
    if name not in specs:
        raise ValueError(f"partition.transform: {name!r} is not a transform; choose from {', '.join(specs)}")
    return specs[name]


def shift_draws_noise(shift: Shift) -> bool:
    """Whether `apply_shift` draws random numbers for this shift (and so needs its seed):
    every transform but rotation, unless the level leaves the images unchanged."""
    return shift.level != transform_spec(shift.transform).identity and shift.transform != "rotation"


def apply_shift(batch: Any, shift: Shift, seed: int) -> Any:
    """`batch` (float32 pixel values 0..255, (B, C, H, W)) with the client's shift.

    A transform that draws noise draws it from a generator seeded with `seed`
    (the run, the client and the split), so the same images come out every time."""
    spec = transform_spec(shift.transform)
    if shift.level == spec.identity:
        return batch
    generator = None
    if shift_draws_noise(shift):
        import torch

        generator = torch.Generator().manual_seed(int(seed))
    return spec.apply(batch, float(shift.level), generator)
