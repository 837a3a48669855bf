"""The manifest's `trivial_references` record, made on the driver before round 1: the
trivial references of diagnostics/trivial_reference.py on exactly the samples each
client is scored on (its test samples; with `partition.validation_fraction` the share
held out of its own training samples; with `partition.test_set: whole_split` the whole
test split), over the clients every evaluated round scores (`protocol.eval_clients`),
the pooled references fitted on the training samples of every client that trains (never
a newcomer's: `partition.newcomers` are scored apart and never train). Feature shifts change
images, not labels, and text is never shifted (preflight refuses it), so the references
read the labels and character windows as stored."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from hdcfl_ray.diagnostics.char_ngram import DEFAULT_ORDER
from hdcfl_ray.diagnostics.trivial_reference import (
    MAJORITY_POOLED,
    ClientSamples,
    Splits,
    majority_class,
    pooled_training,
    reference_accuracies,
    summaries,
)
from hdcfl_ray.errors import failure_text

if TYPE_CHECKING:
    from hdcfl_ray.data.dataset import ImageDataset
    from hdcfl_ray.data.partitions.client_data import Partition
    from hdcfl_ray.runtime.preflight import PreparedRun

RECORD_KEY = "trivial_references"
# digits kept of each client's accuracy in the manifest (the summaries use the exact values)
_DIGITS = 6


def trivial_reference_record(prepared: PreparedRun) -> dict[str, Any]:
    """The record of a run about to start; a failure is recorded, never raised (the
    references describe the run, they are no part of it)."""
    from hdcfl_ray.data.partitions.newcomers import scenario_newcomers
    from hdcfl_ray.runtime.server.sampling import evaluation_sample

    scenario, partition = prepared.scenario, prepared.partition
    newcomers = scenario_newcomers(scenario)
    scored = evaluation_sample(partition.num_clients, scenario.protocol.eval_clients, scenario.seed, newcomers)
    held_out = set(newcomers)
    trained = tuple(client_id for client_id in range(partition.num_clients) if client_id not in held_out)
    try:
        return reference_record(prepared.dataset, partition, scored, trained_clients=trained)
    except Exception as error:  # a diagnostic's failure must not stop the run
        return {"error": failure_text(error)}


def reference_record(
    dataset: ImageDataset,
    partition: Partition,
    scored_clients: tuple[int, ...],
    order: int = DEFAULT_ORDER,
    trained_clients: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """The references over `scored_clients` (client ids) of `partition`, the pooled ones
    fitted on the training samples of `trained_clients` (default: every client)."""
    started = time.perf_counter()
    every_client = [ClientSamples(client.train_indices, client.test_indices, client.test_from_train) for client in partition.clients]
    scored = [every_client[client_id] for client_id in scored_clients]
    trained = range(partition.num_clients) if trained_clients is None else trained_clients
    pooled_train = pooled_training([every_client[client_id] for client_id in trained])
    splits = Splits(
        train_labels=dataset.train_labels,
        test_labels=dataset.test_labels,
        num_classes=dataset.num_classes,
        # a text sample is (L, 1, 1) character ids (data/sources/text.py)
        train_windows=dataset.train_images.reshape(dataset.train_images.shape[0], -1) if dataset.text else None,
        test_windows=dataset.test_images.reshape(dataset.test_images.shape[0], -1) if dataset.text else None,
    )
    accuracies = reference_accuracies(scored, splits, pooled_train, order=order)
    references: dict[str, dict[str, Any]] = {
        name: {
            **{column: None if np.isnan(value) else value for column, value in summary.items()},
            "client_accuracies": [None if np.isnan(value) else round(float(value), _DIGITS) for value in accuracies[name]],
        }
        for name, summary in summaries(accuracies).items()
    }
    pooled_class = majority_class(dataset.train_labels[pooled_train], dataset.num_classes)
    references[MAJORITY_POOLED].update(predicted_class=pooled_class, predicted_class_name=dataset.classes[pooled_class])
    return {
        "scored_on": "validation" if any(client.scored_from_train for client in scored) else "test",
        "clients": len(scored_clients),
        # the clients each `client_accuracies` entry belongs to, where not all are scored (eval_clients, newcomers)
        **({"client_ids": [int(client_id) for client_id in scored_clients]} if len(scored_clients) < partition.num_clients else {}),
        **({"ngram_order": order} if dataset.text else {}),
        "references": references,
        "seconds": round(time.perf_counter() - started, 3),
    }
