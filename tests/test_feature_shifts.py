"""Per-group feature shifts: rotation is one transform among others (Gaussian noise,
contrast, blur at a CIFAR-10-C severity), each run through the same client path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.schema import PartitionConfig
from hdcfl_ray.data.partitions import build_partition
from hdcfl_ray.data.shifts import NOISE_STD, Shift, transform_specs
from hdcfl_ray.data.transforms import shift_uint8, to_float_batch
from hdcfl_ray.errors import ScenarioError
from tests.conftest import tiny_scenario


def images(count: int = 6, side: int = 16, channels: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(count, side, side, channels), dtype=np.uint8)


def raw(batch: torch.Tensor) -> torch.Tensor:
    """Back from [-1, 1] to pixel values."""
    return (batch + 1.0) * 127.5


def test_at_least_three_shifts_beside_rotation_are_built_in() -> None:
    assert {"rotation", "gaussian_noise", "contrast", "gaussian_blur"} <= set(transform_specs())


def test_a_rotation_shift_is_the_rotation_by_angle_bit_for_bit() -> None:
    batch = images()
    for angle in (0.0, 90.0, 180.0, 270.0, 30.0):
        assert torch.equal(to_float_batch(batch, angle), to_float_batch(batch, Shift("rotation", angle), seed=123))
    assert torch.equal(to_float_batch(batch, 90.0), to_float_batch(torch.from_numpy(batch).rot90(1, dims=(1, 2)).numpy()))


@pytest.mark.parametrize("name", ["gaussian_noise", "contrast", "gaussian_blur"])
def test_severity_zero_leaves_images_alone_and_higher_severities_move_them_more(name: str) -> None:
    batch = images()
    plain = to_float_batch(batch)
    assert torch.equal(to_float_batch(batch, Shift(name, 0.0), seed=1), plain)
    distances = [float((to_float_batch(batch, Shift(name, level), seed=1) - plain).abs().mean()) for level in (1, 3, 5)]
    assert 0 < distances[0] < distances[1] < distances[2]


def test_noise_is_fixed_by_the_seed_and_has_cifar_c_spread() -> None:
    batch = np.full((64, 16, 16, 3), 128, dtype=np.uint8)
    first = to_float_batch(batch, Shift("gaussian_noise", 2), seed=5)
    assert torch.equal(first, to_float_batch(batch, Shift("gaussian_noise", 2), seed=5))
    assert not torch.equal(first, to_float_batch(batch, Shift("gaussian_noise", 2), seed=6))
    std = float(raw(first).std() / 255.0)
    assert std == pytest.approx(NOISE_STD[1], rel=0.05)


def test_contrast_scales_each_images_spread_and_keeps_its_mean() -> None:
    batch = np.random.default_rng(1).integers(96, 160, size=(4, 16, 16, 3), dtype=np.uint8)  # no clipping
    plain, low = raw(to_float_batch(batch)), raw(to_float_batch(batch, Shift("contrast", 2)))
    assert torch.allclose(low.mean(dim=(2, 3)), plain.mean(dim=(2, 3)), atol=1e-3)
    assert torch.allclose(low.std(dim=(2, 3)), 0.5 * plain.std(dim=(2, 3)), rtol=1e-4)


def test_blur_keeps_a_flat_image_and_smooths_an_edge() -> None:
    flat = np.full((1, 12, 12, 1), 77, dtype=np.uint8)
    assert torch.allclose(raw(to_float_batch(flat, Shift("gaussian_blur", 5))), torch.full((1, 1, 12, 12), 77.0), atol=1e-3)
    edge = np.zeros((1, 12, 12, 1), dtype=np.uint8)
    edge[:, :, 6:] = 255
    blurred = raw(to_float_batch(edge, Shift("gaussian_blur", 5)))[0, 0]
    assert 0 < float(blurred[3, 5]) < 255 and 0 < float(blurred[3, 6]) < 255
    assert float(blurred[3, 0]) == pytest.approx(0.0, abs=1e-3)


def test_raw_pixels_carry_the_same_shift_as_the_float_batch() -> None:
    batch = images()
    shift = Shift("gaussian_noise", 4)
    as_uint8 = shift_uint8(batch, shift, seed=9)
    assert np.abs(as_uint8.astype(np.float64) - raw(to_float_batch(batch, shift, seed=9)).permute(0, 2, 3, 1).numpy()).max() <= 0.5 + 1e-3
    assert np.array_equal(shift_uint8(batch, Shift("rotation", 0.0)), batch)


def test_feature_shift_partition_puts_client_i_in_group_i_mod_g_at_that_level() -> None:
    labels = np.arange(400) % 10
    config = PartitionConfig(kind="feature_shift", num_clients=6, transform="contrast", levels=(0.0, 2.0, 5.0))
    partition = build_partition(config, labels, labels[:100], 10, 0)
    assert [client.shift for client in partition.clients] == [Shift("contrast", level) for level in (0.0, 2.0, 5.0)] * 2
    assert partition.true_groups().tolist() == [0, 1, 2] * 2
    assert all(client.rotation_degrees == 0.0 for client in partition.clients)
    rotation = build_partition(PartitionConfig(kind="rotation", num_clients=6, angles=(0.0, 180.0)), labels, labels[:100], 10, 0)
    same = build_partition(
        PartitionConfig(kind="feature_shift", num_clients=6, transform="rotation", levels=(0.0, 180.0)), labels, labels[:100], 10, 0
    )
    for one, two in zip(rotation.clients, same.clients):
        assert one.shift == two.shift and np.array_equal(one.train_indices, two.train_indices)


@pytest.mark.parametrize(
    ("partition", "message"),
    [
        ({"kind": "feature_shift", "transform": "gaussian_noise", "levels": [0, 7]}, "not a severity 0..5"),
        ({"kind": "feature_shift", "transform": "gaussian_noise", "levels": [1.5]}, "not a severity 0..5"),
        ({"kind": "feature_shift", "transform": "fog", "levels": [1]}, "'fog' is not a transform"),
        ({"kind": "feature_shift", "levels": []}, "at least one level"),
        ({"kind": "nosuch"}, "'nosuch' is not a partition"),
    ],
)
def test_bad_shift_settings_stop_at_load_naming_the_key(partition: dict, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        build_scenario(tiny_scenario(partition={**tiny_scenario()["partition"], **partition}))


@pytest.mark.parametrize("transform", ["gaussian_noise", "gaussian_blur"])
def test_a_shifted_federation_runs_through_the_client_path(tmp_path, transform: str) -> None:
    from hdcfl_ray.api import simulate

    run = simulate(
        tiny_scenario(
            partition={"kind": "feature_shift", "num_clients": 4, "transform": transform, "levels": [0, 5], "test_per_client": 20},
            algorithm={"name": "fedavg_se"},
            protocol={"rounds": 1},
            runtime={"backend": "local", "num_cpus": 1},
        ),
        out=tmp_path / "run",
        progress=False,
    )
    assert run.status == "completed"
    assert run.manifest["scenario_resolved"]["partition"]["transform"] == transform if "scenario_resolved" in run.manifest else True
