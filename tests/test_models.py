"""Models and flat parameter vectors: shapes, sizes, seeding, round trips, pretrained files."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from hdcfl_ray.config.schema import ModelConfig
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.models import (
    FlatIndex,
    SplitModel,
    build_split_model,
    count_parameters,
    flatten_module,
    load_flat_into,
    unflatten,
)
from hdcfl_ray.models.small_cnn import SmallCNN

ENCODERS = ("small_cnn", "resnet18_cifar", "mobilenet_v2", "niid_cnn")
FEATURE_DIMS = {"small_cnn": 128, "resnet18_cifar": 512, "mobilenet_v2": 1280, "niid_cnn": 84}


def small_model(seed: int = 0, **config: object) -> SplitModel:
    return build_split_model(ModelConfig(**config), in_channels=3, num_classes=10, seed=seed)


def resnet_model(seed: int = 0) -> SplitModel:
    return build_split_model(ModelConfig(encoder="resnet18_cifar"), in_channels=3, num_classes=10, seed=seed)


def randomise_batchnorm_statistics(module: nn.Module, seed: int) -> None:
    """Fresh BatchNorm statistics are all 0 and 1; random ones make round trips meaningful."""
    generator = torch.Generator().manual_seed(seed)
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm2d):
            layer.running_mean.copy_(torch.randn(layer.running_mean.shape, generator=generator))
            layer.running_var.copy_(torch.rand(layer.running_var.shape, generator=generator) + 0.5)
            layer.num_batches_tracked.fill_(seed)


# --- shapes and sizes -------------------------------------------------------------


def test_small_cnn_maps_8x8_single_channel_digits_to_logits() -> None:
    model = build_split_model(ModelConfig(encoder="small_cnn"), in_channels=1, num_classes=10, seed=0)
    images = torch.randn(5, 1, 8, 8)
    assert model.encoder(images).shape == (5, 128)
    assert model(images).shape == (5, 10)


def test_small_cnn_width_and_feature_dim_come_from_the_config() -> None:
    model = build_split_model(ModelConfig(width=8, feature_dim=16), in_channels=1, num_classes=4, seed=0)
    assert model.encoder.feature_dim == 16
    assert model.head.in_features == 16 and model.head.out_features == 4
    assert model(torch.randn(3, 1, 8, 8)).shape == (3, 4)


@pytest.mark.parametrize("encoder", ENCODERS)
def test_every_encoder_maps_32x32_rgb_images_to_its_feature_dim(encoder: str) -> None:
    model = build_split_model(ModelConfig(encoder=encoder), in_channels=3, num_classes=10, seed=0)
    images = torch.randn(2, 3, 32, 32)
    model.eval()
    with torch.no_grad():
        features = model.encoder(images)
        logits = model(images)
    assert model.encoder.feature_dim == FEATURE_DIMS[encoder]
    assert features.shape == (2, FEATURE_DIMS[encoder])
    assert logits.shape == (2, 10)
    assert isinstance(model.head, nn.Linear)


@pytest.mark.parametrize("encoder", ("resnet18_cifar", "mobilenet_v2"))
def test_large_encoders_accept_a_single_channel(encoder: str) -> None:
    model = build_split_model(ModelConfig(encoder=encoder), in_channels=1, num_classes=10, seed=0)
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(2, 1, 32, 32)).shape == (2, 10)


def test_resnet18_cifar_has_about_11_2_million_parameters() -> None:
    model = resnet_model()
    encoder_parameters = count_parameters(model.encoder)
    assert 11_000_000 <= encoder_parameters <= 11_400_000
    assert count_parameters(model.head) == 512 * 10 + 10


def test_resnet18_cifar_keeps_full_resolution_in_its_first_stage() -> None:
    encoder = resnet_model().encoder
    stem_output = encoder.stem(torch.randn(1, 3, 32, 32))
    assert stem_output.shape == (1, 64, 32, 32)


def test_mobilenet_v2_downsamples_32x32_inputs_only_to_4x4() -> None:
    encoder = build_split_model(ModelConfig(encoder="mobilenet_v2"), in_channels=3, num_classes=10, seed=0).encoder
    encoder.eval()
    with torch.no_grad():
        feature_map = encoder.features(torch.randn(1, 3, 32, 32))
    assert feature_map.shape == (1, 1280, 4, 4)


def test_split_model_train_and_eval_switch_both_parts() -> None:
    model = resnet_model()
    model.eval()
    assert not model.encoder.training and not model.head.training
    model.train()
    assert model.encoder.training and model.head.training
    assert sum(p.numel() for p in model.parameters()) == count_parameters(model.encoder) + count_parameters(model.head)


# --- seeding ----------------------------------------------------------------------


@pytest.mark.parametrize("encoder", ENCODERS)
def test_same_seed_gives_identical_weights_and_different_seed_different(encoder: str) -> None:
    first = build_split_model(ModelConfig(encoder=encoder), in_channels=3, num_classes=10, seed=7)
    again = build_split_model(ModelConfig(encoder=encoder), in_channels=3, num_classes=10, seed=7)
    other = build_split_model(ModelConfig(encoder=encoder), in_channels=3, num_classes=10, seed=8)
    np.testing.assert_array_equal(flatten_module(first.encoder), flatten_module(again.encoder))
    np.testing.assert_array_equal(flatten_module(first.head), flatten_module(again.head))
    assert not np.array_equal(flatten_module(first.encoder), flatten_module(other.encoder))
    assert not np.array_equal(flatten_module(first.head), flatten_module(other.head))


def test_building_a_model_leaves_the_global_rng_untouched() -> None:
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    small_model(seed=5)
    assert torch.equal(torch.rand(4), expected)


# --- flat vectors -----------------------------------------------------------------


def test_flat_vector_is_contiguous_float32_and_as_long_as_the_index() -> None:
    encoder = resnet_model().encoder
    vector = flatten_module(encoder)
    index = FlatIndex.of(encoder)
    assert vector.dtype == np.float32 and vector.ndim == 1
    assert vector.flags["C_CONTIGUOUS"]
    assert vector.shape == (index.total_size,)
    assert sum(entry.size for entry in index.entries) == index.total_size
    offsets = [entry.offset for entry in index.entries]
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_flat_vector_is_a_copy_not_a_view_of_the_module() -> None:
    model = small_model(seed=0)
    vector = flatten_module(model.head)
    before = model.head.weight.detach().clone()
    vector[:] = 0.0
    assert torch.equal(model.head.weight, before)


def test_flat_index_includes_batchnorm_statistics_and_excludes_batch_counters() -> None:
    encoder = resnet_model().encoder
    index = FlatIndex.of(encoder)
    names = set(index.names)
    assert "stem.1.running_mean" in names and "stem.1.running_var" in names
    assert "stem.1.weight" in names and "stem.1.bias" in names
    assert not any(name.endswith("num_batches_tracked") for name in names)
    float_state_size = sum(t.numel() for t in encoder.state_dict().values() if t.is_floating_point())
    assert index.total_size == float_state_size
    assert index.total_size > count_parameters(encoder)


def test_flat_index_follows_state_dict_order() -> None:
    encoder = resnet_model().encoder
    float_names = [name for name, t in encoder.state_dict().items() if t.is_floating_point()]
    assert list(FlatIndex.of(encoder).names) == float_names


def test_flatten_then_load_round_trip_is_exact() -> None:
    source = resnet_model(seed=1).encoder
    randomise_batchnorm_statistics(source, seed=3)
    target = resnet_model(seed=2).encoder
    load_flat_into(target, flatten_module(source))
    for (name, source_tensor), target_tensor in zip(source.state_dict().items(), target.state_dict().values()):
        if source_tensor.is_floating_point():
            assert torch.equal(source_tensor, target_tensor), name


def test_loading_leaves_integer_buffers_as_the_receiving_modules_own() -> None:
    source = resnet_model(seed=1).encoder
    randomise_batchnorm_statistics(source, seed=3)
    target = resnet_model(seed=2).encoder
    randomise_batchnorm_statistics(target, seed=9)
    load_flat_into(target, flatten_module(source))
    assert int(target.stem[1].num_batches_tracked) == 9


def test_loading_writes_into_the_existing_parameter_storage() -> None:
    model = small_model(seed=0)
    weight = model.encoder.features[0].weight
    storage_before = weight.data_ptr()
    load_flat_into(model.encoder, flatten_module(small_model(seed=1).encoder))
    assert model.encoder.features[0].weight is weight
    assert weight.data_ptr() == storage_before
    assert torch.equal(weight, small_model(seed=1).encoder.features[0].weight)


def test_averaging_two_flat_vectors_gives_the_average_of_every_float_tensor() -> None:
    first = resnet_model(seed=1).encoder
    second = resnet_model(seed=2).encoder
    randomise_batchnorm_statistics(first, seed=3)
    randomise_batchnorm_statistics(second, seed=4)
    average = (flatten_module(first) + flatten_module(second)) / 2
    target = resnet_model(seed=5).encoder
    load_flat_into(target, average, FlatIndex.of(target))
    first_state, second_state = first.state_dict(), second.state_dict()
    checked = 0
    for name, tensor in target.state_dict().items():
        if tensor.is_floating_point():
            expected = (first_state[name] + second_state[name]) / 2
            torch.testing.assert_close(tensor, expected, rtol=0, atol=1e-6)
            checked += 1
    assert checked == len(FlatIndex.of(target).entries)


def test_load_accepts_a_read_only_vector_without_warnings() -> None:
    source = small_model(seed=1).encoder
    read_only = np.frombuffer(flatten_module(source).tobytes(), dtype=np.float32)
    assert not read_only.flags["WRITEABLE"]
    target = small_model(seed=2).encoder
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_flat_into(target, read_only)
    np.testing.assert_array_equal(flatten_module(target), read_only)


def test_load_converts_a_float64_vector() -> None:
    source = small_model(seed=1).encoder
    target = small_model(seed=2).encoder
    load_flat_into(target, flatten_module(source).astype(np.float64))
    np.testing.assert_array_equal(flatten_module(target), flatten_module(source))


def test_load_refuses_a_vector_of_the_wrong_length() -> None:
    encoder = small_model().encoder
    vector = flatten_module(encoder)
    with pytest.raises(ValueError, match="values but the index describes"):
        load_flat_into(encoder, vector[:-1])


def test_load_refuses_an_index_of_another_architecture() -> None:
    wide = SmallCNN(3, width=8)
    narrow = SmallCNN(3, width=4)
    with pytest.raises(ValueError, match="shape"):
        load_flat_into(narrow, flatten_module(wide), FlatIndex.of(wide))


def test_unflatten_names_every_entry_with_its_shape_and_values() -> None:
    encoder = resnet_model(seed=1).encoder
    index = FlatIndex.of(encoder)
    tensors = unflatten(flatten_module(encoder), index)
    state = encoder.state_dict()
    assert list(tensors) == list(index.names)
    for name, tensor in tensors.items():
        assert torch.equal(tensor, state[name])


def test_flat_index_equality_tells_compatible_modules_apart() -> None:
    assert FlatIndex.of(small_model(seed=1).encoder) == FlatIndex.of(small_model(seed=2).encoder)
    assert FlatIndex.of(small_model(width=8).encoder) != FlatIndex.of(small_model(width=16).encoder)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_load_copies_into_a_module_on_the_gpu() -> None:
    source = resnet_model(seed=1).encoder
    target = resnet_model(seed=2).encoder.to("cuda")
    load_flat_into(target, flatten_module(source))
    np.testing.assert_array_equal(flatten_module(target), flatten_module(source))


# --- pretrained encoder files -----------------------------------------------------


def test_pretrained_state_dict_file_gives_the_saved_encoder_weights(tmp_path: Path) -> None:
    saved = resnet_model(seed=11).encoder
    randomise_batchnorm_statistics(saved, seed=3)
    path = tmp_path / "encoder.pt"
    torch.save(saved.state_dict(), path)
    config = ModelConfig(encoder="resnet18_cifar", pretrained=str(path))
    loaded = build_split_model(config, in_channels=3, num_classes=10, seed=0)
    for name, tensor in saved.state_dict().items():
        assert torch.equal(loaded.encoder.state_dict()[name], tensor), name
    # The head stays the seeded one: pretrained weights are for the encoder only.
    assert torch.equal(loaded.head.weight, resnet_model(seed=0).head.weight)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda state: {"state_dict": state},
        lambda state: {"encoder": state, "epoch": 3},
        lambda state: {f"module.{key}": value for key, value in state.items()},
        lambda state: {f"encoder.{key}": value for key, value in state.items()},
    ],
    ids=["state_dict-key", "encoder-key", "module-prefix", "encoder-prefix"],
)
def test_pretrained_accepts_common_checkpoint_wrappings(
    tmp_path: Path, wrap: Callable[[dict[str, torch.Tensor]], dict[str, object]]
) -> None:
    saved = small_model(seed=11).encoder
    path = tmp_path / "checkpoint.pt"
    torch.save(wrap(saved.state_dict()), path)
    loaded = small_model(seed=0, pretrained=str(path))
    np.testing.assert_array_equal(flatten_module(loaded.encoder), flatten_module(saved))


def test_pretrained_file_covering_part_of_the_encoder_logs_the_missing_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved = small_model(seed=11).encoder
    partial = {key: value for key, value in saved.state_dict().items() if key.startswith("features.")}
    path = tmp_path / "partial.pt"
    torch.save(partial, path)
    with caplog.at_level("WARNING"):
        loaded = small_model(seed=0, pretrained=str(path))
    assert "projection.0.weight" in caplog.text
    assert torch.equal(loaded.encoder.features[0].weight, saved.features[0].weight)
    assert torch.equal(loaded.encoder.projection[0].weight, small_model(seed=0).encoder.projection[0].weight)


def test_missing_pretrained_file_is_a_scenario_error_naming_the_key(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.pt"
    with pytest.raises(ScenarioError, match="model.pretrained") as raised:
        small_model(pretrained=str(missing))
    assert str(missing) in str(raised.value)
    assert "nothing is downloaded" in str(raised.value)


def test_pretrained_file_with_no_matching_keys_is_a_scenario_error(tmp_path: Path) -> None:
    path = tmp_path / "unrelated.pt"
    torch.save({"backbone.conv.weight": torch.zeros(3, 3)}, path)
    with pytest.raises(ScenarioError, match="model.pretrained.*no tensor whose name matches"):
        small_model(pretrained=str(path))


def test_pretrained_file_of_another_width_is_a_scenario_error(tmp_path: Path) -> None:
    path = tmp_path / "wide.pt"
    torch.save(small_model(width=16).encoder.state_dict(), path)
    with pytest.raises(ScenarioError, match="model.pretrained.*wrong shape"):
        small_model(width=8, pretrained=str(path))


class ArbitraryObject:
    """Not a tensor: a weights-only load must refuse to rebuild it."""

    def __init__(self) -> None:
        self.payload = "anything"


def test_pretrained_file_holding_an_arbitrary_object_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pickled.pt"
    state = small_model(seed=11).encoder.state_dict()
    torch.save({**state, "extra": ArbitraryObject()}, path)
    with pytest.raises(ScenarioError, match="model.pretrained.*weights-only"):
        small_model(pretrained=str(path))


def test_pretrained_file_that_is_not_a_state_dict_is_a_scenario_error(tmp_path: Path) -> None:
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path)
    with pytest.raises(ScenarioError, match="model.pretrained.*not a state dict"):
        small_model(pretrained=str(path))


def test_momentum_sgd_takes_the_same_steps_as_torch_sgd() -> None:
    import torch
    from torch import nn

    from hdcfl_ray.training.local_training import MomentumSGD

    def trained(make):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
        optimizer = make(list(model.parameters()))
        generator = torch.Generator().manual_seed(1)
        for _ in range(6):
            inputs = torch.randn(8, 3, 8, 8, generator=generator)
            labels = torch.randint(0, 5, (8,), generator=generator)
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
        return [parameter.detach().clone() for parameter in model.parameters()]

    for momentum, weight_decay in ((0.9, 5e-4), (0.0, 0.0), (0.5, 0.0)):
        ours = trained(lambda params: MomentumSGD(params, lr=0.05, momentum=momentum, weight_decay=weight_decay))
        # our foreach step against torch's per-tensor loop and its foreach path: the same bits on CPU
        for foreach in (False, True):
            reference = trained(lambda params: torch.optim.SGD(params, lr=0.05, momentum=momentum, weight_decay=weight_decay, foreach=foreach))
            for mine, theirs in zip(ours, reference):
                assert torch.equal(mine, theirs)
