"""The client host: a plain object that owns one or more logical clients.

It holds each client's private state (its head and whatever else the algorithm
keeps per client; persistent across rounds, never sent to another client), its
data indices and its transform, and runs the algorithm's client hooks through a
`HostClientContext`. `ClientHostActor` (runtime/backends/actors.py) is the Ray actor around it.
"""

from __future__ import annotations

import sys
import time
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Mapping

import numpy as np

from hdcfl_ray.config.runtime_resolved import torch_threads_per_host
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.contract import ClientTask, Method, ModelParams
from hdcfl_ray.errors import failure_text
from hdcfl_ray.runtime.server.payload_bytes import payload_bytes
from hdcfl_ray.runtime.server.thread_transport import FutureValue
from hdcfl_ray.runtime.server.messages import INITIAL_STATE, ClientJob, EvalReport, InitialState, StoreRef, UploadMeta

if TYPE_CHECKING:
    import torch

    from hdcfl_ray.data.partitions.client_data import ClientData
    from hdcfl_ray.models import SplitModel
    from hdcfl_ray.runtime.client.batched_scoring import EvaluationBatch
    from hdcfl_ray.runtime.client.client_context import HostClientContext
    from hdcfl_ray.runtime.client.replica_weights import ReplicaWeights, StagingRows
    from hdcfl_ray.runtime.client.training_rendezvous import TrainingSlot

# torch and everything built on it are imported inside the methods: Ray imports this
# module in every process that holds a host's actor handle (the server actor too),
# and the server must not pay torch's start-up time and memory for that.


def _resolve(value: Any) -> Any:
    """ObjectRefs inside a task payload or object map are fetched here, so algorithm
    hooks never see Ray."""
    if isinstance(value, StoreRef):
        value = value.ref
    if isinstance(value, FutureValue):  # the local backend's hosts on threads
        return value.value()
    # No ObjectRef can exist in a process that never imported Ray (the local backend).
    ray = sys.modules.get("ray")
    return ray.get(value) if ray is not None and isinstance(value, ray.ObjectRef) else value


def _never_checked(array: np.ndarray) -> bool:
    return False


def _all_finite(value: Any, known_finite: Callable[[np.ndarray], bool] = _never_checked) -> bool:
    """Whether every float in `value` is finite; arrays `known_finite` vouches for (checked
    on the device as they were made) are not read again."""
    if isinstance(value, np.ndarray):
        return known_finite(value) or not np.issubdtype(value.dtype, np.floating) or bool(np.isfinite(value).all())
    if isinstance(value, ModelParams):
        parts = (value.encoder,) if value.head is None else (value.encoder, value.head)
        return all(known_finite(part) or bool(np.isfinite(part).all()) for part in parts)
    if isinstance(value, Mapping):
        return all(_all_finite(v, known_finite) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_all_finite(v, known_finite) for v in value)
    if isinstance(value, float):
        return bool(np.isfinite(value))
    return True


@contextmanager
def _naming_the_clients(client_ids: tuple[int, ...], round_index: int) -> Iterator[None]:
    """An error inside a client's update (or a batched group's training), raised again
    naming the clients and the round, on its own or in a batched group, locally or on
    a Ray host. Bad input keeps its type, so the command still exits 2 for it; an
    interrupt, and a parked client's release after another failed, pass through."""
    from hdcfl_ray.errors import ClientUpdateFailed, ScenarioError
    from hdcfl_ray.runtime.client.training_rendezvous import RendezvousAborted

    try:
        yield
    except (ScenarioError, ClientUpdateFailed, RendezvousAborted):
        raise
    except Exception as error:
        raise ClientUpdateFailed(client_ids, round_index, failure_text(error)) from error


class ClientHost:
    def __init__(
        self,
        scenario: Scenario,
        algorithm: Method,
        train_images: np.ndarray,
        train_labels: np.ndarray,
        test_images: np.ndarray,
        test_labels: np.ndarray,
        clients: list[ClientData],
        initial: ModelParams,
        num_classes: int,
        cache_bytes: int = 1 << 30,
        cuda_index: int | None = None,
    ) -> None:
        import torch

        from hdcfl_ray.models import FlatIndex, build_split_model
        from hdcfl_ray.runtime.client.device import choose_device, configure_cuda, granted_gpu_ids
        from hdcfl_ray.training.precision import resolve_precision
        from hdcfl_ray.runtime.client.tensor_cache import TensorCache

        if scenario.runtime.portable:  # before anything computes; a Ray host started pinned, a local one in the pinned driver
            from hdcfl_ray.portable import require_pinned_process

            require_pinned_process("a client host")
        torch.set_num_threads(torch_threads_per_host(scenario.runtime))
        self.scenario = scenario
        self.algorithm = algorithm
        # CUDA exactly when Ray granted this host GPU ids (or, outside Ray, the scenario asks for a GPU)
        self.granted_gpu_ids = granted_gpu_ids()
        self.device = choose_device(scenario.runtime, self.granted_gpu_ids, index=cuda_index or 0)
        configure_cuda(scenario.runtime, self.device)  # before the first CUDA operation
        # auto picks bf16 on some CPUs: a portable run stays in float32 everywhere
        self.precision = resolve_precision("fp32" if scenario.runtime.portable else scenario.runtime.precision, self.device)
        if self.precision == "fp16" and self.device.type != "cuda":
            raise ValueError(
                "runtime.precision: fp16 needs a CUDA device; this host has none, and CPUs emulate float16 "
                "about 100x slower than float32. Use bf16 (or auto) on CPU."
            )
        # The arrays may arrive as ObjectRefs wrapped in a container (so a restarted actor
        # is rebuilt from the same, driver-owned objects): reads are zero-copy either way.
        self.train_images = _resolve(train_images)
        self.train_labels = _resolve(train_labels)
        self.test_images = _resolve(test_images)
        self.test_labels = _resolve(test_labels)
        clients = _resolve(clients)
        initial = _resolve(initial)
        self.clients = {client.client_id: client for client in clients}
        # Weights arrive as flat vectors; a pretrained file is read once on the driver.
        skeleton_config = scenario.model.model_copy(update={"pretrained": None})
        self.model: SplitModel = build_split_model(
            skeleton_config, in_channels=int(self.train_images.shape[3]), num_classes=num_classes, seed=scenario.seed
        )
        self.model.encoder.to(self.device)
        self.model.head.to(self.device)
        # runtime.channels_last: NHWC weights and inputs (the flat vectors keep the logical order)
        self.memory_format = torch.channels_last if scenario.runtime.channels_last else torch.contiguous_format
        self.model.encoder.to(memory_format=self.memory_format)
        self.encoder_index = FlatIndex.of(self.model.encoder)
        self.head_index = FlatIndex.of(self.model.head)
        self.initial_states: dict[int, Any] = {
            client_id: algorithm.init_client(client_id, initial) for client_id in sorted(self.clients)
        }
        # the latest state this host produced or was given per client (for inspection and tests)
        self.client_states: dict[int, Any] = dict(self.initial_states)
        self.tensors = TensorCache(max_bytes=cache_bytes)
        self._own_classes_by_client: dict[int, torch.Tensor] = {}
        # runtime.batched_evaluation: clients sharing an encoder are scored together
        self.batched_evaluation = scenario.runtime.batched_evaluation
        # runtime.batched_training: a round's clients on this host train together (auto: on CUDA)
        requested = scenario.runtime.batched_training
        self.batched_training = self.device.type == "cuda" if requested == "auto" else bool(requested)
        self._replicas: list[SplitModel] = []  # one model per client training at once (batched training)
        self._staging: StagingRows | None = None  # a row of loaded weights per replica (replica_weights.py)
        # New on every (re)start: lets the server tell a restarted host from the one it knew.
        self._generation = uuid.uuid4().hex

    def _precision_scope(self) -> ContextManager[None]:
        """The hooks' forward passes at `runtime.precision` (autocast; nothing for fp32)."""
        from hdcfl_ray.training.precision import autocast

        return autocast(self.precision, self.device)

    def hardware(self) -> dict[str, Any]:
        """What this host computes on, for the manifest."""
        import torch

        from hdcfl_ray.portable.machine import arithmetic_facts
        from hdcfl_ray.runtime.client.device import device_facts

        return {
            **device_facts(self.scenario.runtime, self.device, self.granted_gpu_ids).as_dict(),
            "precision": self.precision,
            "torch_threads": torch_threads_per_host(self.scenario.runtime),
            "channels_last": self.memory_format == torch.channels_last,
            # the CPU under this host and its libraries' instruction sets: hosts on other nodes may differ
            "arithmetic": arithmetic_facts(self.scenario.runtime.portable),
        }

    def bind_thread(self) -> None:
        """Give the calling thread this host's torch thread count (OpenMP keeps the
        count per thread): the local backend runs each host on a thread of its own."""
        import torch

        torch.set_num_threads(torch_threads_per_host(self.scenario.runtime))

    def generation(self) -> str:
        return self._generation

    def actor_name(self) -> str | None:
        """The Ray actor name when running as an actor (for operators and tests)."""
        try:
            import ray

            return ray.get_runtime_context().get_actor_name()
        except Exception:  # not inside an actor
            return None

    def node_id(self) -> str | None:
        """The Ray node this host runs on (None outside Ray): placement shows in the manifest."""
        try:
            import ray

            return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        except Exception:
            return None

    def client_ids(self) -> list[int]:
        return sorted(self.clients)

    # ---- data ----
    def _split_tensors(self, client: ClientData, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        from hdcfl_ray.data.transforms import to_float_batch

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            if split == "train":
                indices, images, labels = client.train_indices, self.train_images, self.train_labels
            elif client.test_from_train:  # a validation split: held out of the client's own training images
                indices, images, labels = client.test_indices, self.train_images, self.train_labels
            else:
                indices, images, labels = client.test_indices, self.test_images, self.test_labels
            inputs = to_float_batch(images[indices], client.shift, self._shift_seed(client, split)).to(self.device)
            if inputs.dim() == 4:
                inputs = inputs.contiguous(memory_format=self.memory_format)
            targets = torch.as_tensor(labels[indices], dtype=torch.long, device=self.device)
            return inputs, targets

        return self.tensors.get((client.client_id, split), build)

    def _shift_seed(self, client: ClientData, split: str) -> int:
        """The seed of the noise a client's feature shift draws (the same every round);
        0 for a shift that draws none (deriving a seed costs more than a small client's
        whole test set)."""
        from hdcfl_ray import seeding
        from hdcfl_ray.data.shifts import shift_draws_noise
        from hdcfl_ray.data.transforms import as_shift

        if not shift_draws_noise(as_shift(client.shift)):
            return 0
        return seeding.int_seed(self.scenario.seed, "feature_shift", client.client_id, 0 if split == "train" else 1)

    def _own_classes(self, client: ClientData) -> torch.Tensor:
        """The sorted classes of the client's training labels, on the host's device, read
        from the stored labels once (scoring must not build the training tensors)."""
        import torch

        classes = self._own_classes_by_client.get(client.client_id)
        if classes is None:
            labels = np.asarray(self.train_labels[client.train_indices])
            classes = torch.as_tensor(np.unique(labels), dtype=torch.long, device=self.device)
            self._own_classes_by_client[client.client_id] = classes
        return classes

    def context(
        self,
        client_id: int,
        round_index: int,
        evaluation_batch: EvaluationBatch | None = None,
        model: SplitModel | None = None,
        training_slot: TrainingSlot | None = None,
    ) -> HostClientContext:
        from hdcfl_ray.data.transforms import shift_uint8
        from hdcfl_ray.runtime.client.client_context import HostClientContext
        from hdcfl_ray.training.local_training import client_generator

        client = self.clients[client_id]
        seed = self.scenario.seed
        return HostClientContext(
            client_id=client_id,
            round_index=round_index,
            seed=seed,
            model=self.model if model is None else model,
            encoder_index=self.encoder_index,
            head_index=self.head_index,
            protocol=self.scenario.protocol,
            generator=lambda: client_generator(seed, client_id, round_index),
            _train_data=lambda: self._split_tensors(client, "train"),
            _test_data=lambda: self._split_tensors(client, "test"),
            _raw_train=lambda: (
                shift_uint8(self.train_images[client.train_indices], client.shift, self._shift_seed(client, "train")),
                np.asarray(self.train_labels[client.train_indices]),
            ),
            _own_classes=lambda: self._own_classes(client),
            _evaluation_batch=evaluation_batch,
            _training_slot=training_slot,
            _replica_weights=None if training_slot is None else self._replica_weights(model),
            _augmentation_settings=self.scenario.dataset.augmentation,
        )

    @staticmethod
    def _objects(object_refs: Mapping[str, Any], task: ClientTask) -> dict[str, Any]:
        return {name: _resolve(object_refs[name]) for name in task.models}

    @staticmethod
    def _resolved_task(task: ClientTask) -> ClientTask:
        return ClientTask(models=task.models, payload={key: _resolve(value) for key, value in task.payload.items()})

    # ---- hooks ----
    def _state(self, client_id: int, state: Any) -> Any:
        """The state the server committed for this client, or its initial state.

        The server is the source of truth: a host restarted by Ray, or an update
        still in flight in an asynchronous run, never leaks into what a client
        trains or is scored with."""
        if isinstance(state, InitialState):
            return self.initial_states[client_id]
        resolved = _resolve(state)
        self.client_states[client_id] = resolved
        return resolved

    def train(
        self, client_id: int, round_index: int, task: ClientTask, object_refs: Mapping[str, Any], state: Any = INITIAL_STATE
    ) -> tuple[Mapping[str, Any], UploadMeta, Any]:
        """Returns (models, meta, the client's state after this update); the server keeps
        the state's ObjectRef and passes it back with the client's next job."""
        started = time.perf_counter()
        task = self._resolved_task(task)
        ctx = self.context(client_id, round_index)
        with self._precision_scope(), _naming_the_clients((client_id,), round_index):
            upload, new_state = self.algorithm.local_update(ctx, self._state(client_id, state), task, self._objects(object_refs, task))
        return self._finish_update(ctx, upload, new_state, time.perf_counter() - started)

    def train_many(self, round_index: int, jobs: list[ClientJob], object_refs: Mapping[str, Any]) -> list[Any]:
        """The updates of several clients in one round, flattened: (models, meta, state)
        per job, in job order (the Ray backend returns each as an ObjectRef of its own).

        With `runtime.batched_training` on, the clients' local updates run side by side
        and their training runs batched (training_rendezvous.py); otherwise one after
        the other, exactly as `train` runs each."""
        if not self.batched_training or len(jobs) < 2:
            flat: list[Any] = []
            for job in jobs:
                flat.extend(self.train(job.client_id, round_index, job.task, object_refs, job.state))
            return flat
        from hdcfl_ray.runtime.client.batched_training import train_together
        from hdcfl_ray.runtime.client.training_rendezvous import TrainingRendezvous

        started = time.perf_counter()
        # everything remote is fetched here, on the host's own thread, before the clients run
        objects = {name: _resolve(ref) for name, ref in object_refs.items()}
        prepared = [
            (job.client_id, self._resolved_task(job.task), self._state(job.client_id, job.state), model)
            for job, model in zip(jobs, self._model_replicas(len(jobs)))
        ]

        def update_of(client_id: int, task: ClientTask, state: Any, model: SplitModel) -> Any:
            def run(slot: TrainingSlot) -> tuple[HostClientContext, Any, Any]:
                ctx = self.context(client_id, round_index, model=model, training_slot=slot)
                with _naming_the_clients((client_id,), round_index):
                    upload, new_state = self.algorithm.local_update(ctx, state, task, {name: objects[name] for name in task.models})
                return ctx, upload, new_state

            return run

        rendezvous: TrainingRendezvous[tuple[HostClientContext, Any, Any]] = TrainingRendezvous(
            train_together, thread_scope=self._client_thread_scope
        )
        # the batched training runs on this thread; its own failure names the group
        with self._precision_scope(), _naming_the_clients(tuple(job.client_id for job in jobs), round_index):
            finished = rendezvous.run([update_of(*job) for job in prepared])
        seconds = (time.perf_counter() - started) / len(jobs)  # the batch's time, shared
        flat = []
        for ctx, upload, new_state in finished:
            flat.extend(self._finish_update(ctx, upload, new_state, seconds, trained_together=ctx.trained_together))
        return flat

    def _model_replicas(self, count: int) -> list[SplitModel]:
        """`count` models of this host's architecture, one per client training at once
        (made once and kept: their weights are loaded by each client's update)."""
        import copy

        from hdcfl_ray.runtime.client.replica_weights import StagingRows

        while len(self._replicas) < count:
            self._replicas.append(copy.deepcopy(self.model))
        if self._staging is None or self._staging.rows != count:
            self._staging = StagingRows.for_model(self.model, self.encoder_index, self.head_index, count)
        return self._replicas[:count]

    def _replica_weights(self, model: SplitModel | None) -> ReplicaWeights | None:
        """Where a batched round's replica `model` has its weights: its staging row
        (None when the model cannot be staged)."""
        from hdcfl_ray.runtime.client.replica_weights import ReplicaWeights

        staging = self._staging
        rows = self._replicas[: staging.rows] if staging is not None else []
        row = next((position for position, replica in enumerate(rows) if replica is model), None)
        return None if staging is None or row is None else ReplicaWeights(rows[row], staging, row)

    @contextmanager
    def _client_thread_scope(self) -> Iterator[None]:
        """A client's thread of a batched round: the host's torch threads and precision."""
        self.bind_thread()
        with self._precision_scope():
            yield

    def _finish_update(
        self, ctx: HostClientContext, upload: Any, new_state: Any, seconds: float, trained_together: int = 1
    ) -> tuple[Mapping[str, Any], UploadMeta, Any]:
        client_id = ctx.client_id
        accepted = _all_finite(upload.models, ctx.known_finite) and _all_finite(dict(upload.values)) and _all_finite(upload.train_loss)
        if accepted:
            self.client_states[client_id] = new_state
        meta = UploadMeta(
            client_id=client_id,
            num_samples=upload.num_samples,
            train_loss=upload.train_loss,
            steps=upload.steps,
            values=upload.values,
            accepted=accepted,
            compute_seconds=seconds,
            host_generation=self._generation,
            budget=ctx.budget,
            models_bytes=payload_bytes(upload.models, lambda value: value),
            trained_together=trained_together,
        )
        return upload.models, meta, self.client_states[client_id]

    def probe(self, jobs: list[ClientJob], round_index: int, object_refs: Mapping[str, Any]) -> tuple[str, dict[int, Mapping[str, Any]]]:
        results = {}
        for job in jobs:
            task = self._resolved_task(job.task)
            with self._precision_scope():
                results[job.client_id] = self.algorithm.probe(
                    self.context(job.client_id, round_index), self._state(job.client_id, job.state), task, self._objects(object_refs, task)
                )
        return self._generation, results

    def evaluate(
        self, jobs: list[ClientJob], round_index: int, object_refs: Mapping[str, Any], final: bool
    ) -> tuple[str, list[EvalReport]]:
        """Each job's evaluation. Scores of shared encoders are computed together once
        every job has been seen (batched_scoring.py); each broadcast object is read
        once for all jobs, so clients given the same object score in one group."""
        from hdcfl_ray.runtime.client.batched_scoring import EvaluationBatch

        batch = EvaluationBatch(self.model, self.encoder_index, self.head_index)
        objects = {name: _resolve(ref) for name, ref in object_refs.items()}
        if self.batched_evaluation:
            for value in objects.values():
                batch.share(value)
        evaluated = []
        with self._precision_scope():
            for job in jobs:
                task = self._resolved_task(job.task)
                ctx = self.context(job.client_id, round_index, evaluation_batch=batch)
                result = self.algorithm.evaluate(ctx, self._state(job.client_id, job.state), task, {name: objects[name] for name in task.models}, final)
                evaluated.append((job.client_id, int(ctx.test_data()[1].shape[0]), result, ctx.budget))
            batch.flush()
        reports = [
            EvalReport(client_id=client_id, num_test_samples=num_test, result=batch.resolve(result), budget=budget)
            for client_id, num_test, result, budget in evaluated
        ]
        return self._generation, reports

    def evaluate_newcomers(
        self, jobs: list[ClientJob], round_index: int, object_refs: Mapping[str, Any], epochs: int
    ) -> tuple[str, list[EvalReport]]:
        """Each newcomer job's evaluation by the method's newcomer rule (runtime/server/newcomers.py),
        from the newcomer's initial state, one client at a time, with `epochs` of training budget."""
        objects = {name: _resolve(ref) for name, ref in object_refs.items()}
        reports = []
        with self._precision_scope():
            for job in jobs:
                task = self._resolved_task(job.task)
                ctx = self.context(job.client_id, round_index)  # no evaluation batch: scores are taken at once
                needed = {name: objects[name] for name in task.models}
                result = self.algorithm.evaluate_newcomer(ctx, self.initial_states[job.client_id], task, needed, epochs)  # type: ignore[attr-defined]
                reports.append(EvalReport(job.client_id, int(ctx.test_data()[1].shape[0]), result, budget=ctx.budget))
        return self._generation, reports

