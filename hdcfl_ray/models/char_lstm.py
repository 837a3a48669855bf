"""A character model for next-character prediction, split as every model here is: an
encoder (an embedding and a stack of LSTM layers, as in LEAF's and FedJAX's Shakespeare
models) whose last layer's final hidden state is the feature, and the linear head each
client keeps. Its sizes are scenario keys: `model.embedding_dim`, `model.feature_dim` (each
layer's units) and `model.lstm_layers`; the defaults (8, 64 in the scenario, 1) are the
CPU-sized model, and `leaf_lstm.py` fixes LEAF's own sizes.

Text reaches every model as the runtime carries images: a sequence of L character ids is
stored as a uint8 "image" (L, 1, 1) and arrives as the float batch (B, 1, L, 1) that
`data.transforms.to_float_batch` makes of any image (x / 255 * 2 - 1, an exact affine map),
so clients, scoring, batching and every method run on text unchanged; the encoder reads
the ids back first.

One client trains through torch's fused LSTM kernel. Clients trained together
(`torch.func.vmap`, runtime.batched_training) run the same LSTM written out over the
time steps and layers with the same weights, since the fused kernel has no batching
rule: the two paths compute the same function (tests/test_char_lstm.py)."""

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
    """Encoder: ids (B, 1, L, 1) -> the last layer's hidden state after the last step (B, feature_dim)."""

    def __init__(self, feature_dim: int = 64, embedding_dim: int = 8, num_layers: int = 1) -> None:
        super().__init__()
        if feature_dim < 1 or embedding_dim < 1 or num_layers < 1:
            raise ValueError(
                f"CharLSTM needs positive sizes, got feature_dim={feature_dim}, embedding_dim={embedding_dim}, "
                f"num_layers={num_layers}"
            )
        self.feature_dim = feature_dim
        self.num_layers = num_layers
        self.embedding = nn.Embedding(_SYMBOLS, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, feature_dim, num_layers=num_layers, batch_first=True)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        embedded = self.embedding(ids_from_batch(batch))  # (B, L, E)
        if not (_inside_vmap(embedded) or _inside_vmap(self.lstm.weight_ih_l0)):
            _, (hidden, _) = self.lstm(embedded)
            return hidden[-1]
        return self.stepwise(embedded)

    def stepwise(self, embedded: torch.Tensor) -> torch.Tensor:
        """The LSTM over the time steps, layer after layer, with its own weights: what vmap
        can batch. Each layer below the last hands its hidden state at every step up."""
        sequence = embedded
        for layer in range(self.num_layers - 1):
            sequence = torch.stack(self._layer_steps(sequence, layer), dim=1)
        return self._layer_steps(sequence, self.num_layers - 1)[-1]

    def _layer_steps(self, inputs: torch.Tensor, layer: int) -> list[torch.Tensor]:
        """One layer's hidden state (B, H) after each step of its (B, L, in) inputs (gates in
        torch's order: input, forget, cell, output)."""
        weight_ih, weight_hh = (getattr(self.lstm, f"weight_{kind}_l{layer}") for kind in ("ih", "hh"))
        bias_ih, bias_hh = (getattr(self.lstm, f"bias_{kind}_l{layer}") for kind in ("ih", "hh"))
        gates_in = inputs @ weight_ih.T + bias_ih + bias_hh  # every step's input half at once
        hidden = gates_in.new_zeros(gates_in.shape[0], self.feature_dim)
        cell = torch.zeros_like(hidden)
        hiddens: list[torch.Tensor] = []
        for step in range(gates_in.shape[1]):
            gates = gates_in[:, step] + hidden @ weight_hh.T
            input_gate, forget_gate, candidate, output_gate = gates.chunk(4, dim=-1)
            cell = torch.sigmoid(forget_gate) * cell + torch.sigmoid(input_gate) * torch.tanh(candidate)
            hidden = torch.sigmoid(output_gate) * torch.tanh(cell)
            hiddens.append(hidden)
        return hiddens
