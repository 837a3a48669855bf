"""LEAF's reference models as encoders (docs/natural-data.md, "The models"): `leaf_lstm` and
`leaf_femnist_cnn` have LEAF's layers and parameter counts, split before the last dense
layer; char_lstm's sizes are keys whose defaults build today's model bit for bit; each
model stops on the wrong input before a run starts, and runs a round on the generated
stand-ins (leaf_lstm with clients trained together, too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn import functional as F

from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.schema import ModelConfig
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.standins.femnist import write_femnist_standin
from hdcfl_ray.data.standins.shakespeare import write_shakespeare_standin
from hdcfl_ray.data.transforms import to_float_batch
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.models import build_split_model, count_parameters
from hdcfl_ray.models.char_lstm import CharLSTM, ids_from_batch
from hdcfl_ray.models.encoders import check_encoder_reads
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.cli_exit import assert_refused


def layer_count(weight_shape: tuple[int, ...], bias: int) -> int:
    return int(np.prod(weight_shape)) + bias


def text_batch(size: int = 4, length: int = 10, seed: int = 0) -> torch.Tensor:
    ids = np.random.default_rng(seed).integers(0, 81, size=(size, length, 1, 1)).astype(np.uint8)
    return to_float_batch(ids)


def images(size: int = 4, side: int = 28, seed: int = 0) -> torch.Tensor:
    return torch.rand(size, 1, side, side, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# ---- LEAF's Shakespeare model --------------------------------------------------------------------

# LEAF's stacked_lstm.py (TensorFlow) for 80 classes, layer by layer: one bias per LSTM layer
LEAF_SHAKESPEARE_TENSORFLOW = {
    "embedding": ((80, 8), 0),
    "lstm layer 1": ((8 + 256, 4 * 256), 4 * 256),
    "lstm layer 2": ((256 + 256, 4 * 256), 4 * 256),
    "dense": ((256, 80), 80),
}
# this project's, for its 81 classes: the embedding reads any uint8 id, torch keeps two biases per layer
LEAF_LSTM_ENCODER = {
    "embedding.weight": (256, 8),
    "lstm.weight_ih_l0": (4 * 256, 8), "lstm.weight_hh_l0": (4 * 256, 256),
    "lstm.bias_ih_l0": (4 * 256,), "lstm.bias_hh_l0": (4 * 256,),
    "lstm.weight_ih_l1": (4 * 256, 256), "lstm.weight_hh_l1": (4 * 256, 256),
    "lstm.bias_ih_l1": (4 * 256,), "lstm.bias_hh_l1": (4 * 256,),
}


def leaf_lstm(seed: int = 0, num_classes: int = 81) -> Any:
    return build_split_model(ModelConfig(encoder="leaf_lstm"), in_channels=1, num_classes=num_classes, seed=seed)


def test_leaf_lstm_has_the_reference_layers_split_before_the_dense_layer() -> None:
    model = leaf_lstm()
    assert {name: tuple(parameter.shape) for name, parameter in model.encoder.named_parameters()} == LEAF_LSTM_ENCODER
    assert (tuple(model.head.weight.shape), tuple(model.head.bias.shape)) == ((81, 256), (81,))
    assert model.feature_dim == model.encoder.feature_dim == 256
    assert (model.encoder.lstm.num_layers, model.encoder.lstm.dropout) == (2, 0.0)


def test_leaf_lstm_parameter_count_and_how_it_differs_from_leafs() -> None:
    reference = sum(layer_count(*layer) for layer in LEAF_SHAKESPEARE_TENSORFLOW.values())
    assert reference == 817872  # LEAF's model, as docs/natural-data.md quotes it
    model = leaf_lstm()
    assert (count_parameters(model.encoder), count_parameters(model.head)) == (800768, 20817)
    embedding_rows, second_biases, other_class = (256 - 80) * 8, 2 * 4 * 256, 256 + 1
    assert count_parameters(model.encoder) + count_parameters(model.head) == reference + embedding_rows + second_biases + other_class == 821585
    assert count_parameters(leaf_lstm(num_classes=80).head) == layer_count(*LEAF_SHAKESPEARE_TENSORFLOW["dense"])


def test_leaf_lstm_computes_two_stacked_lstms_and_reads_the_last_step() -> None:
    model = leaf_lstm(seed=3)
    batch = text_batch(size=3, length=7)
    encoder = model.encoder
    with torch.no_grad():
        embedded = encoder.embedding(ids_from_batch(batch))
        stacked, _ = encoder.lstm(embedded)
        features = encoder(batch)
        logits = model(batch)
    assert features.shape == (3, 256) and logits.shape == (3, 81)
    torch.testing.assert_close(features, stacked[:, -1], rtol=0, atol=0)
    torch.testing.assert_close(logits, model.head(stacked[:, -1]), rtol=0, atol=0)


def test_two_layer_stepwise_form_matches_the_fused_lstm_and_batches_under_vmap() -> None:
    """What runtime.batched_training runs: the stepwise form, vmapped over clients."""
    torch.manual_seed(2)
    models = [CharLSTM(feature_dim=12, embedding_dim=5, num_layers=2) for _ in range(3)]
    batches = torch.stack([text_batch(seed=seed) for seed in range(3)])
    embedded = models[0].embedding(ids_from_batch(batches[0]))
    torch.testing.assert_close(models[0](batches[0]), models[0].stepwise(embedded), rtol=1e-5, atol=1e-6)
    params, buffers = stack_module_state(models)

    def features(p: Any, b: Any, x: torch.Tensor) -> torch.Tensor:
        return functional_call(models[0], (p, b), (x,))

    together = vmap(features)(params, buffers, batches)
    for index, model in enumerate(models):
        torch.testing.assert_close(together[index], model(batches[index]), rtol=1e-5, atol=1e-6)


# ---- char_lstm's sizes as keys ----------------------------------------------------------------------


def test_char_lstm_defaults_build_the_one_layer_model_bit_for_bit() -> None:
    """embedding_dim 8 and lstm_layers 1 are the model char_lstm always was: the same
    weights drawn in the same order and the same outputs (21k encoder parameters at 64 units)."""
    config = ModelConfig(encoder="char_lstm", feature_dim=64)
    assert (config.embedding_dim, config.lstm_layers) == (8, 1)
    model = build_split_model(config, in_channels=1, num_classes=81, seed=11)
    torch.manual_seed(11)
    embedding, lstm = nn.Embedding(256, 8), nn.LSTM(8, 64, batch_first=True)
    head = nn.Linear(64, 81)
    expected = {**{f"embedding.{k}": v for k, v in embedding.state_dict().items()}, **{f"lstm.{k}": v for k, v in lstm.state_dict().items()}}
    state = model.encoder.state_dict()
    assert state.keys() == expected.keys() and all(torch.equal(state[key], expected[key]) for key in expected)
    assert torch.equal(model.head.weight, head.weight) and torch.equal(model.head.bias, head.bias)
    assert count_parameters(model.encoder) == 20992
    batch = text_batch(size=5, length=20)
    with torch.no_grad():
        _, (hidden, _) = lstm(embedding(ids_from_batch(batch)))
        torch.testing.assert_close(model(batch), head(hidden[-1]), rtol=0, atol=0)


def test_char_lstm_keys_size_the_model() -> None:
    config = ModelConfig(encoder="char_lstm", feature_dim=32, embedding_dim=16, lstm_layers=3)
    model = build_split_model(config, in_channels=1, num_classes=81, seed=0)
    lstm = model.encoder.lstm
    assert (model.encoder.embedding.embedding_dim, lstm.hidden_size, lstm.num_layers) == (16, 32, 3)
    first = 4 * 32 * (16 + 32) + 2 * 4 * 32
    later = 4 * 32 * (32 + 32) + 2 * 4 * 32
    assert count_parameters(model.encoder) == 256 * 16 + first + 2 * later
    assert model(text_batch()).shape == (4, 81)


def test_char_lstm_at_leafs_sizes_is_leaf_lstm_weights_included() -> None:
    sized = build_split_model(ModelConfig(encoder="char_lstm", feature_dim=256, lstm_layers=2), in_channels=1, num_classes=81, seed=4)
    named = leaf_lstm(seed=4)
    for part in ("encoder", "head"):
        ours, theirs = getattr(sized, part).state_dict(), getattr(named, part).state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[key], theirs[key]) for key in ours)


@pytest.mark.parametrize("encoder", ["small_cnn", "leaf_lstm", "leaf_femnist_cnn"])
@pytest.mark.parametrize("key", ["embedding_dim", "lstm_layers"])
def test_char_lstm_keys_on_another_encoder_are_refused(encoder: str, key: str) -> None:
    with pytest.raises(ValueError, match=rf"model.{key}: 2 sizes char_lstm only, and model.encoder is {encoder}"):
        ModelConfig(encoder=encoder, **{key: 2})
    ModelConfig(encoder=encoder, **{key: ModelConfig.model_fields[key].default})


# ---- LEAF's FEMNIST CNN ----------------------------------------------------------------------------

# LEAF's femnist/cnn.py for one channel and 62 classes, layer by layer: weight shape, bias size
LEAF_FEMNIST_ENCODER = {
    "conv1": ((32, 1, 5, 5), 32),
    "conv2": ((64, 32, 5, 5), 64),
    "dense": ((2048, 7 * 7 * 64), 2048),
}
LEAF_FEMNIST_HEAD = ((62, 2048), 62)


def leaf_femnist_cnn(seed: int = 0, num_classes: int = 62) -> Any:
    return build_split_model(ModelConfig(encoder="leaf_femnist_cnn"), in_channels=1, num_classes=num_classes, seed=seed)


def test_leaf_femnist_cnn_has_the_reference_layers_and_parameter_count() -> None:
    model = leaf_femnist_cnn()
    shapes = {name: tuple(parameter.shape) for name, parameter in model.encoder.named_parameters()}
    expected: dict[str, tuple[int, ...]] = {}
    for layer, (weight, bias) in LEAF_FEMNIST_ENCODER.items():
        expected[f"{layer}.weight"], expected[f"{layer}.bias"] = weight, (bias,)
    assert shapes == expected
    assert (tuple(model.head.weight.shape), tuple(model.head.bias.shape)) == (LEAF_FEMNIST_HEAD[0], (LEAF_FEMNIST_HEAD[1],))
    encoder = sum(layer_count(*layer) for layer in LEAF_FEMNIST_ENCODER.values())
    assert (count_parameters(model.encoder), count_parameters(model.head)) == (encoder, layer_count(*LEAF_FEMNIST_HEAD)) == (6476672, 127038)
    assert encoder + layer_count(*LEAF_FEMNIST_HEAD) == 6603710  # LEAF's model, as docs/natural-data.md quotes it
    assert count_parameters(leaf_femnist_cnn(num_classes=10).head) == 20490  # the stand-in's 10 classes


def test_leaf_femnist_cnn_computes_the_reference_forward_pass() -> None:
    """'same' 5x5 convolutions with ReLU and 2x2 pools, the dense layer with ReLU, then the head."""
    model = leaf_femnist_cnn(seed=3)
    batch = images()
    layers = dict(model.encoder.named_children())
    with torch.no_grad():
        x = F.max_pool2d(F.relu(layers["conv1"](batch)), 2)
        assert x.shape == (4, 32, 14, 14)  # 'same': 28 -> 28, then the pool
        x = F.max_pool2d(F.relu(layers["conv2"](x)), 2).reshape(-1, 7 * 7 * 64)
        x = F.relu(layers["dense"](x))
        features = model.encoder(batch)
        logits = model(batch)
    assert features.shape == (4, 2048) and bool((features >= 0).all())
    assert logits.shape == (4, 62)
    torch.testing.assert_close(logits, model.head(x), rtol=0, atol=0)


# ---- the wrong input stops before a run ---------------------------------------------------------------


def tiny_dataset(side: int, text: bool = False) -> ImageDataset:
    def split(count: int) -> tuple[np.ndarray, np.ndarray]:
        shape = (count, side, 1, 1) if text else (count, side, side, 1)
        return np.zeros(shape, np.uint8), np.arange(count, dtype=np.int64) % 2

    train, test = split(4), split(2)
    return ImageDataset("tiny", train[0], train[1], test[0], test[1], ("a", "b"), text=text)


def test_leaf_femnist_cnn_stops_on_images_that_are_not_28x28() -> None:
    config = ModelConfig(encoder="leaf_femnist_cnn")
    check_encoder_reads(config, tiny_dataset(28))
    with pytest.raises(ScenarioError, match=r"model.encoder: leaf_femnist_cnn is LEAF's FEMNIST CNN, .* 7 x 7 x 64 .* 28x28 .* holds 32x32 images"):
        check_encoder_reads(config, tiny_dataset(32))
    with pytest.raises(ScenarioError, match=r"model.encoder: leaf_femnist_cnn reads images, and tiny holds text"):
        check_encoder_reads(config, tiny_dataset(80, text=True))


def test_leaf_lstm_stops_on_images() -> None:
    config = ModelConfig(encoder="leaf_lstm")
    check_encoder_reads(config, tiny_dataset(80, text=True))
    with pytest.raises(ScenarioError, match=r"model.encoder: leaf_lstm reads character sequences, and tiny holds images"):
        check_encoder_reads(config, tiny_dataset(28))


def test_simulate_refuses_leaf_femnist_cnn_on_8x8_digits_with_exit_2(tmp_path: Path) -> None:
    scenario = tmp_path / "digits.yaml"
    scenario.write_text("name: d\nmodel: {encoder: leaf_femnist_cnn}\nalgorithm: {name: fedavg}\n")
    assert_refused("simulate", scenario, tmp_path, ["model.encoder: leaf_femnist_cnn", "28x28", "holds 8x8 images"])


def test_simulate_refuses_an_lstm_size_on_an_image_encoder_with_exit_2(tmp_path: Path) -> None:
    scenario = tmp_path / "digits.yaml"
    scenario.write_text("name: d\nmodel: {encoder: small_cnn, lstm_layers: 2}\nalgorithm: {name: fedavg}\n")
    assert_refused("validate", scenario, tmp_path, ["model.lstm_layers: 2 sizes char_lstm only"])


# ---- a round on the stand-ins --------------------------------------------------------------------------

LENGTH = 12  # characters per window: a short LSTM, seconds per round


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("leaf-standins")
    return {
        "femnist": write_femnist_standin(root / "femnist", writers=6, mean_samples=12, seed=3),
        "shakespeare": write_shakespeare_standin(root / "shakespeare", roles=4, mean_characters=60, seed=3, length=LENGTH),
    }


def stand_in_scenario(kind: str, standins: dict[str, Path], **runtime: Any) -> Any:
    if kind == "femnist":
        dataset = {"name": "huggingface", "path": str(standins["femnist"]), "label_column": "character", "test_split": None}
        partition = {"kind": "natural_id", "partition_by": "writer_id", "num_clients": 4, "min_samples": 4}
        model = {"encoder": "leaf_femnist_cnn"}
    else:
        dataset = {
            "name": "text", "path": str(standins["shakespeare"]), "text_column": "x", "target_column": "y",
            "sequence_length": LENGTH, "test_split": None,
        }
        partition = {"kind": "natural_id", "partition_by": "character_id", "num_clients": 4, "min_samples": 4}
        model = {"encoder": "leaf_lstm"}
    return build_scenario({
        "name": f"leaf-{kind}",
        "seed": 5,
        "dataset": dataset,
        "partition": partition,
        "model": model,
        "algorithm": {"name": "fedavg"},
        "protocol": {"rounds": 1, "local_epochs": 1, "batch_size": 10, "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.0}},
        "runtime": {"backend": "local", "num_cpus_per_actor": 1, **runtime},
    })


def run_one_round(scenario: Any, run_dir: Path) -> dict[str, list[Any]]:
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    clients = pq.read_table(run_dir / "clients.parquet").to_pydict()
    assert set(clients["round"]) == {1} and sorted(set(clients["client_id"])) == [0, 1, 2, 3]
    assert all(0.0 <= accuracy <= 1.0 for accuracy in clients["accuracy"])
    return clients


@pytest.mark.parametrize(("kind", "encoder", "encoder_parameters"), [("femnist", "leaf_femnist_cnn", 6476672), ("shakespeare", "leaf_lstm", 800768)])
def test_a_round_on_the_stand_in(standins: dict[str, Path], tmp_path: Path, kind: str, encoder: str, encoder_parameters: int) -> None:
    run_one_round(stand_in_scenario(kind, standins), tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["scenario_resolved"]["model"]["encoder"] == encoder
    assert manifest["encoder_parameters"] == encoder_parameters


def test_leaf_lstm_trains_with_clients_batched_together(standins: dict[str, Path], tmp_path: Path) -> None:
    """runtime.batched_training vmaps leaf_lstm's two-layer stepwise form, as it does char_lstm's."""
    run_one_round(stand_in_scenario("shakespeare", standins, batched_training=True), tmp_path / "run")
    updates = pq.read_table(tmp_path / "run" / "updates.parquet").to_pydict()
    assert max(updates["trained_together"]) > 1


def test_the_step_benchmark_prints_every_model(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import model_step

    monkeypatch.setattr("sys.argv", ["model_step", "--steps", "1", "--warmup", "1", "--repeats", "1"])
    model_step.main()
    printed = capsys.readouterr().out
    for count in ("26,257", "821,585", "26,334", "6,603,710"):
        assert f"| {count} |" in printed
