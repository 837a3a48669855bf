"""A character model for next-character prediction, split as every model here is: an
encoder (an embedding and an LSTM, as in LEAF's and FedJAX's Shakespeare models, sized
for a CPU) whose last hidden state is the feature, and the linear head each client keeps.

Text reaches every model as the runtime carries images: a sequence of L character ids is
stored as a uint8 "image" (L, 1, 1) and arrives as the float batch (B, 1, L, 1) that
`data.transforms.to_float_batch` makes of any image (x / 255 * 2 - 1, an exact affine map),
so clients, scoring, batching and every method run on text unchanged; the encoder reads
the ids back first.

One client trains through torch's fused LSTM kernel. Clients trained together
(`torch.func.vmap`, runtime.batched_training) run the same LSTM written out over the
time steps with the same weights, since the fused kernel has no batching rule: the two
paths compute the same function (tests/test_char_lstm.py)."""

from __future__ import annotations

import torch
from torch import nn

# the ids a uint8 can hold: any vocabulary of up to 256 symbols embeds without knowing its size
_SYMBOLS = 256


def ids_from_batch(batch: torch.Tensor) -> torch.Tensor:
    """The character ids of a float batch (B, 1, L, 1) that to_float_batch made of uint8 ids."""
    return torch.round((batch.flatten(1) + 1.0) * 127.5).clamp(0, _SYMBOLS - 1).long()


def _inside_vmap(tensor: torch.Tensor) -> bool:
    return bool(torch._C._functorch.is_batchedtensor(tensor))


class CharLSTM(nn.Module):
    def __init__(self, feature_dim: int = 64, embedding_dim: int = 8) -> None:
        super().__init__()
        self.feature_dim = feature_dim
        self.embedding = nn.Embedding(_SYMBOLS, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, feature_dim, batch_first=True)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        embedded = self.embedding(ids_from_batch(batch))  # (B, L, E)
        if not (_inside_vmap(embedded) or _inside_vmap(self.lstm.weight_ih_l0)):
            _, (hidden, _) = self.lstm(embedded)
            return hidden[-1]
        return self.stepwise(embedded)

    def stepwise(self, embedded: torch.Tensor) -> torch.Tensor:
        """The LSTM over the time steps with its own weights (gates in torch's order: input,
        forget, cell, output): what vmap can batch."""
        lstm = self.lstm
        gates_in = embedded @ lstm.weight_ih_l0.T + lstm.bias_ih_l0 + lstm.bias_hh_l0  # every step's input half at once
        hidden = gates_in.new_zeros(gates_in.shape[0], self.feature_dim)
        cell = torch.zeros_like(hidden)
        for step in range(gates_in.shape[1]):
            gates = gates_in[:, step] + hidden @ lstm.weight_hh_l0.T
            input_gate, forget_gate, candidate, output_gate = gates.chunk(4, dim=-1)
            cell = torch.sigmoid(forget_gate) * cell + torch.sigmoid(input_gate) * torch.tanh(candidate)
            hidden = torch.sigmoid(output_gate) * torch.tanh(cell)
        return hidden
