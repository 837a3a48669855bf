"""Trivial references: what a model that learned nothing federated scores on exactly
the samples each client is scored on, so a results table can show whether the methods
beat it.

* majority class (pooled): the most frequent class of the clients' pooled training
  labels, predicted for every sample of every client;
* majority class (own): each client's own most frequent training class;
* pooled n-gram (text): a character n-gram (diagnostics/char_ngram.py) fitted on the
  pooled training windows, predicting each scored window's next character;
* own n-gram (text): the same fitted on each client's own training windows.

Ties go to the smallest class id. Each reference's per-client accuracies are summarised
as the methods' are (diagnostics/fairness.py: mean, worst, bottom 20%, best, gap)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hdcfl_ray.diagnostics.char_ngram import DEFAULT_ORDER, CharNgram, fit_char_ngram, predict_next
from hdcfl_ray.diagnostics.fairness import client_accuracy_summary

MAJORITY_POOLED = "majority class (pooled)"
MAJORITY_OWN = "majority class (own)"
NGRAM_POOLED = "pooled n-gram"
NGRAM_OWN = "own n-gram"
REFERENCE_NAMES = (MAJORITY_POOLED, MAJORITY_OWN, NGRAM_POOLED, NGRAM_OWN)
# the summary of a reference's client accuracies under the rounds table's column names
SUMMARY_COLUMNS = {"mean": "mean_accuracy", "worst": "worst_accuracy", "bottom20": "bottom20_accuracy", "best": "best_accuracy", "gap": "gap"}

# what a reference predicts for a client: (the client, the windows of the split it is scored on) -> classes
Predictor = Callable[["ClientSamples", "np.ndarray | None"], np.ndarray]


@dataclass(frozen=True)
class ClientSamples:
    """One client as the references read it: its training samples (indices into the
    training split) and the samples it is scored on (indices into the test split, or
    into the training split when `scored_from_train`: a validation split)."""

    train: np.ndarray
    scored: np.ndarray
    scored_from_train: bool = False


@dataclass(frozen=True)
class Splits:
    """The labels of both splits and, for text, their windows (N, L) of character ids."""

    train_labels: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    train_windows: np.ndarray | None = None
    test_windows: np.ndarray | None = None

    @property
    def text(self) -> bool:
        return self.train_windows is not None and self.test_windows is not None


def majority_class(labels: np.ndarray, num_classes: int) -> int:
    """The most frequent label (the smallest among ties; 0 for no labels)."""
    return int(np.argmax(np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)))


def pooled_training(clients: Sequence[ClientSamples]) -> np.ndarray:
    """The clients' training samples pooled (indices into the training split)."""
    return np.concatenate([client.train for client in clients]) if clients else np.empty(0, dtype=np.int64)


def reference_accuracies(
    clients: Sequence[ClientSamples],
    splits: Splits,
    pooled_train: np.ndarray | None = None,
    order: int = DEFAULT_ORDER,
    own_ngram: bool = True,
) -> dict[str, np.ndarray]:
    """Reference name -> each client's accuracy (a fraction; NaN for a client scored on
    no sample). `pooled_train`: the federation's training samples the pooled references
    are fitted on (default: the clients'); the n-gram references only when `splits` holds text."""
    if pooled_train is None:
        pooled_train = pooled_training(clients)
    pooled_class = majority_class(splits.train_labels[pooled_train], splits.num_classes)
    accuracies = {
        MAJORITY_POOLED: _accuracies(clients, splits, lambda client, _: np.full(client.scored.shape[0], pooled_class)),
        MAJORITY_OWN: _accuracies(
            clients, splits,
            lambda client, _: np.full(client.scored.shape[0], majority_class(splits.train_labels[client.train], splits.num_classes)),
        ),
    }  # fmt: skip
    if not splits.text:
        return accuracies
    assert splits.train_windows is not None and splits.test_windows is not None
    # the model reads no more than a window's last order - 1 characters: views of those
    # keep the copies below small however long the windows are
    context = min(order - 1, splits.train_windows.shape[1])
    train_windows = splits.train_windows[:, splits.train_windows.shape[1] - context :]
    splits = replace(splits, train_windows=train_windows, test_windows=splits.test_windows[:, splits.test_windows.shape[1] - context :])
    pooled = fit_char_ngram(train_windows[pooled_train], splits.train_labels[pooled_train], splits.num_classes, order)
    predicted = {True: _predict_scored(pooled, clients, splits, True), False: _predict_scored(pooled, clients, splits, False)}
    accuracies[NGRAM_POOLED] = _accuracies(clients, splits, lambda client, _: predicted[client.scored_from_train][client.scored])
    if own_ngram:
        def own(client: ClientSamples, windows: np.ndarray | None) -> np.ndarray:
            assert windows is not None
            if client.train.shape[0] == 0:  # nothing to count: no prediction is right
                return np.full(client.scored.shape[0], -1)
            model = fit_char_ngram(train_windows[client.train], splits.train_labels[client.train], splits.num_classes, order)
            return predict_next(model, windows[client.scored])

        accuracies[NGRAM_OWN] = _accuracies(clients, splits, own)
    return accuracies


def summaries(accuracies: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Reference name -> mean, worst, bottom-20%, best accuracy and gap over its clients,
    under the rounds table's column names (SUMMARY_COLUMNS)."""
    return {
        name: {column: summary[key] for key, column in SUMMARY_COLUMNS.items()}
        for name, summary in ((name, client_accuracy_summary(values)) for name, values in accuracies.items())
    }


def _accuracies(clients: Sequence[ClientSamples], splits: Splits, predict: Predictor) -> np.ndarray:
    """Each client's accuracy of `predict(client, windows of its scored split)`."""
    values = np.full(len(clients), np.nan)
    for position, client in enumerate(clients):
        if client.scored.shape[0] == 0:
            continue
        labels = splits.train_labels if client.scored_from_train else splits.test_labels
        windows = splits.train_windows if client.scored_from_train else splits.test_windows
        values[position] = float(np.mean(predict(client, windows) == labels[client.scored]))
    return values


def _predict_scored(model: CharNgram, clients: Sequence[ClientSamples], splits: Splits, from_train: bool) -> np.ndarray:
    """The model's prediction for every sample of one split that some client is scored
    on (each predicted once, however many clients share it); -1 elsewhere."""
    windows = splits.train_windows if from_train else splits.test_windows
    assert windows is not None
    predicted = np.full(windows.shape[0], -1, dtype=np.int64)
    wanted = [client.scored for client in clients if client.scored_from_train == from_train]
    if wanted:
        rows = np.unique(np.concatenate(wanted))
        predicted[rows] = predict_next(model, windows[rows])
    return predicted
