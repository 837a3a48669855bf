"""A character n-gram count model for next-character prediction: the trivial text
reference a results table sets beside the methods (diagnostics/trivial_reference.py).

Order n reads up to n - 1 preceding characters. It is fitted on (window, next
character) pairs, the samples a next-character model trains on: for every context
length k = 0 .. n - 1 it counts each pair's next character after the window's last k
characters. Only the character that follows a window is counted, never the characters
inside it: where windows overlap (cut every character), the characters inside a
training window are the next characters of the windows held out beside it.
Predicting backs off: the longest context of the window's last characters that was
seen in training predicts its most frequent next character; a context never seen falls
back to the next shorter one, down to the most frequent next character overall (the
argmax form of a back-off / stupid-backoff count model). Ties go to the smallest
character id, so a fit is deterministic. Plain numpy: sorting one key per pair and
order is the whole cost."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_ORDER = 4


@dataclass(frozen=True)
class CharNgram:
    """A fitted model. `contexts[k]` holds the sorted keys of the k-character contexts
    seen in training (the characters as digits base `vocabulary`, the oldest first) and
    `next_chars[k]` the most frequent character after each; `contexts[0]` is the one
    empty context, so every window gets a prediction."""

    order: int
    vocabulary: int
    contexts: tuple[np.ndarray, ...]
    next_chars: tuple[np.ndarray, ...]


def fit_char_ngram(windows: np.ndarray, next_chars: np.ndarray, vocabulary: int, order: int = DEFAULT_ORDER) -> CharNgram:
    """Count the pairs of `windows` (N, L) and `next_chars` (N,), character ids in
    0 .. vocabulary - 1."""
    codes = _checked(windows, vocabulary, order)
    following = np.asarray(next_chars, dtype=np.int64)
    if following.shape != (codes.shape[0],):
        raise ValueError(f"{codes.shape[0]} windows but next characters of shape {following.shape}")
    if following.size == 0:
        raise ValueError("an n-gram needs at least one training window")
    if following.min() < 0 or following.max() >= vocabulary:
        raise ValueError(f"next characters must lie in 0..{vocabulary - 1}")
    longest = min(order - 1, codes.shape[1])
    contexts, best_next = [], []
    for length in range(longest + 1):
        keys = _key(codes[:, codes.shape[1] - length :], vocabulary) * vocabulary + following
        seen_contexts, most_frequent = _most_frequent_next(keys, vocabulary)
        contexts.append(seen_contexts)
        best_next.append(most_frequent)
    return CharNgram(order, vocabulary, tuple(contexts), tuple(best_next))


def predict_next(model: CharNgram, windows: np.ndarray) -> np.ndarray:
    """The predicted next character of each window (N, L): the longest seen context of
    its last characters, backing off to shorter ones."""
    codes = _checked(windows, model.vocabulary, model.order)
    predicted = np.full(codes.shape[0], -1, dtype=np.int64)
    for length in range(min(len(model.contexts) - 1, codes.shape[1]), -1, -1):
        open_rows = np.flatnonzero(predicted < 0)
        if open_rows.size == 0:
            break
        keys = _key(codes[open_rows, codes.shape[1] - length :], model.vocabulary)
        seen = model.contexts[length]
        where = np.minimum(np.searchsorted(seen, keys), seen.size - 1)
        found = seen[where] == keys
        predicted[open_rows[found]] = model.next_chars[length][where[found]]
    return predicted


def _checked(codes: np.ndarray, vocabulary: int, order: int) -> np.ndarray:
    if order < 1:
        raise ValueError(f"n-gram order {order}: use 1 or more")
    if vocabulary < 1 or vocabulary**order >= 2**62:
        raise ValueError(f"vocabulary {vocabulary} with order {order}: the keys must fit 62 bits")
    array = np.asarray(codes)
    if array.ndim != 2:
        raise ValueError(f"character ids must be (N, L), got shape {array.shape}")
    if array.size and (array.min() < 0 or array.max() >= vocabulary):
        raise ValueError(f"character ids must lie in 0..{vocabulary - 1}")
    return array


def _key(columns: np.ndarray, vocabulary: int) -> np.ndarray:
    """Each row's characters read as one number, digits base `vocabulary`, the oldest
    first (0 for no characters)."""
    key = np.zeros(columns.shape[0], dtype=np.int64)
    for column in range(columns.shape[1]):
        key *= vocabulary
        key += columns[:, column]
    return key


def _most_frequent_next(keys: np.ndarray, vocabulary: int) -> tuple[np.ndarray, np.ndarray]:
    """From the keys (context * vocabulary + next), the sorted distinct contexts and the
    most frequent next character of each (the smallest id among ties)."""
    ordered = np.sort(keys)
    if ordered.size == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    pairs = ordered[starts].astype(np.int64)
    counts = np.diff(np.append(starts, ordered.size))
    context, following = pairs // vocabulary, pairs % vocabulary
    # pairs are sorted by context, then by next character: one run per context
    run_starts = np.flatnonzero(np.concatenate(([True], context[1:] != context[:-1])))
    run_of = np.repeat(np.arange(run_starts.size), np.diff(np.append(run_starts, context.size)))
    most = np.maximum.reduceat(counts, run_starts)
    # the first pair of a run reaching its maximum: the smallest character among ties
    at_max = np.flatnonzero(counts == most[run_of])
    first_at_max = at_max[np.concatenate(([True], run_of[at_max][1:] != run_of[at_max][:-1]))]
    return context[run_starts], following[first_at_max]
