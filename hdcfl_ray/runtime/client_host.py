"""The client host: a plain object that owns one or more logical clients.

It holds each client's private head (persistent across rounds, never sent to
another client), its data indices and its transform; trains from the broadcast
encoder and evaluates the three references of spec/hdcfl.md. `ClientHostActor`
is the Ray actor around it; the object itself is usable without Ray.
"""

from __future__ import annotations

import numpy as np
import torch

from hdcfl_ray.algorithms.base import LocalTrainingPlan
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.data.partitions.client_data import ClientData
from hdcfl_ray.data.transforms import to_float_batch
from hdcfl_ray.hdcfl.prototypes import personalised_encoder
from hdcfl_ray.models import FlatIndex, SplitModel, build_split_model, flatten_module, load_flat_into
from hdcfl_ray.runtime.local_training import client_generator, evaluate, train_locally
from hdcfl_ray.runtime.messages import EvalJob, EvalReport, EvalStats, TrainReport
from hdcfl_ray.runtime.tensor_cache import TensorCache


class ClientHost:
    def __init__(
        self,
        scenario: Scenario,
        train_images: np.ndarray,
        train_labels: np.ndarray,
        test_images: np.ndarray,
        test_labels: np.ndarray,
        clients: list[ClientData],
        initial_head: np.ndarray,
        num_classes: int,
        plan: LocalTrainingPlan,
        cache_bytes: int = 1 << 30,
    ) -> None:
        cpus = max(1, int(scenario.runtime.num_cpus_per_actor))
        torch.set_num_threads(cpus)
        self.scenario = scenario
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.train_images = train_images
        self.train_labels = train_labels
        self.test_images = test_images
        self.test_labels = test_labels
        self.clients = {client.client_id: client for client in clients}
        self.plan = plan
        # Weights arrive as flat vectors; a pretrained file is read once on the driver.
        skeleton_config = scenario.model.model_copy(update={"pretrained": None})
        self.model: SplitModel = build_split_model(
            skeleton_config, in_channels=int(train_images.shape[3]), num_classes=num_classes, seed=scenario.seed
        )
        self.model.encoder.to(self.device)
        self.model.head.to(self.device)
        self.encoder_index = FlatIndex.of(self.model.encoder)
        self.head_index = FlatIndex.of(self.model.head)
        self.heads = {client_id: np.array(initial_head, dtype=np.float32, copy=True) for client_id in self.clients}
        self.tensors = TensorCache(max_bytes=cache_bytes)

    def client_ids(self) -> list[int]:
        return sorted(self.clients)

    def _split_tensors(self, client: ClientData, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        def build() -> tuple[torch.Tensor, torch.Tensor]:
            if split == "train":
                indices, images, labels = client.train_indices, self.train_images, self.train_labels
            else:
                indices, images, labels = client.test_indices, self.test_images, self.test_labels
            inputs = to_float_batch(images[indices], client.rotation_degrees).to(self.device)
            targets = torch.as_tensor(labels[indices], dtype=torch.long).to(self.device)
            return inputs, targets

        return self.tensors.get((client.client_id, split), build)

    def train(self, client_id: int, round_index: int, global_encoder: np.ndarray) -> tuple[np.ndarray, TrainReport]:
        client = self.clients[client_id]
        load_flat_into(self.model.encoder, global_encoder, self.encoder_index)
        load_flat_into(self.model.head, self.heads[client_id], self.head_index)
        inputs, targets = self._split_tensors(client, "train")
        protocol = self.scenario.protocol
        stats = train_locally(
            self.model,
            inputs,
            targets,
            epochs=protocol.local_epochs,
            batch_size=protocol.batch_size,
            optimizer_config=protocol.optimizer,
            generator=client_generator(self.scenario.seed, client_id, round_index),
            train_head=self.plan.train_head,
        )
        encoder = flatten_module(self.model.encoder)
        head = flatten_module(self.model.head)
        accepted = not stats.nonfinite and bool(np.isfinite(encoder).all() and np.isfinite(head).all())
        if accepted:
            self.heads[client_id] = head
        report = TrainReport(
            client_id=client_id,
            head=self.heads[client_id],
            num_samples=stats.num_samples,
            train_loss=stats.mean_loss,
            steps=stats.steps,
            accepted=accepted,
        )
        return encoder, report

    def evaluate(
        self,
        jobs: list[EvalJob],
        global_encoder: np.ndarray,
        prototypes: np.ndarray | None,
        mix: float,
    ) -> list[EvalReport]:
        import ray  # only the actor path passes ObjectRefs

        reports = []
        for job in jobs:
            client = self.clients[job.client_id]
            inputs, targets = self._split_tensors(client, "test")
            load_flat_into(self.model.head, self.heads[job.client_id], self.head_index)
            global_stats = self._score(global_encoder, inputs, targets)
            local_stats = None
            if job.own_encoder is not None:
                own = job.own_encoder if isinstance(job.own_encoder, np.ndarray) else ray.get(job.own_encoder)
                local_stats = self._score(own, inputs, targets)
            personalised_stats = None
            if prototypes is not None and job.membership is not None:
                mixture = personalised_encoder(global_encoder, prototypes, job.membership, mix)
                personalised_stats = self._score(mixture, inputs, targets)
            reports.append(
                EvalReport(
                    client_id=job.client_id,
                    num_test_samples=int(targets.shape[0]),
                    global_ref=global_stats,
                    local_ref=local_stats,
                    personalised_ref=personalised_stats,
                )
            )
        return reports

    def _score(self, encoder: np.ndarray, inputs: torch.Tensor, targets: torch.Tensor) -> EvalStats:
        load_flat_into(self.model.encoder, encoder, self.encoder_index)
        return evaluate(self.model, inputs, targets)

    def export_heads(self) -> dict[int, np.ndarray]:
        return {client_id: head.copy() for client_id, head in self.heads.items()}
