"""A training or scoring loop's loss sum and non-finite flag, kept on the device (torch
only: methods with a loop of their own use it too, below the rest of the library)."""

from __future__ import annotations

import torch


class DeviceTally:
    """A loop's loss sum and non-finite flag, kept on the device so a training or
    scoring loop never waits for the GPU; read once at the end (`read`).

    The sum is float64, as the Python float it replaces was, so CPU results are
    the same bits as summing `float(loss) * n` on the host."""

    def __init__(self, device: torch.device) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.finite = torch.ones((), dtype=torch.bool, device=device)

    def add(self, loss: torch.Tensor, count: int) -> None:
        """`loss` is a batch mean over `count` samples (or, with count 1, a sum)."""
        loss = loss.detach()
        self.finite &= torch.isfinite(loss)
        self.loss_sum += loss.double() * count

    def note_finite(self, loss: torch.Tensor) -> None:
        """Only the flag: a loss that must be finite but is not summed."""
        self.finite &= torch.isfinite(loss.detach())

    def all_finite(self) -> bool:
        return bool(self.finite)  # one host-device sync

    def total(self) -> float:
        return float(self.loss_sum)
