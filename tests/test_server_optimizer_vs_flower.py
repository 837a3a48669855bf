"""The server optimisers against Flower's strategies (the optional extra: pip install -e
".[flower]"): the same client models, with the same sample counts, fed for several rounds
to Flower's FedAdam, FedYogi, FedAdagrad and FedAvgM `aggregate_fit` and to this project's
sample-weighted mean and server step give the same global model to 1e-6 relative (each
value within 1e-6 of itself or, for values near zero, of its layer's largest value).

What lines the two up (docs/baselines.md, "Server optimisers"):
* Flower weighs a client by its `num_examples`, as the methods here weigh by samples.
* Flower's FedAdam always corrects the bias, at t = server_round + 1: it is compared
  with `bias_correction: true` by calling it with server_round = t - 1.
* Flower's FedYogi and FedAdagrad (beta_1 fixed at 0) do not correct it: compared with
  `bias_correction: false`.
* Flower keeps its model in float64 between rounds (it is fed float64 copies of the
  float32 client models here), this project in float32: the difference is float32 rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

flwr = pytest.importorskip("flwr", reason='the Flower cross-check needs the extra: pip install -e ".[flower]"')

from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays  # noqa: E402
from flwr.server.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi  # noqa: E402

from hdcfl_ray.contract import ModelParams, ServerOptimizerConfig  # noqa: E402
from hdcfl_ray.maths.aggregate import weighted_average_model  # noqa: E402
from hdcfl_ray.maths.server_optimizer import Moments, server_step  # noqa: E402

ROUNDS = 4
CLIENTS = 5
SHAPES = {"encoder": 300, "head": 40}


def flower_strategy(kind: str, initial: list[np.ndarray]) -> Any:
    parameters = ndarrays_to_parameters(initial)
    common = {"initial_parameters": parameters, "min_fit_clients": 1, "min_available_clients": 1}
    if kind == "adam":
        return FedAdam(eta=0.05, beta_1=0.9, beta_2=0.99, tau=1e-3, **common)
    if kind == "yogi":
        return FedYogi(eta=0.02, beta_1=0.8, beta_2=0.95, tau=1e-2, **common)
    if kind == "adagrad":
        return FedAdagrad(eta=0.1, tau=1e-3, **common)
    return FedAvgM(server_learning_rate=0.7, server_momentum=0.9, **common)


# the same rule in this project's terms, and the round number Flower is called with at step t
OURS: dict[str, tuple[ServerOptimizerConfig, Any]] = {
    "adam": (ServerOptimizerConfig(name="adam", lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3, bias_correction=True), lambda t: t - 1),
    "yogi": (ServerOptimizerConfig(name="yogi", lr=0.02, beta1=0.8, beta2=0.95, tau=1e-2), lambda t: t),
    "adagrad": (ServerOptimizerConfig(name="adagrad", lr=0.1, beta1=0.0, tau=1e-3), lambda t: t),
    "avgm": (ServerOptimizerConfig(name="avgm", lr=0.7, momentum=0.9), lambda t: t),
}


def fit_result(model: ModelParams, samples: int) -> tuple[None, FitRes]:
    arrays = [model.encoder.astype(np.float64), model.head.astype(np.float64)]
    return None, FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters(arrays), num_examples=samples, metrics={})


@pytest.mark.parametrize("kind", sorted(OURS))
def test_the_server_step_gives_flowers_global_model(kind: str) -> None:
    rng = np.random.default_rng(11)
    model = ModelParams(*(rng.normal(size=size).astype(np.float32) for size in SHAPES.values()))
    strategy = flower_strategy(kind, [model.encoder.astype(np.float64), model.head.astype(np.float64)])
    config, flower_round = OURS[kind]
    moments: dict[str, Moments] = {}
    for t in range(1, ROUNDS + 1):
        # each client's trained model: the current one moved by its own drift and noise
        clients = [
            ModelParams(*((part + rng.normal(loc=0.05 * k, scale=0.2, size=part.shape)).astype(np.float32) for part in (model.encoder, model.head)))
            for k in range(CLIENTS)
        ]
        samples = [int(n) for n in rng.integers(10, 200, size=CLIENTS)]
        parameters, _ = strategy.aggregate_fit(flower_round(t), [fit_result(c, n) for c, n in zip(clients, samples)], [])
        flower_encoder, flower_head = parameters_to_ndarrays(parameters)
        mean = weighted_average_model(clients, lambda client: client, samples)
        model = server_step(config, moments, "global", model, mean)
        for ours, theirs in ((model.encoder, flower_encoder), (model.head, flower_head)):
            np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6 * float(np.abs(theirs).max()))
        assert moments["global/encoder"].steps == t
