"""Communication is measured: every method's logged `bytes_up`, `bytes_down` and
`eval_bytes_down` equal the sizes of the tensors and values its hooks declared to send
(the broadcast objects its tasks name, the task payloads, its uploads and probe
answers), on each backend and in asynchronous runs; the model part follows from the
method's design (a full model, an encoder, S cluster models)."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from hdcfl_ray.algorithms.registry import method_names
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.methods import build_algorithm
from hdcfl_ray.contract import ClientTask, ModelParams
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.runtime.initial_model import initial_parameters
from hdcfl_ray.runtime.server.payload_bytes import payload_bytes
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import SMALL_FEDERATION_METHODS, slow_beyond, tiny_scenario

CLIENTS = 4
ROUNDS = 2


def declared_bytes(value: Any) -> int:
    """The test's own count of what a hook declared: array nbytes, 8 bytes a Python
    number, 1 a bool; containers by their contents. Anything else is a surprise."""
    if value is None:
        return 0
    if isinstance(value, (bool, np.bool_)):
        return 1
    if isinstance(value, (np.ndarray, np.generic)):
        return value.nbytes
    if isinstance(value, (int, float)):
        return 8
    if isinstance(value, ModelParams):
        return value.encoder.nbytes + (0 if value.head is None else value.head.nbytes)
    if isinstance(value, Mapping):
        return sum(declared_bytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(declared_bytes(item) for item in value)
    raise AssertionError(f"a hook declared a {type(value).__name__}; count it here")


class Declared:
    """What a method's hooks declared, recorded as they return: per (round, client)
    the bytes of its training and probe tasks, uploads and probe answers, and its
    evaluation tasks; per broadcast name the object's bytes; per upload its model part."""

    def __init__(self) -> None:
        self.object_bytes: dict[str, int] = {}
        self.tasks: list[tuple[str, int, int, ClientTask]] = []  # (kind, round, client, task)
        self.up: dict[tuple[int, int], int] = defaultdict(int)
        self.upload_models: dict[tuple[int, int], int] = {}
        self.depth = 0  # hooks running now: only the outermost one is a message

    def task_bytes(self, task: ClientTask) -> int:
        return sum(self.object_bytes[name] for name in task.models) + declared_bytes(dict(task.payload))

    def expected(self) -> dict[tuple[int, int], tuple[int, int, int]]:
        """(up, down, eval_down) per (round, client)."""
        down: dict[tuple[int, int], int] = defaultdict(int)
        eval_down: dict[tuple[int, int], int] = defaultdict(int)
        for kind, round_index, client_id, task in self.tasks:
            target = eval_down if kind == "evaluation" else down
            target[(round_index, client_id)] += self.task_bytes(task)
        keys = set(self.up) | set(down) | set(eval_down)
        return {key: (self.up.get(key, 0), down.get(key, 0), eval_down.get(key, 0)) for key in keys}


def record_hooks(monkeypatch: pytest.MonkeyPatch, cls: type, declared: Declared) -> None:
    def wrap(name: str, after) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)  # keeps never_probes on a probe_task that never probes
        def hook(self, *args: Any, **kwargs: Any) -> Any:
            declared.depth += 1  # a hook that calls another (PACFL's evaluation task is its training task)
            try:
                result = original(self, *args, **kwargs)
            finally:
                declared.depth -= 1
            if declared.depth == 0:
                after(result, *args)
            return result

        monkeypatch.setattr(cls, name, hook)

    def broadcast(objects, state, round_index) -> None:
        for name, value in objects.items():
            size = declared_bytes(value)
            # an object keeps its size for the whole run (cluster models, prototypes)
            assert declared.object_bytes.setdefault(name, size) == size, name
            declared.object_bytes[name] = size

    def task(kind: str):
        def after(task, state, round_index, client_id, *rest) -> None:
            if task is not None:
                declared.tasks.append((kind, round_index, client_id, task))

        return after

    def local_update(result, ctx, state, task, objects) -> None:
        upload, _ = result
        key = (ctx.round_index, ctx.client_id)
        declared.upload_models[key] = declared_bytes(dict(upload.models))
        declared.up[key] += declared_bytes(dict(upload.models)) + declared_bytes(dict(upload.values))

    def probe(answer, ctx, state, task, objects) -> None:
        declared.up[(ctx.round_index, ctx.client_id)] += declared_bytes(dict(answer))

    wrap("broadcast", broadcast)
    wrap("training_task", task("training"))
    wrap("probe_task", task("probe"))
    wrap("evaluation_task", task("evaluation"))
    wrap("local_update", local_update)
    wrap("probe", probe)


def method_section(name: str) -> dict[str, Any]:
    return {"name": name, **SMALL_FEDERATION_METHODS}


def scenario_of(name: str, **changes: Any):
    sections = {
        "algorithm": method_section(name),
        "partition": {"num_clients": CLIENTS},
        "protocol": {"rounds": ROUNDS, "participation": 0.5},
        "runtime": {"backend": "local", "num_cpus": 1},
    }
    for key, value in changes.items():
        sections[key] = {**sections.get(key, {}), **value}
    return build_scenario(tiny_scenario(**sections))


def simulate(run_dir: Path, scenario) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    run_simulation(prepare_run(scenario), run_dir, QuietObserver())
    return pq.read_table(run_dir / "clients.parquet").to_pylist(), pq.read_table(run_dir / "rounds.parquet").to_pylist()


# The model part of a participant's training download and upload, in units of the
# encoder (E) and head (H) sizes: what each method's design sends (S = 2 clusters,
# centres or components in SMALL_FEDERATION_METHODS). FedCE uploads only the
# components it trained: a whole number of full models, 1 to S.
FULL, ENCODER, NOTHING = (1, 1), (1, 0), (0, 0)
MODEL_PARTS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "apfl": (FULL, FULL),
    "ditto": (FULL, FULL),
    "fedala": (FULL, FULL),
    "fedavg": (FULL, FULL),
    "fedavg_se": (ENCODER, ENCODER),
    "fedbabu": (FULL, ENCODER),
    "fedce": ((2, 2), FULL),
    "fednova": (FULL, FULL),  # the normalised update d_k up (a_k is a value)
    "fedprox": (FULL, FULL),
    "fedrep": (ENCODER, ENCODER),
    "fedsoft": ((2, 2), FULL),
    "hdcfl": (ENCODER, ENCODER),
    "ifca": ((2, 2), FULL),
    "local": (NOTHING, NOTHING),
    "pacfl": (FULL, FULL),
    "scaffold": ((2, 2), (2, 2)),  # x and c down, y_k and Delta c up
}


def test_every_method_has_its_model_parts_listed() -> None:
    assert set(MODEL_PARTS) == set(method_names())


@pytest.mark.parametrize("name", slow_beyond(sorted(method_names()), fast={"hdcfl", "ifca", "pacfl", "scaffold", "fedsoft"}))
def test_logged_bytes_equal_what_the_method_declared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    scenario = scenario_of(name)
    declared = Declared()
    record_hooks(monkeypatch, type(build_algorithm(scenario)), declared)
    clients, rounds = simulate(tmp_path / name, scenario)

    # every client is evaluated every round: the clients table holds every client's bytes
    assert sorted((row["round"], row["client_id"]) for row in clients) == [(r, k) for r in range(1, ROUNDS + 1) for k in range(CLIENTS)]
    expected = declared.expected()
    for row in clients:
        key = (row["round"], row["client_id"])
        assert (row["bytes_up"], row["bytes_down"], row["eval_bytes_down"]) == expected.get(key, (0, 0, 0)), key
        probed = any(kind == "probe" and (r, k) == key for kind, r, k, _ in declared.tasks)
        if not row["participated"] and not probed:
            assert row["bytes_up"] == row["bytes_down"] == 0, key
    for row in rounds:
        mine = [client for client in clients if client["round"] == row["round"]]
        for column in ("bytes_up", "bytes_down", "eval_bytes_down"):
            assert row[column] == sum(client[column] for client in mine), (row["round"], column)

    # the model part of each training job follows from the method's design
    initial = initial_parameters(scenario, prepare_run(scenario).dataset)
    encoder, head = initial.encoder.nbytes, initial.head.nbytes
    (down_e, down_h), (up_e, up_h) = MODEL_PARTS[name]
    trainings = [(r, k, task) for kind, r, k, task in declared.tasks if kind == "training"]
    assert trainings, "no client trained"
    for round_index, client_id, task in trainings:
        assert sum(declared.object_bytes[n] for n in task.models) == down_e * encoder + down_h * head, (round_index, client_id)
        uploaded = declared.upload_models[(round_index, client_id)]
        if name == "fedce":  # the components it trained, each a full model
            assert uploaded % (encoder + head) == 0 and 1 <= uploaded // (encoder + head) <= 2
        else:
            assert uploaded == up_e * encoder + up_h * head, (round_index, client_id)


def test_ifca_with_k_models_downloads_k_times_what_fedavg_does(tmp_path: Path) -> None:
    per_participant = {}
    for name, section in (("fedavg", {}), ("ifca", {"ifca": {"clusters": 3}})):
        scenario = scenario_of(name, algorithm=section)
        clients, _ = simulate(tmp_path / name, scenario)
        downloads = {row["bytes_down"] for row in clients if row["participated"]}
        assert len(downloads) == 1, downloads  # the same for every participant and round
        per_participant[name] = downloads.pop()
        assert {row["eval_bytes_down"] for row in clients} == {per_participant[name]}
    assert per_participant["ifca"] == 3 * per_participant["fedavg"] > 0


def test_asynchronous_updates_carry_their_bytes_into_the_round_they_arrive(tmp_path: Path) -> None:
    scenario = scenario_of(
        "fedavg_se",
        protocol={"mode": "async", "rounds": 4, "asynchronous": {"concurrency": 2, "aggregation": "fedbuff", "buffer_size": 2}},
    )
    clients, rounds = simulate(tmp_path / "async", scenario)
    updates = pq.read_table(tmp_path / "async" / "updates.parquet").to_pylist()
    initial = initial_parameters(scenario, prepare_run(scenario).dataset)
    encoder, head = initial.encoder.nbytes, initial.head.nbytes
    for row in rounds:
        arrived = sum(1 for update in updates if update["round"] == row["round"])
        assert arrived >= 1
        # each update: the encoder down (the task names only the global encoder), encoder and head up
        assert row["bytes_down"] == arrived * encoder
        assert row["bytes_up"] == arrived * (encoder + head)
        assert row["bytes_up"] == sum(client["bytes_up"] for client in clients if client["round"] == row["round"])


def test_a_stored_reference_counts_as_the_object_it_names() -> None:
    stored = {"ref-1": {"encoder": np.zeros(10, dtype=np.float32)}}

    def resolve(value: Any) -> Any:
        return stored.get(value, value) if isinstance(value, str) else value

    class Handle:  # a reference type the sizer does not know: resolved through the transport
        pass

    handle = Handle()
    assert payload_bytes({"own": handle}, lambda value: stored["ref-1"] if value is handle else value) == 40
    assert payload_bytes({"a": 1, "b": 2.5, "c": True, "d": np.float32(1), "e": None}, resolve) == 8 + 8 + 1 + 4
    assert payload_bytes(ModelParams(np.zeros(3, np.float32), np.zeros(2, np.float64)), resolve) == 12 + 16


COLUMNS = ("round", "client_id", "bytes_up", "bytes_down", "eval_bytes_down")


def logged_bytes(run_dir: Path, scenario) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    clients, rounds = simulate(run_dir, scenario)
    return sorted(tuple(row[c] for c in COLUMNS) for row in clients), [tuple(row[c] for c in COLUMNS[2:]) for row in rounds]


def test_hosts_on_threads_move_the_same_bytes_as_one_host(tmp_path: Path) -> None:
    """With two hosts on threads HDC-FL's evaluation payload holds a future of the
    client's own upload, with one host the upload itself: both count the same."""
    one = logged_bytes(tmp_path / "one", scenario_of("hdcfl"))
    two = logged_bytes(tmp_path / "two", scenario_of("hdcfl", runtime={"num_cpus": 2}))
    assert two == one
    assert any(row[4] > 0 for row in one[0])


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("name", slow_beyond(["hdcfl", "pacfl"], fast={"hdcfl"}))
def test_ray_moves_the_same_bytes_as_the_local_backend(tmp_path: Path, name: str) -> None:
    """HDC-FL's evaluation payload holds an ObjectRef to the client's own upload on Ray
    (the upload itself in one process); PACFL answers a probe: both count the same."""
    local = logged_bytes(tmp_path / "local", scenario_of(name))
    assert logged_bytes(tmp_path / "ray", scenario_of(name, runtime={"backend": "ray"})) == local
    assert any(row[2] > 0 for row in local[0])
