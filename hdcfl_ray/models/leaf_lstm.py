"""LEAF's Shakespeare model as an encoder (`model.encoder: leaf_lstm`).

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018) predicts the next
character of Shakespeare's roles with `models/shakespeare/stacked_lstm.py`: an embedding of
8 per character, two stacked LSTM layers of 256 units read over the 80-character window,
and a dense layer from the last step's 256 outputs to the vocabulary. Here the dense layer
is the client's head, as every model of this project is split (`split_model.py`), and the
embedding and the LSTM stack are the encoder: its 256 features are the second layer's
hidden state after the last character.

It is `char_lstm` (`char_lstm.py`) at LEAF's sizes, so it reads text as char_lstm does
and trains batched (vmap over its stepwise form) as char_lstm does. Its parameter count
differs from LEAF's TensorFlow model (817,872 for 80 classes) by three things that leave
the function the same: the embedding has a row for each of the 256 ids a uint8 can hold
(1,408 more than LEAF's 80; rows of ids the text never holds get no gradient), torch
keeps two bias vectors per LSTM layer whose sum is TensorFlow's one (2,048 more), and the
text sources here have an 81st class for characters outside LEAF's 80 (257 more in the
head). Weights start at torch's default initialisation, not TensorFlow's, and torch's LSTM
has no constant forget-gate bias of 1 (TensorFlow's BasicLSTMCell adds one).
"""

from __future__ import annotations

from hdcfl_ray.models.char_lstm import CharLSTM

EMBEDDING_DIM = 8
HIDDEN_SIZE = 256
LAYERS = 2


class LeafShakespeareLSTM(CharLSTM):
    """Encoder: ids (B, 1, L, 1) -> the second LSTM layer's last hidden state (B, 256)."""

    def __init__(self) -> None:
        super().__init__(feature_dim=HIDDEN_SIZE, embedding_dim=EMBEDDING_DIM, num_layers=LAYERS)
