"""Natural data: FEMNIST-layout Parquet, Shakespeare-layout text and LEAF's JSON files are
read with who made each sample; a natural partition gives each client the samples of its
own ids; every method runs on each, on the local backend and on Ray hosts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hdcfl_ray.algorithms.registry import method_names
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.schema import DatasetConfig, PartitionConfig
from hdcfl_ray.data.sources import load_dataset
from hdcfl_ray.data.standins.femnist import write_femnist_standin
from hdcfl_ray.data.standins.leaf_json import leaf_users_from_parquet, write_leaf_json
from hdcfl_ray.data.standins.shakespeare import shakespeare_roles, write_shakespeare_standin
from hdcfl_ray.data.sources.text import CLASSES, character_ids
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import PINNED_AUTO_KNOBS, SMALL_FEDERATION_METHODS, slow_beyond

SHARD = Path("data") / "train-00000-of-00001.parquet"
LENGTH = 12  # characters per window in the tests' text: a short LSTM, seconds per run


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A FEMNIST-layout Parquet folder (32 writers of unequal sizes), a Shakespeare-layout
    one (x, y windows), a raw-text table and LEAF JSON files of both."""
    root = tmp_path_factory.mktemp("natural")
    femnist = write_femnist_standin(root / "femnist", writers=32, mean_samples=24, seed=3)
    shakespeare = write_shakespeare_standin(root / "shakespeare", roles=8, mean_characters=160, seed=3, length=LENGTH)
    raw = root / "lines.parquet"
    roles = shakespeare_roles(6, seed=4, mean_characters=200)
    pq.write_table(pa.table({"speaker": list(roles), "text": list(roles.values())}), raw)
    leaf_femnist = write_leaf_json(root / "femnist-leaf", leaf_users_from_parquet(femnist / SHARD, "writer_id", "image", "character"))
    leaf_text = write_leaf_json(
        root / "shakespeare-leaf" / "all_data.json", leaf_users_from_parquet(shakespeare / SHARD, "character_id", "x", "y"), test_fraction=None
    )
    return {"femnist": femnist, "shakespeare": shakespeare, "raw": raw, "leaf_femnist": leaf_femnist, "leaf_text": leaf_text}


def _sections(kind: str, corpora: dict[str, Path]) -> dict[str, Any]:
    """The dataset, partition and model sections of a natural scenario on one corpus."""
    if kind == "femnist":
        dataset = {"name": "huggingface", "path": str(corpora["femnist"]), "label_column": "character", "test_split": None}
        partition = {"kind": "natural_id", "partition_by": "writer_id", "num_clients": 8, "min_samples": 8}
        model = {"encoder": "small_cnn", "width": 8, "feature_dim": 32}
    elif kind == "shakespeare":
        dataset = {
            "name": "text", "path": str(corpora["shakespeare"]), "text_column": "x", "target_column": "y",
            "sequence_length": LENGTH, "test_split": None,
        }
        partition = {"kind": "natural_id", "partition_by": "character_id", "num_clients": 8, "min_samples": 8}
        model = {"encoder": "char_lstm", "feature_dim": 16}
    else:  # LEAF's JSON: FEMNIST's train/ and test/ folders
        dataset = {"name": "leaf_json", "path": str(corpora["leaf_femnist"])}
        partition = {"kind": "natural_id", "partition_by": "users", "num_clients": 8, "min_samples": 8}
        model = {"encoder": "small_cnn", "width": 8, "feature_dim": 32}
    return {"dataset": dataset, "partition": partition, "model": model}


def _scenario(kind: str, corpora: dict[str, Path], method: str = "hdcfl", backend: str = "local", **changes: Any) -> Any:
    raw: dict[str, Any] = {
        "name": f"natural-{kind}",
        "seed": 5,
        **_sections(kind, corpora),
        "algorithm": {"name": method, **PINNED_AUTO_KNOBS, **SMALL_FEDERATION_METHODS},
        "protocol": {"rounds": 2, "local_epochs": 1, "batch_size": 16},
        "runtime": {"backend": backend, "num_cpus_per_actor": 1},
    }
    for key, value in changes.items():
        section, _, name = key.partition("__")
        raw[section] = {**raw[section], name: value}
    return build_scenario(raw)


# ---- reading: ids, counts, layouts ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["femnist", "shakespeare", "leaf"])
def test_each_client_holds_exactly_the_samples_of_its_ids(corpora, kind):
    scenario = _scenario(kind, corpora)
    prepared = prepare_run(scenario)
    dataset, partition = prepared.dataset, prepared.partition
    assert dataset.has_ids and len(dataset.id_names) >= 8
    train_counts = np.bincount(dataset.train_ids, minlength=len(dataset.id_names))
    test_counts = np.bincount(dataset.test_ids, minlength=len(dataset.id_names))
    held: set[int] = set()
    for client in partition.clients:
        owners = np.unique(dataset.train_ids[client.train_indices])
        assert owners.shape == (1,), "one id per client (ids_per_client 1)"
        owner = int(owners[0])
        assert owner not in held
        held.add(owner)
        assert client.num_train == train_counts[owner] >= scenario.partition.min_samples
        assert np.all(dataset.test_ids[client.test_indices] == owner)
        assert client.test_indices.shape[0] == test_counts[owner] > 0
    assert len(held) == scenario.partition.num_clients


def test_femnist_layout_reads_unequal_writers_with_their_holdout(corpora):
    table = pq.read_table(corpora["femnist"] / SHARD)
    writers = table.column("writer_id").to_pylist()
    sizes = sorted(writers.count(name) for name in set(writers))
    assert len(sizes) == 32 and sizes[-1] >= 3 * sizes[0], "unequal writers"
    dataset = load_dataset(DatasetConfig(name="huggingface", path=str(corpora["femnist"]), label_column="character", test_split=None), 1, "writer_id")
    assert dataset.train_images.shape[1:] == (28, 28, 1)
    assert dataset.train_labels.shape[0] + dataset.test_labels.shape[0] == table.num_rows
    for code, name in enumerate(dataset.id_names):  # each writer holds out a fifth of its own images
        total = writers.count(name)
        assert (dataset.test_ids == code).sum() == max(1, min(total - 1, int(0.2 * total + 0.5)))


def test_text_windows_and_raw_lines_give_the_same_samples(corpora, tmp_path):
    """Windows cut here from raw lines are the windows a pre-cut table holds (LEAF's cut)."""
    roles = shakespeare_roles(6, seed=4, mean_characters=200)
    config = DatasetConfig(name="text", path=str(corpora["raw"]), sequence_length=LENGTH, stride=1, test_split=None)
    dataset = load_dataset(config, 0, "speaker")
    expected = sum(len(text) - LENGTH for text in roles.values())
    assert dataset.train_labels.shape[0] + dataset.test_labels.shape[0] == expected
    assert dataset.text and dataset.num_classes == len(CLASSES) == 81
    first = next(iter(roles.values()))
    sample = dataset.train_images[0, :, 0, 0]
    start = next(i for i in range(len(first) - LENGTH) if np.array_equal(character_ids(first[i : i + LENGTH]), sample))
    assert dataset.train_labels[0] == character_ids(first[start + LENGTH])[0]
    assert character_ids("é")[0] == len(CLASSES) - 1, "a character outside the vocabulary is <other>"


def test_same_seed_same_clients_and_another_seed_other_ids(corpora):
    """num_clients below the ids: a seeded choice; the same seed chooses the same."""

    def chosen(seed: int) -> list[str]:
        scenario = _scenario("femnist", corpora).model_copy(update={"seed": seed})
        prepared = prepare_run(scenario)
        return [prepared.dataset.id_names[int(prepared.dataset.train_ids[c.train_indices[0]])] for c in prepared.partition.clients]

    first, again, other = chosen(11), chosen(11), chosen(12)
    assert first == again
    assert first != other


def test_several_ids_per_client(corpora):
    scenario = _scenario("femnist", corpora, partition__ids_per_client=3, partition__num_clients=5)
    prepared = prepare_run(scenario)
    for client in prepared.partition.clients:
        assert np.unique(prepared.dataset.train_ids[client.train_indices]).shape == (3,)


# ---- every method, both backends ---------------------------------------------------------------------


def _run(scenario: Any, run_dir: Path) -> dict[str, list[Any]]:
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    clients = pq.read_table(run_dir / "clients.parquet").to_pydict()
    assert sorted(set(clients["round"])) == [1, 2]
    assert all(0.0 <= accuracy <= 1.0 for accuracy in clients["accuracy"])
    return clients


@pytest.mark.parametrize("method", slow_beyond(method_names(), fast={"hdcfl", "ifca"}))
@pytest.mark.parametrize("kind", ["femnist", "shakespeare", "leaf"])
def test_every_method_runs_on_natural_data_locally(corpora, tmp_path, kind, method):
    clients = _run(_scenario(kind, corpora, method), tmp_path / "run")
    assert sorted(set(clients["client_id"])) == list(range(8))
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    facts = manifest["dataset"]
    assert facts["ids_held"] == 8 and len(facts["client_ids"]) == 8
    assert facts["source_files"] and all(len(entry["sha256"]) == 64 for entry in facts["source_files"])
    sizes = [int(n) for r, n in zip(clients["round"], clients["num_samples"]) if r == 2]
    assert facts["client_train_samples_quantiles"]["0"] == min(sizes)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("method", slow_beyond(method_names(), fast={"hdcfl", "ifca"}))
def test_every_method_runs_on_text_on_ray_hosts(corpora, tmp_path, method):
    """The character model is the new path every method takes: each runs on Ray hosts."""
    _run(_scenario("shakespeare", corpora, method, backend="ray"), tmp_path / "run")


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("kind", ["femnist", "leaf"])
def test_natural_images_run_on_ray_hosts(corpora, tmp_path, kind):
    _run(_scenario(kind, corpora, "hdcfl", backend="ray"), tmp_path / "run")


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("method", method_names())
@pytest.mark.parametrize("kind", ["femnist", "leaf"])
def test_every_method_runs_on_natural_images_on_ray_hosts(corpora, tmp_path, kind, method):
    _run(_scenario(kind, corpora, method, backend="ray"), tmp_path / "run")


def test_a_natural_run_reproduces(corpora, tmp_path):
    first = _run(_scenario("shakespeare", corpora, "fedavg"), tmp_path / "first")
    again = _run(_scenario("shakespeare", corpora, "fedavg"), tmp_path / "again")
    assert first["accuracy"] == again["accuracy"] and first["train_loss"] == again["train_loss"]


# ---- bad input: exit 2 with the key and the fix ------------------------------------------------------


def _refused(scenario: Any) -> str:
    with pytest.raises(ScenarioError) as caught:
        prepare_run(scenario)
    return str(caught.value)


def test_a_missing_id_column_names_the_key_and_the_columns(corpora):
    message = _refused(_scenario("femnist", corpora, partition__partition_by="writer"))
    assert "partition.partition_by" in message and "writer_id" in message


def test_a_constant_id_column_is_refused(corpora, tmp_path):
    table = pq.read_table(corpora["shakespeare"] / SHARD)
    table = table.set_column(0, "character_id", pa.array(["ONE"] * table.num_rows))
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "train-00000-of-00001.parquet")
    message = _refused(_scenario("shakespeare", corpora, dataset__path=str(tmp_path)))
    assert "partition.partition_by" in message and "'ONE'" in message


def test_too_few_samples_says_how_many_ids_qualify(corpora):
    message = _refused(_scenario("femnist", corpora, partition__min_samples=10_000))
    assert "partition.min_samples" in message and "partition.num_clients" in message and "at most 0" in message


def test_more_clients_than_ids_says_the_most_there_are(corpora):
    message = _refused(_scenario("shakespeare", corpora, partition__num_clients=9))
    assert "set partition.num_clients to at most 8" in message


def test_a_non_text_column_for_the_text_source(corpora, tmp_path):
    table = pq.read_table(corpora["shakespeare"] / SHARD).append_column("number", pa.array(range(10**6))[: pq.read_metadata(corpora["shakespeare"] / SHARD).num_rows])
    pq.write_table(table, tmp_path / "t.parquet")
    message = _refused(_scenario("shakespeare", corpora, dataset__path=str(tmp_path / "t.parquet"), dataset__text_column="number"))
    assert "dataset.text_column" in message and "not text" in message


def test_a_sequence_longer_than_every_line(corpora):
    message = _refused(
        _scenario("shakespeare", corpora, dataset__path=str(corpora["raw"]), dataset__target_column=None, dataset__text_column="text", dataset__sequence_length=4000, partition__partition_by="speaker", partition__num_clients=6)
    )
    assert "dataset.sequence_length" in message and "shorter" in message


def test_cut_windows_of_another_length(corpora):
    message = _refused(_scenario("shakespeare", corpora, dataset__sequence_length=80))
    assert "dataset.sequence_length" in message and f"({80})" in message


def test_an_image_encoder_on_text_and_a_shift_on_text(corpora):
    assert "model.encoder: small_cnn reads images" in _refused(_scenario("shakespeare", corpora, model__encoder="small_cnn"))
    message = _refused(
        _scenario("shakespeare", corpora, partition__kind="rotation", partition__angles=[0, 90], partition__num_clients=4)
    )
    assert "holds text" in message


def test_natural_id_needs_its_column_and_a_source_with_ids(corpora):
    with pytest.raises(ValueError, match="partition.partition_by is required"):
        PartitionConfig(kind="natural_id")
    message = _refused(build_scenario({"name": "d", "partition": {"kind": "natural_id", "partition_by": "writer"}, "algorithm": {"name": "fedavg"}}))
    assert "dataset.name digits has no column" in message


def test_leaf_refuses_another_id_column_and_non_leaf_json(corpora, tmp_path):
    assert "partition.partition_by: users" in _refused(_scenario("leaf", corpora, partition__partition_by="writer_id"))
    (tmp_path / "x.json").write_text(json.dumps({"something": 1}))
    assert "not a LEAF data file" in _refused(_scenario("leaf", corpora, dataset__path=str(tmp_path / "x.json")))


def test_leaf_text_in_one_file_holds_out_each_users_share(corpora):
    config = DatasetConfig(name="leaf_json", path=str(corpora["leaf_text"]), sequence_length=LENGTH)
    dataset = load_dataset(config, 0, "users")
    assert dataset.text and set(np.unique(dataset.test_ids)) == set(np.unique(dataset.train_ids))


@pytest.mark.parametrize("method", ["fedavg", "hdcfl"])
def test_text_trains_with_clients_batched_together(corpora, tmp_path, method):
    """runtime.batched_training (the GPU default) vmaps the character model's stepwise path."""
    scenario = _scenario("shakespeare", corpora, method, runtime__batched_training=True)
    clients = _run(scenario, tmp_path / "run")
    assert sorted(set(clients["client_id"])) == list(range(8))
    updates = pq.read_table(tmp_path / "run" / "updates.parquet").to_pydict()
    assert max(updates["trained_together"]) > 1


# ---- plugins: a source with ids, a partition that divides by them ------------------------------------

ID_PLUGIN = '''
import numpy as np
from hdcfl_ray.contract.data import Images, PartitionSpec, SampleIds, SourceSpec, Split


def by_author(params, seed):
    rng = np.random.default_rng(seed)
    labels = np.tile(np.arange(4), 30)
    images = rng.integers(0, 255, size=(labels.shape[0], 8, 8, 1), dtype=np.uint8)
    authors = np.asarray([f"author{i % 6}" for i in range(labels.shape[0])])
    return Images(images, labels, images[:24].copy(), labels[:24].copy(), num_classes=4, train_ids=authors, test_ids=authors[:24])


SOURCE = SourceSpec("authored", "random images by six authors", by_author, num_classes=4)


def two_authors_each(params, labels, num_clients, rng, ids: SampleIds) -> Split:
    chosen = rng.permutation(len(ids.names))[: 2 * num_clients].reshape(num_clients, 2)
    return Split(
        client_indices=tuple(np.flatnonzero(np.isin(ids.train, pair)) for pair in chosen),
        test_indices=tuple(np.flatnonzero(np.isin(ids.test, pair)) for pair in chosen),
    )


PARTITION = PartitionSpec("two_authors", "two authors per client", two_authors_each, uses_ids=True)
'''


@pytest.fixture
def id_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tests.test_plugins import loaded_plugin

    (tmp_path / "hdcfl_test_id_plugin.py").write_text(ID_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield from loaded_plugin("hdcfl_test_id_plugin", monkeypatch)


@pytest.mark.parametrize("kind", ["two_authors", "natural_id"])
def test_a_plugin_source_with_ids_and_a_plugin_partition_that_reads_them(id_plugin, kind):
    raw = {
        "name": "authored",
        "dataset": {"name": "authored"},
        "partition": {"kind": kind, "num_clients": 3, "partition_by": "author", "min_samples": 1},
        "model": {"encoder": "small_cnn", "width": 8, "feature_dim": 16},
        "algorithm": {"name": "fedavg"},
        "protocol": {"rounds": 1},
        "runtime": {"backend": "local"},
    }
    prepared = prepare_run(build_scenario(raw))
    dataset = prepared.dataset
    per_client = 2 if kind == "two_authors" else 1
    for client in prepared.partition.clients:
        authors = np.unique(dataset.train_ids[client.train_indices])
        assert authors.shape == (per_client,)
        assert set(np.unique(dataset.test_ids[client.test_indices])) == set(authors)


def test_a_partition_that_uses_ids_without_a_column_says_so(id_plugin):
    raw = {"name": "authored", "dataset": {"name": "authored"}, "partition": {"kind": "two_authors", "num_clients": 3}, "algorithm": {"name": "fedavg"}}
    with pytest.raises(ScenarioError, match="partition.partition_by"):
        prepare_run(build_scenario(raw))


def test_text_download_reads_with_load_dataset(corpora, tmp_path, monkeypatch):
    """dataset.hub_id with download: true goes through datasets.load_dataset (which takes a
    local folder as well as a Hub id: the download path, offline) and gives the same windows."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    common = {"name": "text", "text_column": "x", "target_column": "y", "sequence_length": LENGTH, "test_split": None}
    fetched = load_dataset(DatasetConfig(**common, hub_id=str(corpora["shakespeare"]), download=True), 0, "character_id")
    local = load_dataset(DatasetConfig(**common, path=str(corpora["shakespeare"])), 0, "character_id")
    assert np.array_equal(fetched.train_images, local.train_images) and np.array_equal(fetched.train_ids, local.train_ids)
    with pytest.raises(ScenarioError, match="download: true"):
        load_dataset(DatasetConfig(**common, hub_id="flwrlabs/shakespeare"), 0, "character_id")


# ---- planted groups read off the ids (partition.group_pattern) ---------------------------------


def test_group_pattern_gives_each_client_the_play_of_its_role(corpora):
    prepared = prepare_run(_scenario("shakespeare", corpora, partition__group_pattern=r"^(PLAY\d+)_"))
    dataset, partition = prepared.dataset, prepared.partition
    plays = sorted({name.split("_")[0] for name in dataset.id_names})
    for client in partition.clients:
        owner = dataset.id_names[int(dataset.train_ids[client.train_indices][0])]
        assert client.true_group == plays.index(owner.split("_")[0])
    assert len(set(partition.true_groups().tolist())) > 1
    without = prepare_run(_scenario("shakespeare", corpora)).partition
    assert without.true_groups() is None  # the text source knows no groups of its own


def test_whole_match_names_the_group_without_a_capture_group(corpora):
    with_group = prepare_run(_scenario("shakespeare", corpora, partition__group_pattern=r"^(PLAY\d+)_")).partition
    whole = prepare_run(_scenario("shakespeare", corpora, partition__group_pattern=r"^PLAY\d+")).partition
    assert np.array_equal(with_group.true_groups(), whole.true_groups())


def test_a_pattern_missing_an_id_names_the_key_and_the_id(corpora):
    message = _refused(_scenario("shakespeare", corpora, partition__group_pattern=r"^ACT\d+"))
    assert "partition.group_pattern" in message and "'PLAY" in message and "character_id" in message


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"kind": "iid", "partition_by": None, "num_clients": 8}, "natural_id"),
        ({"group_pattern": "(PLAY"}, "not a regular expression"),
        ({"group_pattern": r"(PLAY)(\d+)"}, "2 capture groups"),
    ],
)
def test_a_bad_group_pattern_is_refused_with_the_fix(changes, words):
    raw = {"kind": "natural_id", "partition_by": "character_id", "group_pattern": r"^(PLAY\d+)_", **changes}
    with pytest.raises(ValueError) as caught:
        PartitionConfig(**raw)
    assert "group_pattern" in str(caught.value) and words in str(caught.value)
