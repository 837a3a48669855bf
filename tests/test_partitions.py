"""Partitioners: who trains on what, what is planted, and each client's test set."""

from __future__ import annotations

import hashlib
import re
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdcfl_ray.config.loading import apply_overrides, build_scenario
from hdcfl_ray.config.schema import PartitionConfig
from hdcfl_ray.data.partitions import (
    TrainSplit,
    build_partition,
    check_partition_against_dataset,
    dirichlet_partition,
    iid_partition,
    label_subset_partition,
    rotation_partition,
)
from hdcfl_ray.data.partitions.checks import test_proportion_notices as proportion_notices
from hdcfl_ray.data.partitions.test_split import allocate_test_counts
from hdcfl_ray.errors import ScenarioError

NUM_CLASSES = 10


def balanced_labels(per_class: int, num_classes: int = NUM_CLASSES, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class)).astype(np.int64)


def every_partitioner(labels: np.ndarray, num_clients: int, seed: int) -> dict[str, TrainSplit]:
    rng = lambda: np.random.default_rng(seed)  # noqa: E731 - a fresh generator per partitioner
    return {
        "iid": iid_partition(labels, num_clients, rng()),
        "label_subset": label_subset_partition(labels, num_clients, rng(), k=3),
        "dirichlet": dirichlet_partition(labels, num_clients, rng(), alpha=0.5, min_samples=5),
        "rotation": rotation_partition(labels, num_clients, rng(), angles=(0.0, 90.0, 180.0)),
    }


def label_entropy(labels: np.ndarray) -> float:
    proportions = np.bincount(labels, minlength=NUM_CLASSES) / labels.shape[0]
    proportions = proportions[proportions > 0]
    return float(-(proportions * np.log(proportions)).sum())


@pytest.mark.parametrize("num_clients", [4, 7, 20, 50])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_training_sample_goes_to_exactly_one_client(num_clients: int, seed: int) -> None:
    # label_subset: every sample of a class some client holds (with few clients some classes have no holder)
    labels = balanced_labels(60)
    for kind, split in every_partitioner(labels, num_clients, seed).items():
        assert split.num_clients == num_clients, kind
        combined = np.concatenate(split.client_indices)
        expected = np.arange(labels.shape[0])
        if kind == "label_subset":
            expected = np.flatnonzero(np.isin(labels, np.unique(labels[combined])))
        assert np.array_equal(np.sort(combined), expected), kind
        for indices in split.client_indices:
            assert indices.dtype == np.int64 and np.all(np.diff(indices) > 0), kind


def test_label_subset_leaves_out_only_classes_no_client_holds() -> None:
    # One client with k = 3 cannot hold all 10 classes: the other 7 classes go unused, nothing repeats.
    labels = balanced_labels(60)
    (indices,) = label_subset_partition(labels, 1, np.random.default_rng(0), k=3).client_indices
    held = np.unique(labels[indices])
    assert held.shape[0] == 3
    assert np.array_equal(indices, np.flatnonzero(np.isin(labels, held)))


def test_iid_shares_differ_by_at_most_one_sample() -> None:
    sizes = [part.shape[0] for part in iid_partition(balanced_labels(61), 7, np.random.default_rng(0)).client_indices]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 610


def held_classes(labels: np.ndarray, split: TrainSplit) -> list[tuple[int, ...]]:
    return [tuple(np.unique(labels[indices]).tolist()) for indices in split.client_indices]


def split_digest(split: TrainSplit) -> str:
    """A fingerprint of who holds which sample, and of the planted groups."""
    digest = hashlib.sha256()
    for indices in split.client_indices:
        digest.update(np.asarray(indices, dtype=np.int64).tobytes() + b"|")
    digest.update(repr(split.true_groups).encode())
    return digest.hexdigest()[:16]


# --- label_subset: NIID-Bench's #C=k (default) and the window form ----------------------


@pytest.mark.parametrize("seed", range(10))
def test_label_subset_by_default_gives_20_clients_mostly_different_label_sets(seed: int) -> None:
    # NIID-Bench's #C=k draws each client's k - 1 extra classes on its own: with k = 3, C = 10 and
    # 20 clients, 16 to 20 distinct sets over seeds 0..9 (the window form: always exactly 10).
    labels = balanced_labels(50)
    split = label_subset_partition(labels, 20, np.random.default_rng(seed), k=3)
    assert len(set(held_classes(labels, split))) >= 15
    assert split.true_groups is not None and len(set(split.true_groups)) == len(set(held_classes(labels, split)))


@pytest.mark.parametrize("seed", range(10))
def test_label_subset_windows_give_10_label_sets_each_held_by_two_clients(seed: int) -> None:
    labels = balanced_labels(50)
    split = label_subset_partition(labels, 20, np.random.default_rng(seed), k=3, assignment="windows")
    sets = held_classes(labels, split)
    assert len(set(sets)) == 10
    assert all(sets.count(held) == 2 for held in sets)


@given(
    num_classes=st.integers(2, 12),
    num_clients=st.integers(1, 30),
    k_fraction=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=60, deadline=None)
def test_niid_bench_client_i_holds_class_i_mod_c_and_exactly_k_classes(
    num_classes: int, num_clients: int, k_fraction: float, seed: int
) -> None:
    k = 1 + round(k_fraction * (num_classes - 1))
    labels = balanced_labels(num_clients, num_classes=num_classes, seed=seed % 100)
    split = label_subset_partition(labels, num_clients, np.random.default_rng(seed), k=k)
    sets = held_classes(labels, split)
    for client, held in enumerate(sets):
        assert len(held) == k and client % num_classes in held
    # a class's samples are split evenly over its holders, and only held classes are used
    for label in range(num_classes):
        sizes = [int(np.sum(labels[indices] == label)) for indices in split.client_indices]
        holders = [size for size, held in zip(sizes, sets) if label in held]
        assert sum(sizes) == (num_clients if holders else 0)
        assert not holders or max(holders) - min(holders) <= 1


def test_niid_bench_extra_classes_are_uniform_over_the_other_classes() -> None:
    # client 0 always holds class 0; its 2 extra classes are each of the 9 others with chance 2/9
    labels = balanced_labels(20)
    counts = np.zeros(NUM_CLASSES)
    draws = 900
    for seed in range(draws):
        split = label_subset_partition(labels, 1, np.random.default_rng(seed), k=3)
        counts[list(held_classes(labels, split)[0])] += 1
    assert counts[0] == draws
    expected = draws * 2 / 9
    assert np.all(np.abs(counts[1:] - expected) < 4 * np.sqrt(expected))


def test_label_subset_windows_are_the_partition_of_the_earlier_tables() -> None:
    # Recorded with the window partitioner as it was when it was the only form: the same seed
    # gives the same clients, sample for sample, so `partition.label_assignment: windows`
    # reproduces the runs made before NIID-Bench's #C=k became the default.
    labels = balanced_labels(60)
    recorded = {0: "afb06fad63e1cb5d", 1: "ebe44fb7e027a2da", 42: "60bc92a15a53ea12"}
    for seed, digest in recorded.items():
        split = label_subset_partition(labels, 20, np.random.default_rng(seed), k=3, assignment="windows")
        assert split_digest(split) == digest, seed


@pytest.mark.parametrize("assignment", ["niid_bench", "windows"])
@pytest.mark.parametrize("k", [1, 2, 3, 10])
@pytest.mark.parametrize("num_clients", [4, 10, 23])
def test_label_subset_gives_exactly_k_classes_per_client(assignment: str, k: int, num_clients: int) -> None:
    labels = balanced_labels(50)
    split = label_subset_partition(labels, num_clients, np.random.default_rng(3), k=k, assignment=assignment)
    for indices in split.client_indices:
        assert np.unique(labels[indices]).shape[0] == k
    # every class is used once the clients can cover them: windows from k * clients >= C on,
    # NIID-Bench's #C=k from clients >= C on (client i holds class i mod C)
    covered = k * num_clients >= NUM_CLASSES if assignment == "windows" else num_clients >= NUM_CLASSES
    if covered:
        used = np.unique(np.concatenate([labels[indices] for indices in split.client_indices]))
        assert used.shape[0] == NUM_CLASSES


@pytest.mark.parametrize("assignment", ["niid_bench", "windows"])
def test_label_subset_groups_are_the_distinct_class_sets(assignment: str) -> None:
    labels = balanced_labels(50)
    split = label_subset_partition(labels, 20, np.random.default_rng(4), k=2, assignment=assignment)
    class_sets = [tuple(np.unique(labels[indices])) for indices in split.client_indices]
    assert split.true_groups is not None
    for first in range(20):
        for second in range(20):
            same_set = class_sets[first] == class_sets[second]
            assert same_set == (split.true_groups[first] == split.true_groups[second])
    assert sorted(set(split.true_groups)) == list(range(len(set(class_sets))))


def test_label_subset_refuses_a_class_with_fewer_samples_than_holders() -> None:
    # k = 1: client i holds class i mod 2, so clients 1 and 3 share class 1's only sample
    labels = np.array([0, 0, 0, 0, 1], dtype=np.int64)
    with pytest.raises(ValueError, match="class 1 has 1 training samples but 2 clients") as error:
        label_subset_partition(labels, 4, np.random.default_rng(0), k=1)
    for key in ("partition.num_clients", "partition.k", "dataset.max_train_samples"):
        assert key in str(error.value)


def test_label_subset_refuses_an_unknown_assignment_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"partition\.label_assignment: .*'nope' \(choose niid_bench or windows\)"):
        label_subset_partition(balanced_labels(5), 4, np.random.default_rng(0), k=2, assignment="nope")  # type: ignore[arg-type]


def minimal_scenario(partition: dict) -> dict:
    return {"name": "partition-keys", "algorithm": {"name": "fedavg"}, "partition": partition}


def test_partition_defaults_are_niid_bench_and_the_earlier_forms_are_one_override_away() -> None:
    default = build_scenario(minimal_scenario({"kind": "label_subset", "k": 3})).partition
    assert (default.label_assignment, default.dirichlet_balance) == ("niid_bench", True)
    raw = apply_overrides(
        minimal_scenario({"kind": "label_subset", "k": 3}),
        ["partition.label_assignment=windows", "partition.dirichlet_balance=false"],
    )
    earlier = build_scenario(raw).partition
    assert (earlier.label_assignment, earlier.dirichlet_balance) == ("windows", False)


def test_an_unknown_label_assignment_in_yaml_names_the_key_and_the_choices() -> None:
    with pytest.raises(ScenarioError) as error:
        build_scenario(minimal_scenario({"kind": "label_subset", "k": 3, "label_assignment": "window"}))
    for fragment in ("partition.label_assignment", "niid_bench", "windows"):
        assert fragment in str(error.value)


def test_build_partition_reads_the_form_from_the_config() -> None:
    train_labels, test_labels = balanced_labels(60), balanced_labels(10, seed=1)

    def build(**partition: object) -> list[int]:
        config = PartitionConfig(num_clients=20, **partition)
        return [client.num_train for client in build_partition(config, train_labels, test_labels, NUM_CLASSES, seed=3).clients]

    def label_sets(assignment: str) -> int:
        config = PartitionConfig(kind="label_subset", num_clients=20, k=3, label_assignment=assignment)
        groups = build_partition(config, train_labels, test_labels, NUM_CLASSES, seed=3).true_groups()
        assert groups is not None
        return len(set(groups.tolist()))

    assert label_sets("windows") == 10 and label_sets("niid_bench") >= 15
    balanced = build(kind="dirichlet", alpha=0.1, min_samples=5)
    unbalanced = build(kind="dirichlet", alpha=0.1, min_samples=5, dirichlet_balance=False)
    assert balanced != unbalanced
    assert max(balanced) < 600 // 20 + 60  # below N / num_clients + one class


def test_dirichlet_gets_more_skewed_as_alpha_falls() -> None:
    labels = balanced_labels(500)

    def mean_entropy(alpha: float) -> float:
        entropies = []
        for seed in range(4):
            split = dirichlet_partition(labels, 10, np.random.default_rng(seed), alpha=alpha, min_samples=1)
            entropies.extend(label_entropy(labels[indices]) for indices in split.client_indices)
        return float(np.mean(entropies))

    assert mean_entropy(0.05) < mean_entropy(1.0) < mean_entropy(100.0)
    assert mean_entropy(100.0) > 0.95 * np.log(NUM_CLASSES)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_dirichlet_gives_every_client_at_least_min_samples(seed: int) -> None:
    split = dirichlet_partition(balanced_labels(100), 20, np.random.default_rng(seed), alpha=0.3, min_samples=15)
    assert min(indices.shape[0] for indices in split.client_indices) >= 15
    assert split.true_groups is None


def test_dirichlet_says_what_to_relax_when_min_samples_cannot_be_met() -> None:
    with pytest.raises(ValueError, match=r"lower partition\.min_samples or raise partition\.alpha"):
        dirichlet_partition(balanced_labels(30), 10, np.random.default_rng(0), alpha=0.01, min_samples=25, max_draws=20)


# --- dirichlet: NIID-Bench's balancing step (default) and the unbalanced form -----------


def class_counts_per_client(labels: np.ndarray, split: TrainSplit, num_classes: int) -> np.ndarray:
    """counts[client, class]."""
    return np.stack([np.bincount(labels[indices], minlength=num_classes) for indices in split.client_indices])


@given(
    num_classes=st.integers(1, 12),
    num_clients=st.integers(2, 25),
    alpha=st.sampled_from([0.05, 0.1, 0.3, 1.0, 10.0]),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=60, deadline=None)
def test_balanced_dirichlet_gives_no_class_to_a_client_already_holding_its_share(
    num_classes: int, num_clients: int, alpha: float, seed: int
) -> None:
    # classes of unequal size, dealt in ascending label order
    sizes = np.random.default_rng(seed % 1000).integers(5, 80, size=num_classes)
    labels = np.repeat(np.arange(num_classes), sizes).astype(np.int64)
    total = labels.shape[0]
    # min_samples = 0: the first draw is kept, whatever the rule leaves each client
    split = dirichlet_partition(labels, num_clients, np.random.default_rng(seed), alpha=alpha, min_samples=0)
    assert np.array_equal(np.sort(np.concatenate(split.client_indices)), np.arange(total))
    counts = class_counts_per_client(labels, split, num_classes)
    held_before = np.cumsum(counts, axis=1) - counts  # samples of the earlier classes
    full = held_before * num_clients >= total  # held >= N / num_clients
    assert np.all(counts[full] == 0)
    # so a client stops below N / num_clients plus one class
    assert counts.sum(axis=1).max() * num_clients < total + sizes.max() * num_clients


def test_balancing_shrinks_the_largest_client_at_small_alpha() -> None:
    # CIFAR-100's shape scaled down: 100 classes of 50, 20 clients (N / 20 = 250), alpha = 0.1.
    # Measured over seeds 0..9: largest client 284 on average balanced (at most 295), 374 unbalanced.
    labels = balanced_labels(50, num_classes=100)

    def largest(balance: bool, seed: int) -> int:
        split = dirichlet_partition(labels, 20, np.random.default_rng(seed), alpha=0.1, min_samples=10, balance=balance)
        return max(indices.shape[0] for indices in split.client_indices)

    balanced = [largest(True, seed) for seed in range(10)]
    unbalanced = [largest(False, seed) for seed in range(10)]
    assert max(balanced) < 250 + 50
    assert np.mean(balanced) < 0.85 * np.mean(unbalanced)


@pytest.mark.parametrize("balance", [True, False])
def test_dirichlet_is_a_function_of_the_seed(balance: bool) -> None:
    labels = balanced_labels(60)

    def draw(seed: int) -> str:
        return split_digest(dirichlet_partition(labels, 20, np.random.default_rng(seed), 0.3, 5, balance=balance))

    assert draw(7) == draw(7) and draw(7) != draw(8)


def test_unbalanced_dirichlet_is_the_partition_of_the_earlier_tables() -> None:
    # Recorded with the Dirichlet partitioner as it was before the balancing step existed.
    labels = balanced_labels(60)
    recorded = {0: "13b5063deac58d40", 1: "3a2e744281213f62", 42: "9a696c62a6f62227"}
    for seed, digest in recorded.items():
        split = dirichlet_partition(labels, 20, np.random.default_rng(seed), alpha=0.3, min_samples=5, balance=False)
        assert split_digest(split) == digest, seed


def test_rotation_client_i_gets_angle_i_mod_g_and_group_i_mod_g() -> None:
    angles = (0.0, 90.0, 180.0, 270.0, 45.0)
    split = rotation_partition(balanced_labels(20), 13, np.random.default_rng(0), angles)
    assert split.true_groups == tuple(client % 5 for client in range(13))
    assert split.rotation_degrees == tuple(angles[client % 5] for client in range(13))


@pytest.mark.parametrize(
    "config",
    [
        PartitionConfig(kind="iid", num_clients=8),
        PartitionConfig(kind="label_subset", num_clients=8, k=2),
        PartitionConfig(kind="dirichlet", num_clients=8, alpha=0.5, min_samples=5),
        PartitionConfig(kind="rotation", num_clients=8),
    ],
    ids=lambda config: config.kind,
)
def test_same_seed_gives_the_same_partition_and_another_seed_a_different_one(config: PartitionConfig) -> None:
    train_labels, test_labels = balanced_labels(40), balanced_labels(10, seed=1)
    first = build_partition(config, train_labels, test_labels, NUM_CLASSES, seed=5)
    again = build_partition(config, train_labels, test_labels, NUM_CLASSES, seed=5)
    other = build_partition(config, train_labels, test_labels, NUM_CLASSES, seed=6)
    for one, two in zip(first.clients, again.clients):
        assert np.array_equal(one.train_indices, two.train_indices)
        assert np.array_equal(one.test_indices, two.test_indices)
        assert (one.true_group, one.rotation_degrees) == (two.true_group, two.rotation_degrees)
    pairs = zip(first.clients, other.clients)
    assert any(not np.array_equal(one.train_indices, two.train_indices) for one, two in pairs)


def test_build_partition_fills_rotation_and_groups_only_where_planted() -> None:
    train_labels, test_labels = balanced_labels(40), balanced_labels(10, seed=1)
    config = PartitionConfig(kind="rotation", num_clients=6, angles=(0.0, 180.0))
    rotation = build_partition(config, train_labels, test_labels, 10, 0)
    assert [client.rotation_degrees for client in rotation.clients] == [0.0, 180.0] * 3
    assert rotation.true_groups().tolist() == [0, 1] * 3
    iid = build_partition(PartitionConfig(kind="iid", num_clients=6), train_labels, test_labels, 10, 0)
    assert iid.true_groups() is None
    assert all(client.rotation_degrees == 0.0 for client in iid.clients)


def test_changing_the_test_size_does_not_move_training_data() -> None:
    train_labels, test_labels = balanced_labels(40), balanced_labels(10, seed=1)
    small = build_partition(PartitionConfig(num_clients=5, test_per_client=10), train_labels, test_labels, 10, 3)
    large = build_partition(PartitionConfig(num_clients=5, test_per_client=40), train_labels, test_labels, 10, 3)
    for one, two in zip(small.clients, large.clients):
        assert np.array_equal(one.train_indices, two.train_indices)


def test_label_subset_client_tests_only_on_its_own_classes_without_repeats() -> None:
    train_labels, test_labels = balanced_labels(40), balanced_labels(30, seed=1)
    config = PartitionConfig(kind="label_subset", num_clients=10, k=2, test_per_client=25)
    partition = build_partition(config, train_labels, test_labels, NUM_CLASSES, seed=0)
    for client in partition.clients:
        assert client.test_indices.shape[0] == 25
        assert np.unique(client.test_indices).shape[0] == 25
        assert set(test_labels[client.test_indices]) == set(train_labels[client.train_indices])


def test_client_test_sets_follow_training_class_proportions() -> None:
    # 300 test samples per class: no class runs short, so only rounding separates counts from shares.
    train_labels, test_labels = balanced_labels(200), balanced_labels(300, seed=1)
    config = PartitionConfig(kind="dirichlet", num_clients=5, alpha=0.5, min_samples=20, test_per_client=200)
    for client in build_partition(config, train_labels, test_labels, NUM_CLASSES, seed=2).clients:
        train_share = np.bincount(train_labels[client.train_indices], minlength=10) / client.num_train
        test_counts = np.bincount(test_labels[client.test_indices], minlength=10)
        assert test_counts.sum() == 200
        assert np.all(np.abs(test_counts - train_share * 200) < 1.0)


def _labels_only(train_labels: np.ndarray, test_labels: np.ndarray) -> SimpleNamespace:
    return SimpleNamespace(train_labels=train_labels, test_labels=test_labels, num_classes=NUM_CLASSES)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), alpha=st.sampled_from([0.05, 0.1, 0.3]), per_class=st.integers(12, 40))
def test_test_sets_that_cannot_follow_their_proportions_are_named_with_the_size_that_can(seed, alpha, per_class) -> None:
    # A small test split (as digits'): a client's main class runs out of test images.
    train_labels, test_labels = balanced_labels(140, seed=seed % 97), balanced_labels(per_class, seed=seed % 89 + 1)
    config = PartitionConfig(kind="dirichlet", num_clients=20, alpha=alpha, min_samples=5, test_per_client=50)
    dataset = _labels_only(train_labels, test_labels)
    partition = build_partition(config, train_labels, test_labels, NUM_CLASSES, seed=seed)
    notices = proportion_notices(partition, dataset)
    departed = [
        client
        for client in partition.clients
        if np.any(
            np.bincount(train_labels[client.train_indices], minlength=10) / client.num_train * client.test_indices.shape[0]
            - np.bincount(test_labels[client.test_indices], minlength=10)
            >= 1.0
        )
    ]
    assert bool(notices) == bool(departed)
    if not notices:
        return
    assert f"the test sets of {len(departed)} of 20 clients" in notices[0]
    size = int(re.search(r"partition.test_per_client: (\d+) or less", notices[0]).group(1))
    resized = build_partition(config.model_copy(update={"test_per_client": size}), train_labels, test_labels, NUM_CLASSES, seed=seed)
    assert proportion_notices(resized, dataset) == []
    for client in resized.clients:
        share = np.bincount(train_labels[client.train_indices], minlength=10) / client.num_train
        assert client.test_indices.shape[0] == size
        assert np.all(np.abs(np.bincount(test_labels[client.test_indices], minlength=10) - share * size) < 1.0)


def test_scored_images_held_out_of_training_raise_no_proportion_notice() -> None:
    train_labels, test_labels = balanced_labels(140), balanced_labels(12, seed=1)
    config = PartitionConfig(kind="dirichlet", num_clients=20, alpha=0.1, min_samples=5, test_per_client=50)
    drawn = build_partition(config, train_labels, test_labels, NUM_CLASSES, seed=3)
    assert proportion_notices(drawn, _labels_only(train_labels, test_labels))
    held_out = build_partition(config.model_copy(update={"validation_fraction": 0.2}), train_labels, test_labels, NUM_CLASSES, seed=3)
    assert proportion_notices(held_out, _labels_only(train_labels, test_labels)) == []


def test_default_test_size_is_the_clients_share_of_the_test_split() -> None:
    partition = build_partition(PartitionConfig(num_clients=7), balanced_labels(40), balanced_labels(10, seed=1), 10, 0)
    assert all(client.test_indices.shape[0] == 100 // 7 for client in partition.clients)


def test_test_counts_round_to_the_requested_total_and_respect_capacity() -> None:
    counts = allocate_test_counts(np.array([1, 1, 1, 0]), 10, capacity=np.array([50, 50, 50, 50]))
    assert counts.sum() == 10 and counts[3] == 0 and sorted(counts[:3].tolist()) == [3, 3, 4]
    # Class 0 can supply only 2: the rest goes to the client's other class, never to class 2.
    counts = allocate_test_counts(np.array([9, 1, 0]), 10, capacity=np.array([2, 50, 50]))
    assert counts.tolist() == [2, 8, 0]
    # Not enough test samples of the client's classes: take them all.
    counts = allocate_test_counts(np.array([5, 5, 0]), 10, capacity=np.array([3, 4, 50]))
    assert counts.tolist() == [3, 4, 0]


def test_impossible_label_subset_k_names_the_key_and_the_range() -> None:
    config = PartitionConfig(kind="label_subset", k=12)
    expected = r"partition\.k: 12 is more than the 10 classes of digits \(choose 1\.\.10\)"
    with pytest.raises(ScenarioError, match=expected):
        check_partition_against_dataset(config, num_classes=10, num_train=1437, dataset_name="digits")


def test_more_clients_than_samples_names_partition_num_clients() -> None:
    with pytest.raises(ScenarioError, match=r"partition\.num_clients: 5000 is more than the 1437 training samples"):
        check_partition_against_dataset(PartitionConfig(num_clients=5000), 10, 1437, "digits")


def test_dirichlet_min_samples_beyond_the_data_names_partition_min_samples() -> None:
    config = PartitionConfig(kind="dirichlet", alpha=0.5, num_clients=100, min_samples=20)
    with pytest.raises(ScenarioError, match=r"partition\.min_samples: 20 .* 100 clients"):
        check_partition_against_dataset(config, 10, 1437, "digits")


def test_feasible_partitions_pass_the_dataset_check() -> None:
    feasible = (
        PartitionConfig(kind="label_subset", k=10),
        PartitionConfig(kind="dirichlet", alpha=0.1, min_samples=71),
    )
    for config in feasible:
        check_partition_against_dataset(config, 10, 1437, "digits")


def test_partitioner_failures_become_scenario_errors_naming_the_partition() -> None:
    config = PartitionConfig(kind="label_subset", k=1, num_clients=4)
    labels = np.array([0, 0, 0, 0, 1], dtype=np.int64)
    with pytest.raises(ScenarioError, match=r"partition \(label_subset, num_clients 4\)"):
        build_partition(config, labels, labels, 2, seed=0)
