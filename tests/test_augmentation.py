"""Training-time augmentation (dataset.augmentation): random crops of the padded image and
random horizontal flips, drawn per sample from a stream of the client's own round.

* the crop and flip are torchvision's (pad, crop at the same offsets, hflip), exactly;
* the defaults, and a key at its defaults, change no bit of a run;
* the draws are the same alone and batched, for every client and step, so the augmented
  batches are the same bits (the trained weights then differ only as batched training's
  grouped kernels round: tests/test_batched_training.py's tolerance);
* a run is reproducible and resumes to its uninterrupted bits; another seed draws otherwise;
* bad values, text data and padding as wide as the image exit 2 naming the key;
* with and without augmentation are different settings, and the NIID-Bench sweep with it
  runs the four methods augmented, in a folder of its own.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import torchvision.transforms.v2.functional as tvf
from torch import nn

import hdcfl_ray
from hdcfl_ray.config.augmentation import AugmentationConfig
from hdcfl_ray.config.fingerprint import setting_fingerprint
from hdcfl_ray.config.loading import build_scenario, load_scenario
from hdcfl_ray.config.setting_changes import setting_changes
from hdcfl_ray.contract import OptimizerConfig
from hdcfl_ray.data import augmentation as augmentation_module
from hdcfl_ray.data.augmentation import augment, draw, training_augmentation
from hdcfl_ray.data.transforms import BLACK
from hdcfl_ray.models import SplitModel
from hdcfl_ray.models.small_cnn import SmallCNN
from hdcfl_ray.runtime.client import batched_training
from hdcfl_ray.runtime.client.batched_training import TrainRequest, train_together
from hdcfl_ray.runtime.preflight import prepare_run
from hdcfl_ray.sweeps.grid import expand, read_sweep_file
from hdcfl_ray.training import local_training
from hdcfl_ray.training.local_training import train_locally
from tests.cli_exit import assert_refused
from tests.conftest import tiny_scenario
from tests.stop_observer import resume_after_a_stop

NIID_BENCH = {"crop_padding": 4, "padding_mode": "reflect", "horizontal_flip": True}
SGD = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4)
QUICKSTART = Path(__file__).parents[1] / "scenarios" / "quickstart.yaml"


def torchvision_reference(images: torch.Tensor, draws: torch.Tensor, settings: AugmentationConfig) -> torch.Tensor:
    """Each sample padded, cropped at its drawn offset and flipped by torchvision, one at a time."""
    padding = settings.crop_padding
    height, width = images.shape[-2:]
    out = []
    for image, (top, left, flip) in zip(images, draws.tolist()):
        if settings.padding_mode == "reflect":
            padded = tvf.pad(image, [padding], padding_mode="reflect")
        else:
            padded = tvf.pad(image, [padding], fill=BLACK, padding_mode="constant")
        cropped = tvf.crop(padded, top, left, height, width)
        out.append(tvf.horizontal_flip(cropped) if flip else cropped)
    return torch.stack(out)


@pytest.mark.parametrize("padding_mode", ["reflect", "zeros"])
@pytest.mark.parametrize(("crop_padding", "flip"), [(4, True), (4, False), (0, True), (7, True)])
def test_crop_and_flip_are_torchvisions_pad_crop_and_hflip_on_the_same_draws(padding_mode: str, crop_padding: int, flip: bool) -> None:
    settings = AugmentationConfig(crop_padding=crop_padding, padding_mode=padding_mode, horizontal_flip=flip)
    images = torch.rand(64, 3, 8, 10, generator=torch.Generator().manual_seed(1)) * 2 - 1
    draws = draw(settings, 64, torch.Generator().manual_seed(2))
    got = augment(images, draws, settings)
    assert torch.equal(got, torchvision_reference(images, draws, settings))
    assert torch.equal(augment(images.contiguous(memory_format=torch.channels_last), draws, settings), got)
    # the draws cover the whole range: every offset in 0..2p and both flips occur
    assert set(draws[:, 0].tolist()) == set(range(2 * crop_padding + 1))
    assert set(draws[:, 2].tolist()) == ({0, 1} if flip else {0})


def test_zero_padding_is_black_after_normalisation_and_keeps_channels_last() -> None:
    settings = AugmentationConfig(crop_padding=2, padding_mode="zeros")
    images = torch.ones(1, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    corner = augment(images, torch.tensor([[0, 0, 0]]), settings)
    assert corner[0, :, 0, 0].tolist() == [-1.0, -1.0, -1.0] and corner[0, :, 2:, 2:].eq(1.0).all()
    assert corner.is_contiguous(memory_format=torch.channels_last)
    assert AugmentationConfig(padding_mode="constant").padding_mode == "zeros"  # torchvision's name for it


def test_the_draws_are_fixed_by_seed_client_and_round_and_another_seed_draws_otherwise() -> None:
    settings = AugmentationConfig(**NIID_BENCH)

    def draws(seed: int, client: int, round_index: int) -> torch.Tensor:
        augmentation = training_augmentation(settings, seed, client, round_index)
        assert augmentation is not None
        return augmentation.draw(100)

    assert torch.equal(draws(42, 3, 5), draws(42, 3, 5))
    for other in ((43, 3, 5), (42, 4, 5), (42, 3, 6)):
        assert not torch.equal(draws(42, 3, 5), draws(*other))
    assert training_augmentation(AugmentationConfig(), 42, 3, 5) is None  # the defaults add none


def small_model() -> SplitModel:
    torch.manual_seed(0)
    return SplitModel(SmallCNN(3, width=8, feature_dim=32), nn.Linear(32, 10))


def client_data(sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.rand(n, 3, 12, 12, generator=generator) * 2 - 1, torch.randint(0, 10, (n,), generator=generator)) for n in sizes]


def recording_augment(monkeypatch: pytest.MonkeyPatch, module: object) -> list[torch.Tensor]:
    """Every batch `module`'s training loop augments, as it came out."""
    seen: list[torch.Tensor] = []

    def recorded(images: torch.Tensor, draws: torch.Tensor, settings: AugmentationConfig) -> torch.Tensor:
        out = augmentation_module.augment(images, draws, settings)
        seen.append(out.detach().clone())
        return out

    monkeypatch.setattr(module, "augment", recorded)
    return seen


def test_a_client_sees_the_same_augmented_batches_alone_and_in_a_batched_group(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = AugmentationConfig(**NIID_BENCH)
    sizes = [20, 20, 13]  # 13 samples end each epoch on a batch of 5: a step the others take apart
    data = client_data(sizes)
    base = small_model()
    epochs, batch = 2, 8
    alone_batches = recording_augment(monkeypatch, local_training)
    alone_models = []
    for client, (images, labels) in enumerate(data):
        model = copy.deepcopy(base)
        train_locally(
            model, images, labels, epochs=epochs, batch_size=batch, optimizer_config=SGD,
            generator=torch.Generator().manual_seed(client), augmentation=training_augmentation(settings, 42, client, 1),
        )  # fmt: skip
        alone_models.append(model)
    group_batches = recording_augment(monkeypatch, batched_training)
    requests = [
        TrainRequest(
            model=copy.deepcopy(base), inputs=images, labels=labels, epochs=epochs, batch_size=batch, optimizer_config=SGD,
            generator=torch.Generator().manual_seed(client), augmentation=training_augmentation(settings, 42, client, 1),
        )  # fmt: skip
        for client, (images, labels) in enumerate(data)
    ]
    stats = train_together(requests)
    assert all(result.trained_together == 3 for result in stats)
    # alone: each client's steps in turn; batched: per step group, its clients' batches stacked
    alone_by_client: list[list[torch.Tensor]] = []
    position = 0
    for n in sizes:
        steps = epochs * -(-n // batch)
        alone_by_client.append(alone_batches[position : position + steps])
        position += steps
    batched_by_client: list[list[torch.Tensor]] = [[] for _ in sizes]
    plan = batched_training._GroupPlan([copy.copy(request) for request in requests])  # only for the step groups' members
    assert len(plan.groups) == len(group_batches)
    for group, stacked in zip(plan.groups, group_batches):
        for row, client in enumerate(group.clients):
            batched_by_client[client].append(stacked[row * group.size : (row + 1) * group.size])
    for alone, together in zip(alone_by_client, batched_by_client):
        assert len(alone) == len(together)
        assert all(torch.equal(a, b) for a, b in zip(alone, together))
    # the weights agree as batched training's do without augmentation (tests/test_batched_training.py)
    for alone_model, request in zip(alone_models, requests):
        difference = torch.cat([(a - b).detach().flatten() for a, b in zip(alone_model.parameters(), request.model.parameters())])
        assert float(difference.abs().max()) <= 1e-6


def test_a_diverging_client_leaves_its_augmentation_stream_where_training_it_alone_does() -> None:
    """A client whose loss turns non-finite stops after that epoch, alone and batched: the
    batched plan drew every epoch ahead, and puts the stream back where training alone
    leaves it, so the client's next training this round draws the same crops."""
    settings = AugmentationConfig(**NIID_BENCH)
    data = client_data([16, 16])
    data[1] = (data[1][0] * float("inf"), data[1][1])
    states = []
    for together in (False, True):
        augmentations = [training_augmentation(settings, 42, client, 1) for client in range(2)]
        requests = [
            TrainRequest(
                model=small_model(), inputs=images, labels=labels, epochs=3, batch_size=4, optimizer_config=SGD,
                generator=torch.Generator().manual_seed(client), augmentation=augmentations[client],
            )  # fmt: skip
            for client, (images, labels) in enumerate(data)
        ]
        stats = train_together(requests) if together else [batched_training.train_alone(request) for request in requests]
        assert stats[1].nonfinite and stats[1].steps == 4
        states.append([augmentation.generator.get_state() for augmentation in augmentations if augmentation is not None])
    assert all(torch.equal(a, b) for a, b in zip(*states))


def test_the_batch_order_draws_are_untouched_by_augmentation() -> None:
    images, labels = client_data([24])[0]
    generators = []
    for settings in (AugmentationConfig(), AugmentationConfig(**NIID_BENCH)):
        generator = torch.Generator().manual_seed(3)
        train_locally(
            small_model(), images, labels, epochs=2, batch_size=8, optimizer_config=SGD, generator=generator,
            augmentation=training_augmentation(settings, 42, 0, 1),
        )  # fmt: skip
        generators.append(generator.get_state())
    assert torch.equal(generators[0], generators[1])


def quickstart_rows(tmp_path: Path, name: str, **overrides: object) -> list[tuple]:
    run = hdcfl_ray.simulate(
        QUICKSTART,
        overrides={
            "protocol.rounds": 2,
            "protocol.participation": 0.5,
            "algorithm.hdcfl.groups": 4,
            "runtime.backend": "local",
            "checkpoint.every": None,
            "output.dir": str(tmp_path / name),
            **overrides,
        },
        progress=False,
    )
    table = pq.read_table(run.dir / "clients.parquet").sort_by([("round", "ascending"), ("client_id", "ascending")])
    return list(zip(*(table.column(column).to_pylist() for column in ("round", "client_id", "accuracy", "loss", "train_loss"))))


def test_augmentation_at_its_defaults_is_the_same_bits_as_no_key_and_on_it_changes_training(tmp_path: Path) -> None:
    without = quickstart_rows(tmp_path, "without")
    at_defaults = quickstart_rows(tmp_path, "defaults", **{"dataset.augmentation": {"crop_padding": 0, "horizontal_flip": False}})
    assert at_defaults == without
    augmented = quickstart_rows(tmp_path, "augmented", **{"dataset.augmentation": {"crop_padding": 1, "horizontal_flip": True}})
    again = quickstart_rows(tmp_path, "again", **{"dataset.augmentation": {"crop_padding": 1, "horizontal_flip": True}})
    assert augmented == again  # reproducible
    assert [row[4] for row in augmented] != [row[4] for row in without]  # the training losses moved
    reseeded = quickstart_rows(tmp_path, "reseeded", seed=43, **{"dataset.augmentation": {"crop_padding": 1, "horizontal_flip": True}})
    plain_reseeded = quickstart_rows(tmp_path, "plain-reseeded", seed=43)
    assert [row[4] for row in reseeded] != [row[4] for row in plain_reseeded]


def test_an_augmented_run_gives_the_same_scores_batched_and_one_at_a_time(tmp_path: Path, write_scenario) -> None:
    rows = {}
    for batched in (False, True):
        scenario = tiny_scenario(
            dataset={"name": "digits", "augmentation": {"crop_padding": 2, "horizontal_flip": True}},
            protocol={"rounds": 2, "participation": 1.0, "local_epochs": 1, "batch_size": 16},
            partition={"kind": "rotation", "num_clients": 6, "angles": [0, 180], "test_per_client": 30},
            runtime={"backend": "local", "num_cpus": 1, "batched_training": batched},
            output={"dir": str(tmp_path / f"batched-{batched}")},
            checkpoint={"every": None},
        )
        run = hdcfl_ray.simulate(write_scenario(scenario, f"{batched}.yaml"), progress=False)
        table = pq.read_table(run.dir / "clients.parquet").to_pylist()
        rows[batched] = {(row["round"], row["client_id"]): (row["accuracy"], row["loss"]) for row in table}
    assert rows[True].keys() == rows[False].keys()
    for key, (accuracy, loss) in rows[False].items():
        assert abs(rows[True][key][0] - accuracy) <= 1 / 30 + 1e-9, key
        assert rows[True][key][1] == pytest.approx(loss, rel=1e-3), key


def test_an_augmented_run_stopped_and_resumed_gives_the_uninterrupted_bits(tmp_path: Path) -> None:
    scenario = build_scenario(
        tiny_scenario(
            dataset={"name": "digits", "augmentation": NIID_BENCH | {"crop_padding": 2}},
            algorithm={"name": "fedavg"},
            protocol={"rounds": 4, "participation": 0.5},
            runtime={"backend": "local", "num_cpus": 1},
            checkpoint={"every": 2},
        )
    )
    resume_after_a_stop(scenario, tmp_path)


@pytest.mark.parametrize(
    ("augmentation", "expected"),
    [
        ({"crop_padding": -1}, ["dataset.augmentation.crop_padding", "greater than or equal to 0"]),
        ({"crop_padding": 2.5}, ["dataset.augmentation.crop_padding", "integer"]),
        ({"crop_padding": True}, ["dataset.augmentation.crop_padding", "integer"]),
        ({"padding_mode": "edge"}, ["dataset.augmentation.padding_mode", "'reflect'", "'zeros'"]),
        ({"horizontal_fip": True}, ["dataset.augmentation.horizontal_fip", "did you mean 'horizontal_flip'"]),
        ({"crop_padding": 8}, ["dataset.augmentation.crop_padding: 8", "8x8 images", "choose 0..7"]),
    ],
)
def test_bad_augmentation_exits_2_naming_the_key_and_the_fix(write_scenario, tmp_path: Path, augmentation: dict, expected: list[str]) -> None:
    path = write_scenario(tiny_scenario(dataset={"name": "digits", "augmentation": augmentation}))
    assert_refused("validate", path, tmp_path, expected)


def test_augmentation_of_text_exits_2_naming_the_key(write_scenario, tmp_path: Path) -> None:
    from hdcfl_ray.data.standins.shakespeare import write_shakespeare_standin

    folder = write_shakespeare_standin(tmp_path / "shakespeare", roles=8, mean_characters=160, seed=3, length=12)
    text = {"name": "text", "path": str(folder), "text_column": "x", "target_column": "y", "sequence_length": 12, "test_split": None}
    scenario = tiny_scenario(
        dataset={**text, "augmentation": {"horizontal_flip": True}},
        partition={"kind": "natural_id", "num_clients": 4, "partition_by": "character_id", "min_samples": 4, "test_per_client": None},
        model={"encoder": "char_lstm", "feature_dim": 16},
        algorithm={"name": "fedavg"},
    )
    assert_refused("simulate", write_scenario(scenario), tmp_path, ["dataset.augmentation", "holds text", "remove dataset.augmentation"])


def test_with_and_without_augmentation_are_different_settings() -> None:
    plain = build_scenario(tiny_scenario())
    augmented = build_scenario(tiny_scenario(dataset={"name": "digits", "augmentation": NIID_BENCH}))
    at_defaults = build_scenario(tiny_scenario(dataset={"name": "digits", "augmentation": {}}))
    assert setting_fingerprint(plain) != setting_fingerprint(augmented)
    assert setting_fingerprint(plain) == setting_fingerprint(at_defaults)
    changed = {change.key for change in setting_changes(plain, augmented)}
    assert changed == {"dataset.augmentation.crop_padding", "dataset.augmentation.horizontal_flip"}


def test_the_niid_bench_augmented_sweep_runs_the_four_methods_augmented_in_a_folder_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HDCFL_CIFAR10_PARQUET", str(tmp_path / "cifar10-jpeg"))
    folder = Path(__file__).parents[1] / "scenarios" / "niid-bench"
    plan = read_sweep_file(folder / "sweep-augmented.yaml", None)
    augmented, plain = expand(plan), expand(read_sweep_file(folder / "sweep.yaml", None))
    assert {(run.algorithm, run.seed) for run in augmented} == {(run.algorithm, run.seed) for run in plain}
    assert all(run.scenario.dataset.augmentation == AugmentationConfig(**NIID_BENCH) for run in augmented)
    assert not {run.run_dir for run in plain} & {run.run_dir for run in augmented}
    assert {setting_fingerprint(run.scenario) for run in plain}.isdisjoint(setting_fingerprint(run.scenario) for run in augmented)
    # 32x32 synthetic images in place of CIFAR-10: the padding fits, the preflight passes
    synthetic = ["dataset.name=synthetic", "dataset.image_size=32", "dataset.train_samples=1000", "dataset.test_samples=200"]
    prepared = prepare_run(load_scenario(folder / "cifar10-dir0.5.yaml", [*plan.overrides, *synthetic]))
    assert prepared.scenario.dataset.augmentation.crop_padding == 4


def test_the_batched_step_loop_augments_without_waiting_for_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The draws travel in the plan's one transfer; the crops and flips are device work only
    (benchmarks/host_syncs.py counts, on the CPU, what would stall a GPU)."""
    from benchmarks.host_syncs import HostSyncCounter

    seen: list[list[str]] = []
    loop = batched_training.run_steps

    def counted(groups, state, data, loss_log):  # type: ignore[no-untyped-def]
        with HostSyncCounter() as counter:
            loop(groups, state, data, loss_log)
        seen.append(counter.syncs)

    monkeypatch.setattr(batched_training, "run_steps", counted)
    for padding_mode in ("reflect", "zeros"):
        settings = AugmentationConfig(crop_padding=3, padding_mode=padding_mode, horizontal_flip=True)
        requests = [
            TrainRequest(
                model=small_model(), inputs=images, labels=labels, epochs=2, batch_size=8, optimizer_config=SGD,
                generator=torch.Generator().manual_seed(client), augmentation=training_augmentation(settings, 42, client, 1),
            )  # fmt: skip
            for client, (images, labels) in enumerate(client_data([20, 13, 8]))
        ]
        train_together(requests)
    assert seen == [[], []], f"the step loop waited for the device: {seen}"
