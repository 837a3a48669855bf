"""Where `protocol.server_optimizer` cannot apply: what the scenario check says, naming the
key and the fix. The default (the clients' mean itself) applies everywhere."""

from __future__ import annotations

from hdcfl_ray.contract import ServerOptimizerConfig

_KEEP_DEFAULT = "remove protocol.server_optimizer (the default, sgd at lr 1, takes the clients' mean itself)"


def server_optimizer_problem(
    optimizer: ServerOptimizerConfig, mode: str, aggregation: str, server_lr: float, method: str, applies: bool
) -> str | None:
    """What is wrong with stepping the shared models with `optimizer` in this scenario, or None."""
    if optimizer.is_identity:
        return None
    chosen = f"protocol.server_optimizer.name: {optimizer.name} (lr {optimizer.lr:g})"
    if not applies:  # MethodSpec.applies_server_optimizer
        return (
            f"{chosen} with algorithm.name: {method}, a method the server optimiser does not apply to (it shares no "
            f"model, or its MethodSpec does not declare applies_server_optimizer): {_KEEP_DEFAULT}, or run a method "
            "that shares a model"
        )
    if mode == "async" and aggregation == "fedasync":
        return (
            f"{chosen} with protocol.asynchronous.aggregation: fedasync, which mixes each update into the model as "
            f"it lands (protocol.asynchronous.mixing) and takes no server step: set protocol.asynchronous.aggregation: "
            f"fedbuff (the optimiser then steps on each flushed buffer), or {_KEEP_DEFAULT}"
        )
    if mode == "async" and server_lr != 1.0:
        return (
            f"{chosen} with protocol.asynchronous.server_lr: {server_lr:g}; the optimiser's lr is FedBuff's server step: "
            f"set protocol.server_optimizer.lr instead and remove protocol.asynchronous.server_lr"
        )
    return None
