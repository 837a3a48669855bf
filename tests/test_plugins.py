"""Plugins: a module named with --plugin (or in the API) adds a method, a partition,
a data source and a transform beside the built-in ones; its sections validate with
its own model, `hdcfl-ray plugins` lists it, the manifest records it, and a scenario
file never imports anything."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hdcfl_ray import plugins
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.errors import ScenarioError
from tests.conftest import tiny_scenario

MODULE = "hdcfl_test_plugin_module"

SOURCE = textwrap.dedent(
    '''
    import numpy as np
    from pydantic import Field

    from hdcfl_ray.algorithms.fedavg import FedAvg
    from hdcfl_ray.contract import MethodSpec, Section
    from hdcfl_ray.contract.data import EncoderSpec, Images, PartitionSpec, SourceSpec, Split, TransformSpec


    class AvgParams(Section):
        note: int = Field(3, ge=1, description="a key of the plugin method")


    class Avg(FedAvg):
        name = "plugin_avg"


    METHOD = MethodSpec("plugin_avg", "FedAvg under another name", lambda params, run: Avg(), params=AvgParams)


    class HalvesParams(Section):
        first_share: float = Field(0.5, gt=0, lt=1, description="share of the images the first half of the clients hold")


    def halves(params, labels, num_clients, rng):
        order = rng.permutation(labels.shape[0])
        cut = int(params.first_share * labels.shape[0])
        first, second = order[:cut], order[cut:]
        half = num_clients // 2
        parts = list(np.array_split(first, half)) + list(np.array_split(second, num_clients - half))
        return Split(client_indices=tuple(parts), true_groups=tuple(int(c >= half) for c in range(num_clients)))


    PARTITION = PartitionSpec("halves", "two groups of different sizes", halves, params=HalvesParams)


    class BlocksParams(Section):
        per_class: int = Field(40, ge=2, description="images per class and split")


    def blocks(params, seed):
        rng = np.random.default_rng(seed)
        labels = np.repeat(np.arange(4), params.per_class)
        images = rng.integers(0, 40, size=(labels.shape[0], 8, 8, 1), dtype=np.uint8)
        for label in range(4):
            images[labels == label, (label // 2) * 4 : (label // 2) * 4 + 4, (label % 2) * 4 : (label % 2) * 4 + 4] += 200
        return Images(images, labels, images.copy(), labels.copy(), num_classes=4)


    SOURCE = SourceSpec("blocks", "a bright 4x4 block per class", blocks, params=BlocksParams, num_classes=4)


    def invert(batch, level, generator):
        return 255.0 - batch if level else batch


    TRANSFORM = TransformSpec("invert", "invert the pixels when the level is 1", invert)


    def pooled_conv(in_channels, feature_dim, width):
        import torch.nn as nn

        module = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, feature_dim)
        )
        module.feature_dim = feature_dim
        return module


    ENCODER = EncoderSpec("pooled_conv", "one convolution, pooling, a linear layer", pooled_conv)
    '''
)


def loaded_plugin(module: str, monkeypatch: pytest.MonkeyPatch):
    """Load `module` as a plugin for one test (a fixture's body): it is unloaded after,
    the registries and HDCFL_RAY_PLUGINS as they were."""
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    plugins.load_plugins([module])
    yield module
    os.environ.pop(plugins.ENV_VAR, None)
    plugins.clear_caches()
    sys.modules.pop(module, None)


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield from loaded_plugin(MODULE, monkeypatch)


def plugin_scenario(**sections) -> dict:
    base = {
        "dataset": {"name": "blocks", "blocks": {"per_class": 30}},
        "partition": {"kind": "halves", "num_clients": 4, "test_per_client": 10, "halves": {"first_share": 0.25}},
        "algorithm": {"name": "plugin_avg", "plugin_avg": {"note": 2}},
        "protocol": {"rounds": 2},
        "runtime": {"backend": "local", "num_cpus": 1},
        "model": {"encoder": "pooled_conv", "width": 8, "feature_dim": 16},
    }
    for key, value in sections.items():
        base[key] = {**base[key], **value}
    return tiny_scenario(**base)


def test_plugin_kinds_have_their_entry_point_groups() -> None:
    assert {kind: group for kind, (group, _, _) in plugins.KINDS.items()} == {
        "methods": "hdcfl_ray.methods",
        "partitions": "hdcfl_ray.partitions",
        "sources": "hdcfl_ray.sources",
        "transforms": "hdcfl_ray.transforms",
        "encoders": "hdcfl_ray.encoders",
    }


def test_a_scenario_naming_an_unloaded_plugin_is_refused_and_imports_nothing() -> None:
    before = set(sys.modules)
    for sections in (
        {"algorithm": {"name": MODULE}},
        {"partition": {"kind": "halves"}},
        {"dataset": {"name": "blocks"}},
        {"algorithm": {"name": "fedavg", MODULE: {"note": 1}}},
    ):
        with pytest.raises(ScenarioError):
            build_scenario(tiny_scenario(**sections))
    assert MODULE not in set(sys.modules) - before


def test_plugin_sections_validate_with_the_plugins_own_model(plugin_module: str) -> None:
    scenario = build_scenario(plugin_scenario())
    assert scenario.algorithm.plugin_avg.note == 2
    assert scenario.partition.halves.first_share == 0.25
    assert scenario.dataset.blocks.per_class == 30
    with pytest.raises(ScenarioError, match="plugin_avg.note"):
        build_scenario(plugin_scenario(algorithm={"name": "plugin_avg", "plugin_avg": {"note": 0}}))
    with pytest.raises(ScenarioError, match="halves.first_shar: Extra inputs are not permitted"):
        build_scenario(plugin_scenario(partition={"kind": "halves", "halves": {"first_shar": 0.3}}))
    with pytest.raises(ScenarioError, match="unknown key"):
        build_scenario(plugin_scenario(partition={"kind": "halves", "nosuch": {}}))
    shifted = build_scenario(tiny_scenario(partition={"kind": "feature_shift", "transform": "invert", "levels": [0, 1]}))
    assert shifted.partition.transform == "invert"


def test_a_plugin_run_records_its_package_in_the_manifest(plugin_module: str, tmp_path: Path) -> None:
    from hdcfl_ray.api import simulate

    run = simulate(plugin_scenario(), out=tmp_path / "run", progress=False)
    assert run.status == "completed"
    recorded = {(row["kind"], row["name"]): row for row in run.manifest["plugins"]}
    assert {
        ("method", "plugin_avg"), ("partition", "halves"), ("source", "blocks"), ("transform", "invert"), ("encoder", "pooled_conv")
    } <= set(recorded)
    assert recorded[("method", "plugin_avg")]["module"] == MODULE
    assert len(run.clients.to_pylist()) > 0


def test_the_cli_loads_a_named_module_and_lists_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cli import app

    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    try:
        result = CliRunner().invoke(app, ["--plugin", MODULE, "plugins"])
        assert result.exit_code == 0, result.output
        for name in ("plugin_avg", "halves", "blocks", "invert", "pooled_conv"):
            assert f"{name}  [plugin {MODULE}" in result.output
        assert "partition.halves.first_share = 0.5" in result.output
        scenario = tmp_path / "s.yaml"
        scenario.write_text(yaml.safe_dump(plugin_scenario()))
        result = CliRunner().invoke(app, ["--plugin", MODULE, "validate", str(scenario)])
        assert result.exit_code == 0, result.output
        missing = CliRunner().invoke(app, ["--plugin", "no_such_plugin_module", "plugins"])
        assert missing.exit_code == 2 and "no_such_plugin_module" in missing.output
    finally:
        os.environ.pop(plugins.ENV_VAR, None)
        plugins.clear_caches()
        sys.modules.pop(MODULE, None)


def test_a_plugin_may_not_take_a_built_in_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hdcfl_clash_plugin.py").write_text(
        "from hdcfl_ray.contract import MethodSpec\nfrom hdcfl_ray.algorithms.fedavg import FedAvg\n"
        "METHOD = MethodSpec('fedavg', 'again', lambda p, r: FedAvg())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    try:
        plugins.load_plugins(["hdcfl_clash_plugin"])
        from hdcfl_ray.algorithms.registry import method_specs

        with pytest.raises(ValueError, match="name of a built-in"):
            method_specs()
    finally:
        os.environ.pop(plugins.ENV_VAR, None)
        plugins.clear_caches()
        sys.modules.pop("hdcfl_clash_plugin", None)


def test_the_installed_packages_are_scanned_once_however_often_the_registries_are_read(plugin_module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which package a named module comes from is read off every installed package's file
    list; reading it for each registry of each scenario check made `validate --plugin`
    seconds slower. It is read once per process, and the manifest's origin is unchanged."""
    from importlib import metadata

    scans = []
    real = metadata.packages_distributions

    def counted() -> dict:
        scans.append(1)
        return real()

    monkeypatch.setattr(metadata, "packages_distributions", counted)
    plugins._distributions_by_top_level_module.cache_clear()
    for _ in range(3):
        plugins.clear_caches()  # as loading another plugin module does
        build_scenario(plugin_scenario())
    assert len(scans) == 1
    [(_, origin)] = [entry for name, entry in plugins.plugin_specs("methods").items() if name == "plugin_avg"]
    assert (origin.package, origin.module, origin.via) == (MODULE, MODULE, "module")
