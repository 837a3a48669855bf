"""FedCE (reconstructed as a soft EM mixture): the E-step, the mixing weights, the
soft-count server average, the output ensemble; on a planted two-domain mixture
it recovers the domains and beats Local; with one component it is FedAvg."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from torch import nn

from hdcfl_ray import seeding
from hdcfl_ray.maths.aggregate import weighted_average
from hdcfl_ray.contract import EvalResult, ModelParams, Upload, RunInfo
from hdcfl_ray.algorithms.fedavg import FedAvg
from hdcfl_ray.algorithms.fedce import (
    FedCE,
    aggregate_components,
    components_to_train,
    membership,
    mix_outputs,
    responsibilities,
    sample_weights,
    updated_mixing,
)
from hdcfl_ray.algorithms.local import LocalOnly
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.algorithms.fedce import FedCEParams
from hdcfl_ray.config.schema import OptimizerConfig, ProtocolConfig
from hdcfl_ray.models import FlatIndex, SplitModel, flatten_module
from hdcfl_ray.runtime.client.client_context import HostClientContext
from hdcfl_ray.training.scores import stats_from_probabilities
from hdcfl_ray.runtime.backends.local_host import in_process_run
from hdcfl_ray.training.local_training import client_generator
from hdcfl_ray.runtime.driver import prepare_run
from tests.conftest import PINNED_AUTO_KNOBS, tiny_scenario


def model(value: float, size: int = 4) -> ModelParams:
    return ModelParams(encoder=np.full(size, value, dtype=np.float32), head=np.full(2, value, dtype=np.float32))


def upload(client_id: int, mass: list[float], models: dict[str, ModelParams]) -> Upload:
    return Upload(client_id, 10, 0.0, 1, models=models, values={"mass": np.asarray(mass, dtype=np.float64)})


# ---- pure maths ----


def test_responsibilities_are_the_posterior_of_each_component_given_the_label():
    likelihoods = np.array([[0.8, 0.1, 0.5], [0.2, 0.6, 0.5]])
    mixing = np.array([0.25, 0.75])
    resp = responsibilities(np.log(likelihoods), mixing)
    joint = mixing[:, None] * likelihoods
    assert resp == pytest.approx(joint / joint.sum(axis=0))
    assert resp.sum(axis=0) == pytest.approx(np.ones(3))


def test_responsibilities_survive_samples_every_component_finds_unlikely():
    resp = responsibilities(np.array([[-2000.0, -1.0], [-2001.0, -900.0]]), np.array([0.5, 0.5]))
    assert np.isfinite(resp).all()
    assert resp[:, 0] == pytest.approx([1 / (1 + np.exp(-1.0)), 1 - 1 / (1 + np.exp(-1.0))])
    assert resp[:, 1] == pytest.approx([1.0, 0.0])


def test_a_temperature_softens_the_responsibilities_without_changing_their_order():
    log_likelihoods = np.log(np.array([[0.99, 0.3], [0.01, 0.7]]))
    plain = responsibilities(log_likelihoods, np.array([0.5, 0.5]))
    tempered = responsibilities(log_likelihoods / 4.0, np.array([0.5, 0.5]))
    assert plain[0, 0] == pytest.approx(0.99)
    # (0.99 / 0.01) ** (1 / 4) = 3.15: sample 0 still leans to component 0, far less surely
    assert tempered[0, 0] == pytest.approx(99**0.25 / (1 + 99**0.25))
    assert (np.argmax(tempered, axis=0) == np.argmax(plain, axis=0)).all()


def test_one_component_takes_every_sample_exactly():
    resp = responsibilities(np.array([[-3.0, -0.1, -50.0]]), np.array([1.0]))
    assert resp.tolist() == [[1.0, 1.0, 1.0]]


def test_mixing_weights_are_the_mean_responsibilities_floored_and_renormalised():
    resp = np.array([[1.0, 1.0, 0.5, 1.0], [0.0, 0.0, 0.5, 0.0]])
    assert updated_mixing(resp, floor=0.0) == pytest.approx([0.875, 0.125])
    floored = updated_mixing(np.array([[1.0, 1.0], [0.0, 0.0]]), floor=0.01)
    assert floored == pytest.approx(np.array([1.0, 0.01]) / 1.01)
    assert updated_mixing(np.zeros((3, 0)), floor=0.01) == pytest.approx(np.full(3, 1 / 3))


def test_membership_maximises_the_clients_likelihood_of_the_ensemble():
    rng = np.random.default_rng(0)
    likelihoods = rng.uniform(0.05, 1.0, size=(2, 40))
    pi = membership(np.log(likelihoods), np.array([0.5, 0.5]), floor=0.0)
    assert pi.sum() == pytest.approx(1.0)

    def log_likelihood(weight: float) -> float:
        return float(np.log(weight * likelihoods[0] + (1 - weight) * likelihoods[1]).sum())

    grid = np.linspace(0.0, 1.0, 2001)
    best = grid[np.argmax([log_likelihood(w) for w in grid])]
    assert pi[0] == pytest.approx(best, abs=1e-3)
    assert log_likelihood(pi[0]) >= max(log_likelihood(w) for w in grid) - 1e-9


def test_membership_goes_to_a_component_that_explains_every_sample_better():
    # component 0 gives each of the client's labels 1.2 times the probability component 1 gives:
    # small per-sample evidence, but on every sample. One E-step from uniform leaves pi near
    # 0.55 / 0.45; the maximum-likelihood membership is component 0 (down to the floor).
    log_likelihoods = np.log(np.array([[0.24] * 250, [0.20] * 250]))
    one_step = updated_mixing(responsibilities(log_likelihoods, np.array([0.5, 0.5])), 1e-4)
    assert one_step[0] == pytest.approx(0.24 / 0.44)
    pi = membership(log_likelihoods, np.array([0.5, 0.5]), floor=1e-4)
    assert pi[0] > 0.999 and pi[1] == pytest.approx(1e-4 / (1 + 1e-4), rel=1e-3)


def test_membership_keeps_the_stored_weights_where_the_components_explain_the_data_alike():
    same = np.log(np.full((3, 10), 0.3))
    stored = np.array([0.6, 0.3, 0.1])
    assert membership(same, stored, floor=1e-4) == pytest.approx(stored)
    assert membership(np.log(np.full((1, 5), 0.3)), np.array([1.0]), floor=1e-4).tolist() == [1.0]


def test_components_with_a_negligible_share_are_not_trained():
    assert components_to_train(np.array([60.0, 39.5, 0.5]), 100, min_share=0.01) == [0, 1]
    assert components_to_train(np.array([60.0, 39.5, 0.5]), 100, min_share=0.0) == [0, 1, 2]
    assert components_to_train(np.zeros(2), 0, min_share=0.01) == []


def test_training_weights_are_the_responsibilities_scaled_to_mean_one():
    resp = np.array([0.9, 0.1, 0.5, 0.5])
    weights = sample_weights(resp)
    assert weights == pytest.approx(resp / 0.5)
    assert weights.dtype == np.float32
    # a component holding share q of the client's data weighs no sample above 1 / q
    assert sample_weights(np.array([1.0, 0.0, 0.0, 0.0, 0.0])).max() == pytest.approx(5.0)
    # all-ones (one component): no weights, so training is the unweighted one
    assert sample_weights(np.ones(7)) is None


def test_server_component_is_the_soft_count_weighted_average_and_untrained_ones_stay():
    components = [model(0.0), model(5.0), model(9.0)]
    uploads = [
        upload(0, [3.0, 1.5, 0.01], {"cluster_0": model(1.0), "cluster_1": model(2.0)}),
        upload(1, [1.0, 0.0, 0.0], {"cluster_0": model(5.0)}),
    ]
    updated, masses = aggregate_components(components, uploads)
    assert updated[0].encoder == pytest.approx(np.full(4, (3 * 1.0 + 1 * 5.0) / 4))
    assert np.array_equal(updated[1].head, model(2.0).head)
    assert updated[2] is components[2]  # mass 0.01 was reported but the component was not trained
    assert masses == pytest.approx([4.0, 1.5, 0.0])


def test_output_ensemble_accuracy_matches_a_hand_computed_toy():
    first = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    second = torch.tensor([[0.1, 0.9], [0.1, 0.9], [0.3, 0.7]])
    labels = torch.tensor([0, 1, 1])
    mixed = mix_outputs([first, second], [0.25, 0.75])
    # by hand: [0.3, 0.7], [0.225, 0.775], [0.275, 0.725] -> predictions 1, 1, 1
    assert torch.allclose(mixed, torch.tensor([[0.3, 0.7], [0.225, 0.775], [0.275, 0.725]]))
    stats = stats_from_probabilities(mixed, labels)
    assert stats.accuracy == pytest.approx(2 / 3)
    assert stats.loss == pytest.approx(-(np.log(0.3) + np.log(0.775) + np.log(0.725)) / 3, rel=1e-5)


# ---- a planted two-domain mixture, driven through the hooks (no Ray, no runtime) ----

DIM, CLASSES, HIDDEN = 10, 4, 16
# share of domain A in each client's data: three pure A, three pure B, two mixtures
DOMAIN_A_SHARE = (1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.75, 0.25)


@dataclass(frozen=True)
class Split:
    inputs: torch.Tensor
    labels: torch.Tensor
    domain_a: np.ndarray


def planted_mixture(seed: int, train: int = 24, test: int = 200) -> list[tuple[Split, Split]]:
    """Gaussian classes shared by both domains; domain A labels class c as c, domain B
    as c + 1 (mod C). Inputs do not tell the domains apart, so one model cannot fit
    both: on pooled data it is right about half the time."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(CLASSES, DIM))

    def draw(size: int, share: float) -> Split:
        classes = rng.integers(0, CLASSES, size)
        inputs = means[classes] + rng.normal(size=(size, DIM))
        domain_a = rng.random(size) < share
        labels = np.where(domain_a, classes, (classes + 1) % CLASSES)
        return Split(torch.tensor(inputs, dtype=torch.float32), torch.tensor(labels), domain_a)

    return [(draw(train, share), draw(test, share)) for share in DOMAIN_A_SHARE]


def mlp(seed: int) -> SplitModel:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return SplitModel(encoder=nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU()), head=nn.Linear(HIDDEN, CLASSES))


def as_params(split_model: SplitModel) -> ModelParams:
    return ModelParams(flatten_module(split_model.encoder), flatten_module(split_model.head))


@dataclass
class HookRun:
    """Every client trains every round; the server and client hooks are called as the runtime calls them."""

    algorithm: Any
    clients: list[tuple[Split, Split]]
    seed: int
    state: Any = None
    client_states: list[Any] | None = None

    def __post_init__(self) -> None:
        self.model = mlp(self.seed)
        initial = as_params(self.model)
        independent = [as_params(mlp(seeding.model_init_seed(self.seed, i + 1))) for i in range(self.algorithm.independent_inits)]
        self.protocol = ProtocolConfig(local_epochs=2, batch_size=8, optimizer=OptimizerConfig(lr=0.05))
        self.indexes = (FlatIndex.of(self.model.encoder), FlatIndex.of(self.model.head))
        self.state = self.algorithm.init_server(initial, independent, len(self.clients))
        self.client_states = [self.algorithm.init_client(k, initial) for k in range(len(self.clients))]

    def context(self, client_id: int, round_index: int) -> HostClientContext:
        train, test = self.clients[client_id]
        return HostClientContext(
            client_id, round_index, self.seed, self.model, *self.indexes, self.protocol,
            client_generator(self.seed, client_id, round_index),
            lambda: (train.inputs, train.labels), lambda: (test.inputs, test.labels),
            lambda: (train.inputs.numpy(), train.labels.numpy()),
        )  # fmt: skip

    def round(self, round_index: int) -> list[Upload]:
        objects = self.algorithm.broadcast(self.state, round_index)
        uploads = []
        for k in range(len(self.clients)):
            task = self.algorithm.training_task(self.state, round_index, k)
            sent = {name: objects[name] for name in task.models}
            result, self.client_states[k] = self.algorithm.local_update(self.context(k, round_index), self.client_states[k], task, sent)
            uploads.append(result)
        self.algorithm.aggregate(self.state, round_index, uploads)
        return uploads

    def evaluate(self, round_index: int) -> list[EvalResult]:
        objects = self.algorithm.broadcast(self.state, round_index)
        results = []
        for k in range(len(self.clients)):
            task = self.algorithm.evaluation_task(self.state, round_index, k, True)
            results.append(self.algorithm.evaluate(self.context(k, round_index), self.client_states[k], task, objects, True))
        return results

    def run(self, rounds: int) -> list[EvalResult]:
        for t in range(1, rounds + 1):
            self.round(t)
        return self.evaluate(rounds)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models train fastest, and the same on any machine, on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fedce(**params: Any) -> FedCE:
    return FedCE(FedCEParams(**{**PINNED_AUTO_KNOBS["fedce"], **params}), RunInfo(seed=0, rounds=1))


def headline_accuracy(results: list[EvalResult]) -> np.ndarray:
    return np.array([r.references[r.headline].accuracy for r in results])


@pytest.mark.parametrize("seed", [0, 1])
def test_on_a_planted_two_domain_mixture_fedce_recovers_the_domains_and_beats_local(seed, one_thread):
    clients = planted_mixture(seed)
    run = HookRun(fedce(clusters=2), clients, seed)
    results = run.run(rounds=30)
    pi = np.array([r.memberships for r in results])
    # the pure clients of each domain agree on one component, and the domains on different ones
    component_a, component_b = int(np.argmax(pi[0])), int(np.argmax(pi[3]))
    assert component_a != component_b
    assert (pi[:3, component_a] > 0.9).all() and (pi[3:6, component_b] > 0.9).all()
    # a mixed client leans towards its majority domain
    assert pi[6, component_a] > 0.5 and pi[7, component_b] > 0.5
    # sample level: the trained components tell the domains apart; with labels and no
    # preference between them, the posterior credits most held-out samples of the mixed
    # clients to their own domain's component (crediting all to the majority domain would
    # score 0.75). (Under the client's own pi the majority wins more: pi is fitted to the
    # training samples, which both components have fitted, and ends near 1 / 0 here.)
    credited = []
    for k in (6, 7):
        test = clients[k][1]
        ctx = run.context(k, 30)
        log_likelihoods = -np.stack([ctx.per_sample_losses(m, data=(test.inputs, test.labels)) for m in run.state.components])
        resp = responsibilities(log_likelihoods.astype(np.float64), np.full(2, 0.5))
        credited.append(np.mean((resp[component_a] > 0.5) == test.domain_a))
    assert np.mean(credited) > 0.85

    fedce_accuracy = headline_accuracy(results)
    local_accuracy = headline_accuracy(HookRun(LocalOnly(), clients, seed).run(rounds=30))
    assert fedce_accuracy.mean() > local_accuracy.mean() + 0.03
    # one shared model cannot fit both label maps (FedAvg) and FedCE is far above it
    fedavg_accuracy = headline_accuracy(HookRun(FedAvg(), clients, seed).run(rounds=30))
    assert fedce_accuracy.mean() > fedavg_accuracy.mean() + 0.2


def test_one_component_is_fedavg_bit_for_bit_at_the_hook_level(one_thread):
    clients = planted_mixture(3)
    single, reference = HookRun(fedce(clusters=1), clients, 3), HookRun(FedAvg(), clients, 3)
    for t in (1, 2, 3):
        fedce_uploads, fedavg_uploads = single.round(t), reference.round(t)
        for mine, theirs in zip(fedce_uploads, fedavg_uploads):
            assert (mine.num_samples, mine.steps, mine.train_loss) == (theirs.num_samples, theirs.steps, theirs.train_loss)
            assert np.array_equal(mine.models["cluster_0"].encoder, theirs.models["model"].encoder)
        (component,) = single.state.components
        assert np.array_equal(component.encoder, reference.state.model.encoder)
        assert np.array_equal(component.head, reference.state.model.head)
    for mine, theirs in zip(single.evaluate(3), reference.evaluate(3)):
        assert mine.references["personalized"] == theirs.references["global"]
        assert mine.memberships == (1.0,)


def test_a_component_without_share_on_a_client_is_not_trained_there(one_thread):
    run = HookRun(fedce(clusters=2, min_share=0.5), planted_mixture(4), 4)
    for t in range(1, 6):
        uploads = run.round(t)
    for result in uploads:
        share = result.values["mass"] / result.num_samples
        assert set(result.models) == {f"cluster_{s}" for s in range(2) if share[s] >= 0.5}
        assert result.steps == len(result.models) * 2 * 3  # 2 epochs of 3 batches of 8 per trained component


def test_the_temperature_softens_the_training_weights_but_not_the_membership(one_thread):
    uploads = {}
    for temperature in (1.0, 4.0):
        run = HookRun(fedce(clusters=2, temperature=temperature), planted_mixture(5), 5)
        uploads[temperature] = run.round(1)
    for plain, tempered in zip(uploads[1.0], uploads[4.0]):
        # the same components and stored pi go in, so the same membership comes out
        assert np.array_equal(plain.values["mixing"], tempered.values["mixing"])
        # untempered, the soft counts are the membership's (pi is the fixed point of its E-step) ...
        assert plain.values["mass"] / plain.num_samples == pytest.approx(plain.values["mixing"], abs=1e-3)
        # ... tempered, the per-sample evidence counts a quarter as much in the training weights
        assert not np.allclose(tempered.values["mass"], plain.values["mass"])


# ---- whole rounds through the runtime (digits) ----


def fedce_run(protocol: dict | None = None, **params: Any):
    scenario = build_scenario(tiny_scenario(algorithm={"name": "fedce", "fedce": params}, protocol=protocol or {}))
    return in_process_run(prepare_run(scenario))


def test_one_component_gives_fedavgs_per_client_scores_on_a_real_run():
    def scores(algorithm: dict) -> list[list[tuple[int, float, float]]]:
        run = in_process_run(prepare_run(build_scenario(tiny_scenario(algorithm=algorithm, protocol={"rounds": 2}))))
        reports = run.run_all()
        return [[(e.client_id, e.result.references[e.result.headline].accuracy, e.result.references[e.result.headline].loss) for e in r.eval_reports] for r in reports]

    assert scores({"name": "fedce", "fedce": {"clusters": 1}}) == scores({"name": "fedavg"})


def test_upload_carries_soft_counts_and_the_server_averages_with_them():
    run = fedce_run(clusters=3)
    before = list(run.server.state.components)
    captured: list[Upload] = []
    original = run.algorithm.aggregate

    def recording(state, round_index, uploads):
        captured.extend(uploads)
        return original(state, round_index, uploads)

    run.algorithm.aggregate = recording  # type: ignore[method-assign]
    report = run.run_round(1)
    for u in captured:
        assert float(u.values["mass"].sum()) == pytest.approx(u.num_samples)
        assert float(u.values["mixing"].sum()) == pytest.approx(1.0)
    for s in range(3):
        name = f"cluster_{s}"
        contributing = sorted((u for u in captured if name in u.models), key=lambda u: u.client_id)
        if not contributing:
            assert run.server.state.components[s] is before[s]
            continue
        expected = weighted_average([u.models[name].encoder for u in contributing], [float(u.values["mass"][s]) for u in contributing])
        assert np.array_equal(run.server.state.components[s].encoder, expected)
    # component 0 starts from the shared initial model, the others from their own seeds
    assert any("component 0 starts from the shared initial model" in event for event in report.events)
    # the client keeps its pi for the next round
    for u in captured:
        assert np.array_equal(run.host.client_states[u.client_id].mixing, u.values["mixing"])


def test_evaluation_refreshes_pi_from_the_stored_one_and_scores_the_output_ensemble():
    run = fedce_run(clusters=2)
    report = run.run_round(1)
    components = run.server.state.components
    for evaluation in report.eval_reports[:3]:
        ctx = run.host.context(evaluation.client_id, 1)
        log_likelihoods = -np.stack([ctx.per_sample_losses(c) for c in components]).astype(np.float64)
        stored = run.host.client_states[evaluation.client_id].mixing
        pi = membership(log_likelihoods, stored if stored is not None else np.full(2, 0.5), 1e-4)  # untempered
        assert evaluation.result.memberships == pytest.approx(tuple(pi))
        assert evaluation.result.group == int(np.argmax(pi))
        mixed = sum(float(pi[s]) * ctx.probabilities(components[s]) for s in range(2))
        expected = stats_from_probabilities(mixed, ctx.test_data()[1], own_classes=ctx.own_classes())
        scored = evaluation.result.references["personalized"]
        assert scored.accuracy == pytest.approx(expected.accuracy)
        assert scored.accuracy_own_classes == pytest.approx(expected.accuracy_own_classes)
        assert scored.loss == pytest.approx(expected.loss, rel=1e-5)


def test_parameter_ensemble_scores_the_membership_weighted_mixture():
    run = fedce_run(clusters=2, ensemble="parameter")
    report = run.run_round(1)
    components = run.server.state.components
    evaluation = report.eval_reports[0]
    ctx = run.host.context(evaluation.client_id, 1)
    pi = np.asarray(evaluation.result.memberships)
    mixture = ModelParams(weighted_average([c.encoder for c in components], pi), weighted_average([c.head for c in components], pi))
    assert evaluation.result.references["personalized"] == ctx.score(mixture)
    assert any("parameter-space ensemble" in event for event in report.events)


def test_same_scenario_twice_gives_identical_components_and_scores():
    def outcome() -> tuple[list[np.ndarray], list[list[EvalResult]]]:
        run = fedce_run(clusters=2, protocol={"rounds": 2})
        reports = run.run_all()
        components = [np.concatenate([c.encoder, c.head]) for c in run.server.state.components]
        return components, [[e.result for e in r.eval_reports] for r in reports]

    first, second = outcome(), outcome()
    assert all(np.array_equal(a, b) for a, b in zip(first[0], second[0]))
    assert first[1] == second[1]
