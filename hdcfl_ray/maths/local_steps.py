"""How far a client's local SGD moves for a unit gradient: the normaliser that turns
a model difference into an average gradient (FedNova's a_k; SCAFFOLD's K).

With heavy-ball momentum rho (the buffer starts as the first gradient, as
`MomentumSGD` does) and a constant gradient g, step j moves the model by
lr * g * (1 + rho + ... + rho^j) = lr * g * (1 - rho^(j+1)) / (1 - rho), so tau steps
move it by lr * g * a with

    a = sum_{j < tau} (1 - rho^(j+1)) / (1 - rho) = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho)

(Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020). Without momentum a = tau."""

from __future__ import annotations


def momentum_step_count(steps: int, momentum: float) -> float:
    """a for `steps` local steps of SGD with `momentum` (module docstring); `steps` when
    momentum is 0, 0.0 when no step was taken."""
    if steps < 0:
        raise ValueError(f"steps must be non-negative, got {steps}")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    if momentum == 0.0:
        return float(steps)
    rho = float(momentum)
    return (steps - rho * (1.0 - rho**steps) / (1.0 - rho)) / (1.0 - rho)


def sgd_only(method: str, optimizer: str) -> str | None:
    """The refusal of a client optimiser other than SGD by a method whose rule counts SGD
    steps (a `MethodSpec.check` problem), or None."""
    if optimizer == "sgd":
        return None
    return (
        f"protocol.optimizer.name: {optimizer} with algorithm.name: {method}, whose rule counts the local "
        "SGD steps (with their momentum); set protocol.optimizer.name: sgd"
    )
