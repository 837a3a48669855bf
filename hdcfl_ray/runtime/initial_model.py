"""The seed-derived starting point: one global encoder and the head every client starts from."""

from __future__ import annotations

from hdcfl_ray import seeding
from hdcfl_ray.contract import ModelParams
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.models import build_split_model, flatten_module


def initial_parameters(scenario: Scenario, dataset: ImageDataset) -> ModelParams:
    model = build_split_model(scenario.model, in_channels=dataset.channels, num_classes=dataset.num_classes, seed=scenario.seed)
    return ModelParams(encoder=flatten_module(model.encoder), head=flatten_module(model.head))


def independent_initialisations(scenario: Scenario, dataset: ImageDataset, count: int) -> list[ModelParams]:
    """`count` further models, each from its own seed (distinct heads even when the
    encoder comes from one pretrained file, which breaks cluster symmetry)."""
    models = []
    for index in range(count):
        model = build_split_model(
            scenario.model, in_channels=dataset.channels, num_classes=dataset.num_classes, seed=seeding.model_init_seed(scenario.seed, index + 1)
        )
        models.append(ModelParams(encoder=flatten_module(model.encoder), head=flatten_module(model.head)))
    return models
