"""APFL, adaptive personalized federated learning (Deng et al. 2020): a global model w
trained and averaged as FedAvg's, and per client a personal model v_k and a mixing
weight alpha_k. The client is judged by the mixture m_k = alpha_k v_k + (1 - alpha_k) w.

Each local step on a batch, as in the paper's algorithm 1:
1. w <- w - lr * grad_w L(w)                       (the client's share of the global model)
2. v <- v - lr * grad_v L(alpha v + (1 - alpha) w)  (the personal model, through the mixture)
3. alpha <- clip(alpha - alpha_lr * dL(m)/dalpha, 0, 1), with
   dL(m)/dalpha = <grad_m L(m), v - w>             (only when `adaptive`)
The mixture in steps 2-3 uses w as it was before step 1 of the same batch.

Choices made here:
- The protocol's SGD (learning rate, momentum, weight decay; a fresh momentum buffer per
  round, as every method's local training), for w and v alike; alpha takes plain gradient
  steps. One batch order per epoch from the client's seeded numpy stream, the protocol's
  batch size and local epochs.
- The mixture is taken over parameters; BatchNorm statistics are the model's own running
  ones, updated by both forward passes, and at test time the flat vectors (statistics
  included) are mixed with the same alpha.
- v_k starts from the shared initial model, alpha_k from `alpha_init`; neither travels.
  Both forward/backward passes count in the budget (2 x FedAvg's samples).
- Scored with the mixture (`personalized`); the global model is logged beside it (`global`).
- Under privacy (docs/privacy.md) the client sends the clipped update of its copy of w
  (the w it reached minus the w it downloaded) and nothing else: v_k and alpha_k stay on
  the client; the server steps with the noised mean, as FedAvg's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from pydantic import Field

from hdcfl_ray.algorithms.fedavg import FedAvg
from hdcfl_ray.algorithms.newcomer_training import fine_tuned
from hdcfl_ray.algorithms.private_updates import clipped_update, private_upload
from hdcfl_ray.contract import (
    ClientContext,
    ClientTask,
    EvalResult,
    MethodSpec,
    ModelParams,
    PrivacyRule,
    ResolvedPrivacy,
    Section,
    ServerOptimizerConfig,
    Upload,
)

# numpy_rng stream of APFL's batch order (kept apart from other client-side draws)
BATCH_ORDER_STREAM = 0xA9F1


class APFLParams(Section):
    """The personal model and its mixing weight (Deng et al. 2020)."""

    alpha_init: float = Field(0.5, ge=0.0, le=1.0, description="alpha_k at the start: the personal model's weight in the mixture")
    alpha_lr: float = Field(0.01, gt=0.0, description="learning rate of alpha_k (a plain SGD step on the mixture's loss)")
    adaptive: bool = Field(True, description="learn alpha_k by gradient descent on the mixture's loss; false keeps alpha_init")


@dataclass
class APFLClient:
    """A client's personal model v_k and mixing weight alpha_k."""

    personal: ModelParams
    alpha: float


def mixture(personal: ModelParams, global_model: ModelParams, alpha: float) -> ModelParams:
    """alpha v + (1 - alpha) w over the flat vectors (float64 arithmetic, float32 result)."""
    assert personal.head is not None and global_model.head is not None

    def mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (alpha * a.astype(np.float64) + (1.0 - alpha) * b.astype(np.float64)).astype(np.float32)

    return ModelParams(mix(personal.encoder, global_model.encoder), mix(personal.head, global_model.head))


def sgd_step(parameters: Mapping[str, Any], grads: Any, buffers: dict[str, Any], lr: float, momentum: float, decay: float) -> dict[str, Any]:
    """One step of the protocol's SGD (weight decay into the gradient, heavy-ball momentum
    with a fresh buffer each round), on detached tensors; `buffers` is updated in place."""
    stepped = {}
    for (name, tensor), grad in zip(parameters.items(), grads):
        value = tensor.detach()
        direction = grad + decay * value
        if momentum > 0:
            direction = direction if name not in buffers else buffers[name].mul(momentum).add(direction)
            buffers[name] = direction
        stepped[name] = value - lr * direction
    return stepped


class APFL(FedAvg):
    name = "apfl"

    def __init__(
        self,
        params: APFLParams,
        server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig(),
        privacy: ResolvedPrivacy | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(server_optimizer, privacy=privacy, seed=seed)
        self.params = params

    def init_client(self, client_id: int, initial: ModelParams) -> APFLClient:
        assert initial.head is not None
        personal = ModelParams(np.array(initial.encoder, np.float32), np.array(initial.head, np.float32))
        return APFLClient(personal=personal, alpha=float(self.params.alpha_init))

    def local_update(
        self, ctx: ClientContext, state: APFLClient, task: ClientTask, objects: Mapping[str, Any]
    ) -> tuple[Upload, APFLClient]:
        import torch  # client side only: the server never imports torch
        from torch import nn
        from torch.func import functional_call

        from hdcfl_ray.training.tally import DeviceTally

        model = nn.Sequential(ctx.model.encoder, ctx.model.head)
        ctx.load(state.personal)
        personal = {name: p.detach().clone() for name, p in model.named_parameters()}
        ctx.load(objects["global"])  # the module now holds w (parameters and statistics)
        shared = {name: p.detach().clone() for name, p in model.named_parameters()}
        alpha = float(state.alpha)
        optimizer = ctx.protocol.optimizer
        lr, momentum, decay = optimizer.lr, optimizer.momentum, optimizer.weight_decay
        momentum_w: dict[str, Any] = {}
        momentum_v: dict[str, Any] = {}
        inputs, labels = ctx.train_data()
        count, batch = int(labels.shape[0]), ctx.protocol.batch_size
        rng = ctx.numpy_rng(BATCH_ORDER_STREAM)
        model.train()
        tally = DeviceTally(labels.device)  # the w pass's loss and both passes' finiteness, read once after the loop
        steps, seen = 0, 0
        for _ in range(ctx.protocol.local_epochs):
            order = torch.as_tensor(rng.permutation(count), dtype=torch.long, device=labels.device)
            for start in range(0, count, batch):
                index = order[start : start + batch]
                x, y = ctx.training_batch(inputs[index]), labels[index]
                w = {name: t.requires_grad_(True) for name, t in shared.items()}
                loss_w = nn.functional.cross_entropy(functional_call(model, w, (x,)), y)
                grads_w = torch.autograd.grad(loss_w, list(w.values()))
                v = {name: t.requires_grad_(True) for name, t in personal.items()}
                a = torch.tensor(alpha, dtype=inputs.dtype, device=labels.device, requires_grad=self.params.adaptive)
                mixed = {name: a * v[name] + (1.0 - a) * shared[name].detach() for name in v}
                loss_m = nn.functional.cross_entropy(functional_call(model, mixed, (x,)), y)
                wanted = [*v.values(), a] if self.params.adaptive else list(v.values())
                grads_m = torch.autograd.grad(loss_m, wanted)
                with torch.no_grad():
                    shared = sgd_step(w, grads_w, momentum_w, lr, momentum, decay)
                    personal = sgd_step(v, grads_m, momentum_v, lr, momentum, decay)
                    if self.params.adaptive:  # alpha's step needs its gradient on the host: one read per step
                        alpha = float(np.clip(alpha - self.params.alpha_lr * float(grads_m[-1]), 0.0, 1.0))
                tally.add(loss_w, int(y.shape[0]))
                tally.note_finite(loss_m)
                steps += 1
                seen += int(y.shape[0])
        ctx.count_training(2 * seen, 2 * steps)  # the w pass and the mixture pass
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter.copy_(personal[name])
        personal_model = ctx.snapshot()
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter.copy_(shared[name])
        global_update = ctx.snapshot()
        train_loss = tally.total() / max(seen, 1) if tally.all_finite() else float("nan")
        if "clip" in task.payload:  # privacy: the clipped update of w; v_k and alpha_k stay here
            clip = float(task.payload["clip"])
            update, norm = clipped_update(objects["global"], global_update, clip, with_head=True)
            upload = private_upload(ctx.client_id, count, train_loss, steps, update, norm, clip)
            return upload, APFLClient(personal=personal_model, alpha=alpha)
        upload = Upload(
            client_id=ctx.client_id,
            num_samples=count,
            train_loss=train_loss,
            steps=steps,
            models={"model": global_update},
            values={"alpha": alpha},
        )
        return upload, APFLClient(personal=personal_model, alpha=alpha)

    def evaluate(
        self, ctx: ClientContext, state: APFLClient, task: ClientTask, objects: Mapping[str, Any], final: bool
    ) -> EvalResult:
        global_model = objects["global"]
        return EvalResult(
            references={"personalized": ctx.score(mixture(state.personal, global_model, state.alpha)), "global": ctx.score(global_model)},
            headline="personalized",
        )

    # ---- newcomers (partition.newcomers): the global model fine-tuned, mixed at alpha_init ----
    def evaluate_newcomer(self, ctx: ClientContext, state: APFLClient, task: ClientTask, objects: Mapping[str, Any], epochs: int) -> EvalResult:
        global_model: ModelParams = objects["global"]
        personal = fine_tuned(ctx, global_model, epochs)
        return EvalResult(
            references={"personalized": ctx.score(mixture(personal, global_model, state.alpha)), "global": ctx.score(global_model)},
            headline="personalized",
        )


METHOD = MethodSpec(
    name="apfl",
    summary="APFL: FedAvg's global model mixed per client with a personal model by a learned weight alpha",
    params=APFLParams,
    build=lambda params, run: APFL(params, run.server_optimizer, privacy=run.privacy, seed=run.seed),
    applies_server_optimizer=True,
    newcomer_rule="the mixture alpha_init v + (1 - alpha_init) w of the global model w and v = w fine-tuned whole for "
    "protocol.newcomer_epochs epochs (plain cross-entropy, not APFL's joint step)",
    privacy=PrivacyRule(
        sends="the global model's update (encoder and head), clipped: one noised mean a round",
        kept_on_client="the personal model v_k and the mixing weight alpha_k",
    ),
)
