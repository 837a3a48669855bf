"""The paper's scenarios (scenarios/paper) and their CPU versions (scenarios/cpu):
every file validates and names the expected data, partition and encoder; each
paper scenario runs one HDC-FL round, refresh included, with its real encoder on
a small synthetic stand-in for CIFAR; the sweep files expand into their grids;
and the README's weight-renaming snippet fits the encoders."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from hdcfl_ray.algorithms.registry import method_names
from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.models.mobilenet import MobileNetV2Cifar
from hdcfl_ray.models.pretrained import load_pretrained_encoder
from hdcfl_ray.models.resnet_cifar import ResNet18Cifar
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.runtime.driver import prepare_run
from hdcfl_ray.sweeps.grid import expand, read_sweep_file, resolve_algorithms

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "scenarios" / "paper"
CPU = REPO / "scenarios" / "cpu"
PAPER_SEEDS = (42, 123, 2026)

# file stem -> (dataset, encoder, partition kind, k or alpha)
PAPER_SETTINGS: dict[str, tuple[str, str, str, float | None]] = {
    "c10-ls2": ("cifar10", "resnet18_cifar", "label_subset", 2),
    "c10-ls3": ("cifar10", "resnet18_cifar", "label_subset", 3),
    "c10-rot": ("cifar10", "resnet18_cifar", "rotation", None),
    "c100-a0.07": ("cifar100", "resnet18_cifar", "dirichlet", 0.07),
    "c100-a0.3": ("cifar100", "resnet18_cifar", "dirichlet", 0.3),
    "c100-ls2": ("cifar100", "resnet18_cifar", "label_subset", 2),
    "c100-ls3": ("cifar100", "resnet18_cifar", "label_subset", 3),
    "c100-rot": ("cifar100", "resnet18_cifar", "rotation", None),
    "m-c100-ls3": ("cifar100", "mobilenet_v2", "label_subset", 3),
    "m-c10-a0.07": ("cifar10", "mobilenet_v2", "dirichlet", 0.07),
    "m-c10-ls3": ("cifar10", "mobilenet_v2", "label_subset", 3),
}
ABLATION = "c10-rot-no-pretrain"
CPU_SETTINGS: dict[str, tuple[str, float | None]] = {
    "cpu-c10-rot": ("rotation", None),
    "cpu-c10-ls3": ("label_subset", 3),
    "cpu-c10-ls2": ("label_subset", 2),
    "cpu-c10-a0.07": ("dirichlet", 0.07),
}
DATA_VARIABLES = {"cifar10": "HDCFL_CIFAR10", "cifar100": "HDCFL_CIFAR100"}
WEIGHT_VARIABLES = {"resnet18_cifar": "HDCFL_RESNET18_IMAGENET", "mobilenet_v2": "HDCFL_MOBILENETV2_IMAGENET"}
ENCODER_CLASSES = {"resnet18_cifar": ResNet18Cifar, "mobilenet_v2": MobileNetV2Cifar}
NUM_CLASSES = {"cifar10": 10, "cifar100": 100}


def scenario_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("*.yaml") if not path.name.startswith("sweep"))


def paper_setting(path: Path) -> tuple[str, str, str, float | None]:
    return PAPER_SETTINGS["c10-rot" if path.stem == ABLATION else path.stem]


@pytest.fixture
def data_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Every environment variable the scenarios read, pointed into tmp_path."""
    values = {
        "HDCFL_CIFAR10": str(tmp_path / "cifar10"),
        "HDCFL_CIFAR100": str(tmp_path / "cifar100"),
        "HDCFL_CIFAR10_PARQUET": str(tmp_path / "cifar10-jpeg"),
        "HDCFL_RESNET18_IMAGENET": str(tmp_path / "resnet18-imagenet-encoder.pt"),
        "HDCFL_MOBILENETV2_IMAGENET": str(tmp_path / "mobilenet_v2-imagenet-encoder.pt"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


# --- (a) every scenario validates and says what it should ------------------------------


def test_the_folders_hold_exactly_the_expected_scenarios() -> None:
    assert {path.stem for path in scenario_files(PAPER)} == set(PAPER_SETTINGS) | {ABLATION}
    assert {path.stem for path in scenario_files(CPU)} == set(CPU_SETTINGS)


@pytest.mark.parametrize("path", scenario_files(PAPER), ids=lambda path: path.stem)
def test_paper_scenario_validates_with_its_data_partition_and_encoder(path: Path, data_variables: dict[str, str]) -> None:
    dataset, encoder, kind, parameter = paper_setting(path)
    scenario = load_scenario(path)
    assert "." not in scenario.name and scenario.name.startswith("paper-")
    assert scenario.dataset.name == dataset and scenario.dataset.path == data_variables[DATA_VARIABLES[dataset]]
    assert scenario.model.encoder == encoder
    expected_weights = None if path.stem == ABLATION else data_variables[WEIGHT_VARIABLES[encoder]]
    assert scenario.model.pretrained == expected_weights
    assert_partition(scenario, kind, parameter)
    assert scenario.partition.num_clients == 20
    hdcfl = scenario.algorithm.hdcfl
    assert (scenario.algorithm.name, hdcfl.descriptor, hdcfl.rank, hdcfl.groups, hdcfl.membership, hdcfl.mix) == (
        "hdcfl", "lowrank", 8, 4, "soft", 1.0,
    )
    assert scenario.runtime.num_gpus_per_actor == 1  # one host per GPU: the round batched whole (tests/test_gpu_plan.py)
    assert scenario.output.save_refresh_cache is (path.stem == ABLATION)


def test_the_ablation_differs_from_c10_rot_only_by_its_initialisation(data_variables: dict[str, str]) -> None:
    main, ablation = (load_scenario(PAPER / f"{stem}.yaml").model_dump() for stem in ("c10-rot", ABLATION))
    for section in (main, ablation):
        section.pop("name")
        section["model"].pop("pretrained")
        section["output"].pop("save_refresh_cache")
    assert main == ablation


@pytest.mark.parametrize("path", scenario_files(CPU), ids=lambda path: path.stem)
def test_cpu_scenario_validates_at_cpu_scale(path: Path, data_variables: dict[str, str]) -> None:
    kind, parameter = CPU_SETTINGS[path.stem]
    scenario = load_scenario(path)
    assert "." not in scenario.name and scenario.name == path.stem.replace(".", "_")
    dataset = scenario.dataset
    assert (dataset.name, dataset.path) == ("parquet_images", data_variables["HDCFL_CIFAR10_PARQUET"])
    assert (dataset.max_train_samples, dataset.max_test_samples) == (5000, 2500)
    model = scenario.model
    assert (model.encoder, model.width, model.feature_dim, model.pretrained) == ("small_cnn", 16, 64, None)
    assert_partition(scenario, kind, parameter)
    assert (scenario.partition.num_clients, scenario.partition.test_per_client) == (20, 125)
    protocol = scenario.protocol
    assert (protocol.rounds, protocol.participation, protocol.local_epochs, protocol.batch_size) == (30, 0.5, 1, 32)
    assert protocol.optimizer.model_dump() == {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5.0e-4}
    hdcfl = scenario.algorithm.hdcfl
    assert (hdcfl.descriptor, hdcfl.groups, hdcfl.membership, hdcfl.refresh_every) == ("lowrank", 4, "soft", 5)
    assert hdcfl.activation_round is None  # the schema's default: 20% of the rounds
    assert scenario.runtime.num_gpus_per_actor == 0


def assert_partition(scenario: Scenario, kind: str, parameter: float | None) -> None:
    partition = scenario.partition
    assert partition.kind == kind
    if kind == "label_subset":
        assert partition.k == parameter
    elif kind == "dirichlet":
        assert partition.alpha == parameter
    else:
        assert partition.angles == (0.0, 90.0, 180.0, 270.0)


def test_scenario_names_are_unique(data_variables: dict[str, str]) -> None:
    names = [load_scenario(path).name for path in scenario_files(PAPER) + scenario_files(CPU)]
    assert len(set(names)) == len(names)


# --- the README's weight renaming ---------------------------------------------------------


def readme_weight_functions() -> dict[str, object]:
    """The README's python snippet, run without its __main__ part (which downloads)."""
    text = (PAPER / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    assert snippet is not None, "scenarios/paper/README.md lost its python snippet"
    namespace: dict[str, object] = {"__name__": "readme_snippet"}
    exec(compile(snippet.group(1), "scenarios/paper/README.md", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def weight_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """torchvision's (randomly initialised) ResNet-18 and MobileNetV2 renamed by the
    README's functions: the files a user makes, without the ImageNet download."""
    from torchvision.models import mobilenet_v2, resnet18

    functions = readme_weight_functions()
    folder = tmp_path_factory.mktemp("weights")
    files = {"resnet18_cifar": folder / "resnet18.pt", "mobilenet_v2": folder / "mobilenet_v2.pt"}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        torch.save(functions["resnet18_cifar_state"](resnet18(weights=None).state_dict()), files["resnet18_cifar"])
        torch.save(functions["mobilenet_v2_cifar_state"](mobilenet_v2(weights=None).state_dict()), files["mobilenet_v2"])
    return files


def test_readme_snippet_fills_the_resnet18_encoder_except_its_stem_conv(weight_files: dict[str, Path]) -> None:
    encoder = ResNet18Cifar()
    report = load_pretrained_encoder(encoder, str(weight_files["resnet18_cifar"]))
    assert report.missing_keys == ("stem.0.weight",) and report.unexpected_keys == ()
    saved = torch.load(weight_files["resnet18_cifar"], weights_only=True)
    assert torch.equal(encoder.state_dict()["stages.1.0.shortcut.1.running_var"], saved["stages.1.0.shortcut.1.running_var"])


def test_readme_snippet_fills_the_whole_mobilenet_v2_encoder(weight_files: dict[str, Path]) -> None:
    report = load_pretrained_encoder(MobileNetV2Cifar(), str(weight_files["mobilenet_v2"]))
    assert report.missing_keys == () and report.unexpected_keys == ()


# --- (b) one HDC-FL round with the real encoder on a synthetic stand-in ---------------------

SMOKE_CLIENTS = 4


def smoke_sizes(dataset: str, kind: str) -> tuple[int, int]:
    """(train, test) images, kept small: ResNet-18 trains at about 20 images/s on two
    CPU cores. Dirichlet shares cut each class by floor(cumulative share x count), so a
    class of one sample always lands on the last client with a share: CIFAR-100 gets two per class there.
    NIID-Bench's #C=k draws each client's extra classes on its own, so a class can have
    every client as a holder: CIFAR-100 label subsets get one image per client and class
    (only the held classes are trained on, at most clients x k x 4 images)."""
    if dataset == "cifar10":
        return 80, 40
    return {"dirichlet": (200, 100), "label_subset": (100 * SMOKE_CLIENTS, 100)}.get(kind, (100, 100))


def smoke_overrides(dataset: str, kind: str) -> list[str]:
    train_samples, test_samples = smoke_sizes(dataset, kind)
    return [
        "dataset.name=synthetic",
        f"dataset.num_classes={NUM_CLASSES[dataset]}",
        "dataset.image_size=32",
        "dataset.channels=3",
        f"dataset.train_samples={train_samples}",
        f"dataset.test_samples={test_samples}",
        f"partition.num_clients={SMOKE_CLIENTS}",
        "partition.min_samples=2",
        "partition.test_per_client=10",
        "protocol.rounds=1",
        "protocol.participation=1.0",  # all four heads reach the refresh
        "algorithm.name=hdcfl",
        "algorithm.hdcfl.activation_round=1",
        "runtime.num_gpus_per_actor=0",  # runs in this process; validation refuses GPU shares where there is no GPU
    ]


@pytest.mark.slow  # about 5 s a scenario on two CPU cores, 60 s in all
@pytest.mark.parametrize("path", scenario_files(PAPER), ids=lambda path: path.stem)
def test_paper_scenario_runs_an_hdcfl_round_with_its_real_encoder(
    path: Path, data_variables: dict[str, str], weight_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset, encoder, kind, parameter = paper_setting(path)
    for encoder_name, variable in WEIGHT_VARIABLES.items():
        monkeypatch.setenv(variable, str(weight_files[encoder_name]))
    scenario = load_scenario(path, smoke_overrides(dataset, kind))
    assert scenario.model.encoder == encoder and scenario.partition.kind == kind
    prepared = prepare_run(scenario)
    assert_partition_kind_kept(prepared, kind, parameter)
    run = in_process_run(prepared)
    assert isinstance(run.host.model.encoder, ENCODER_CLASSES[encoder])
    assert run.host.model.head.out_features == NUM_CLASSES[dataset]

    report = run.run_round(1)

    assert [upload.client_id for upload in report.uploads if upload.accepted] == list(range(SMOKE_CLIENTS))
    refresh = report.notes.refresh
    assert refresh is not None and refresh.round_index == 1
    assert set(refresh.group_labels) == set(range(SMOKE_CLIENTS)) and 1 <= refresh.num_groups <= 4
    assert 1 <= refresh.effective_rank <= SMOKE_CLIENTS - 1 and refresh.descriptor_kind == "lowrank"
    for membership in refresh.memberships.values():
        assert math.isclose(float(np.sum(membership)), 1.0, rel_tol=1e-6)
    assert sorted(evaluation.client_id for evaluation in report.eval_reports) == list(range(SMOKE_CLIENTS))
    for evaluation in report.eval_reports:
        assert evaluation.result.headline == "personalized"
        stats = evaluation.result.references["personalized"]
        assert 0.0 <= stats.accuracy <= 1.0 and math.isfinite(stats.loss)


def assert_partition_kind_kept(prepared, kind: str, parameter: float | None) -> None:
    clients = prepared.partition.clients
    train_labels = prepared.dataset.train_labels
    if kind == "rotation":
        assert [client.rotation_degrees for client in clients] == [0.0, 90.0, 180.0, 270.0]
    elif kind == "label_subset":
        assert all(np.unique(train_labels[client.train_indices]).size == parameter for client in clients)
    else:
        assert all(client.train_indices.size >= 2 for client in clients)


# --- (c) the sweep files ----------------------------------------------------------------


def test_paper_sweep_runs_every_setting_method_and_seed(data_variables: dict[str, str]) -> None:
    plan = read_sweep_file(PAPER / "sweep-all.yaml", None)
    assert plan.out == REPO / "runs" / "paper"
    assert {path.stem for path in plan.scenario_files} == set(PAPER_SETTINGS)
    assert resolve_algorithms(plan.algorithms) == method_names() and plan.seeds == PAPER_SEEDS
    runs = expand(plan)
    assert len(runs) == 11 * len(method_names()) * 3 and len({run.key for run in runs}) == len(runs)
    pacfl = next(run.scenario.algorithm.pacfl for run in runs if run.algorithm == "pacfl")
    # table 5's bases; no threshold is calibrated at this size, so each run chooses it (auto)
    assert (pacfl.basis, pacfl.threshold, pacfl.threshold_unit) == ("per_class", "auto", "radians")


def test_cpu_sweep_runs_rotation_and_ls3_with_a_calibrated_pacfl(data_variables: dict[str, str]) -> None:
    plan = read_sweep_file(CPU / "sweep-reproduction.yaml", None)
    assert plan.out == REPO / "runs" / "cpu-reproduction"
    assert [path.name for path in plan.scenario_files] == ["cpu-c10-rot.yaml", "cpu-c10-ls3.yaml"]
    assert resolve_algorithms(plan.algorithms) == method_names() and plan.seeds == PAPER_SEEDS
    runs = expand(plan)
    assert len(runs) == 2 * len(method_names()) * 3
    assert {(run.setting, run.algorithm, run.seed) for run in runs} == {
        (setting, algorithm, seed)
        for setting in ("cpu-c10-rot", "cpu-c10-ls3")
        for algorithm in method_names()
        for seed in PAPER_SEEDS
    }
    for run in runs:
        assert run.scenario.algorithm.name == run.algorithm and run.scenario.seed == run.seed
        pacfl = run.scenario.algorithm.pacfl
        # each setting's own value, chosen on held-out training images (docs/calibration.md)
        threshold = {"cpu-c10-rot": 2.5, "cpu-c10-ls3": 1.5}[run.setting]
        assert (pacfl.basis, pacfl.threshold, pacfl.threshold_unit) == ("whole", threshold, "degrees")


def test_gain_grid_cells_expand_to_valid_hdcfl_sweeps(data_variables: dict[str, str], tmp_path: Path) -> None:
    """scenarios/cpu/gain-grid.sh: every `cell SCENARIO NAME --set ...` line is a valid sweep that
    changes what it says, and no name has a dot (the report would read it as an ablation variant)."""
    import yaml

    from hdcfl_ray.sweeps.grid import SweepPlan

    cells = re.findall(r"^cell (\S+) (\S+) ([^#\n]*)", (CPU / "gain-grid.sh").read_text(), re.MULTILINE)
    assert len(cells) >= 5 and len({name for _, name, _ in cells}) == len(cells)
    for scenario_name, name, rest in cells:
        overrides = re.findall(r"--set (\S+)", rest)
        assert overrides and "." not in name
        plan = SweepPlan((CPU / f"{scenario_name}.yaml",), ("hdcfl",), PAPER_SEEDS, (f"name={name}", *overrides), tmp_path)
        runs = expand(plan)
        assert [(run.setting, run.seed) for run in runs] == [(name, seed) for seed in PAPER_SEEDS]
        settings = runs[0].scenario.model_dump()
        for override in overrides:
            key, value = override.split("=", 1)
            node = settings
            for part in key.split("."):
                node = node[part]
            assert node == yaml.safe_load(value), override



def test_pretrained_paper_size_sweep_runs_both_settings_at_the_papers_seeds(data_variables: dict[str, str]) -> None:
    """scenarios/cpu/paper-size/sweep-pretrained.yaml: both pretrained forms, one host per run."""
    plan = read_sweep_file(CPU / "paper-size" / "sweep-pretrained.yaml", None)
    assert plan.out == REPO / "runs" / "paper-size-pretrained" and plan.seeds == PAPER_SEEDS
    runs = expand(plan)
    assert {(run.setting, run.algorithm, run.seed) for run in runs} == {
        (setting, algorithm, seed)
        for setting in ("paper-size-c10-rot-pretrained", "paper-size-c10-ls3-pretrained")
        for algorithm in ("hdcfl", "fedbabu", "ifca", "pacfl")
        for seed in PAPER_SEEDS
    }
    assert all(run.scenario.runtime.clients_per_actor == 20 for run in runs)


PAPER_SIZE = CPU / "paper-size"


@pytest.mark.parametrize("path", scenario_files(PAPER_SIZE), ids=lambda path: path.stem)
def test_paper_size_cpu_scenarios_give_each_client_the_papers_share(path: Path, data_variables: dict[str, str]) -> None:
    """20 clients over the whole training split (2500 each), or over what the pretraining pool leaves (2000)."""
    scenario = load_scenario(path)
    assert scenario.name == path.stem and scenario.partition.num_clients == 20
    dataset = scenario.dataset
    assert (dataset.name, dataset.path, dataset.max_train_samples, dataset.max_test_samples) == (
        "parquet_images", data_variables["HDCFL_CIFAR10_PARQUET"], None, None
    )
    assert scenario.partition.test_per_client == 500 and scenario.runtime.channels_last
    if path.stem.endswith("-pretrained"):
        assert (dataset.pretrain_pool, dataset.pretrain_pool_seed, scenario.model.pretrained) == (0.2, 0, "weights/c10-pool.pt")
    else:
        assert dataset.pretrain_pool is None and scenario.model.pretrained is None
