"""Run one PFLlib method on a split exported by export_split.py and write its per-client accuracies.

Runs in the reference's own venv (torch, numpy, scikit-learn, h5py, matplotlib),
never in the project's; run.py calls it:

    REF_PYTHON studies/crosscheck/pfllib_side.py --pfllib PFLLIB/system --root ROOT \
        --method fedavg --out RESULT.json

The reference's server and client classes run unchanged, through their own
`train()` loop, on its own on-disk format. What this adapter supplies or sets,
so that both sides run the same experiment:

* the model: hdcfl-ray's SmallCNN (loaded from its source file, so this venv needs
  none of the project's dependencies) with a linear head `fc`, split into
  base/head the way PFLlib's main.py splits every model, starting from the
  exported seeded weights;
* the optimizer: PFLlib builds one `SGD(lr)` per client for the whole run; the
  adapter gives each client SGD with the protocol's lr, momentum and weight decay
  and builds it afresh before every local update, as hdcfl-ray does;
* the seeds: PFLlib seeds torch with 0 in every client's constructor; after the
  clients exist the adapter seeds torch, numpy and random with the run seed;
* the evaluation record: `evaluate` is replaced by one that keeps every client's
  accuracy (correct / test samples) instead of only the pooled accuracy (equal
  here, since every client has the same number of test samples), and skips the
  training-loss pass, which changes no state;
* rounds: PFLlib's loop runs `global_rounds + 1` local updates and evaluates
  before each, so evaluation i sees i aggregations: with global_rounds = R the
  evaluation at i = R is the state after R rounds, as hdcfl-ray's final one;
* FedBABU: the loop is run with global_rounds = R - 1 (R trainings, R aggregations);
  before the reference's `fine_tune` each client loads the global body and gets a
  fresh SGD with the scenario's fine-tuning settings (PFLlib would fine-tune its
  own last local body with the training optimizer), and the epochs are the
  scenario's `finetune_epochs`;
* FedProx and Ditto keep PFLlib's own proximal optimizer (`PerturbedGradientDescent`:
  a plain SGD step on grad + mu (w - w_global), no momentum, no weight decay), so
  the scenario must set momentum 0 and weight decay 0 for them (run.py does); mu is
  `algorithm.fedprox.mu`, Ditto's is `algorithm.ditto.proximal` (PFLlib's `-mu`),
  Ditto's personal epochs (`-pls`) are `algorithm.ditto.personal_epochs`; Ditto's
  global model gets the protocol's SGD like FedAvg's;
* FedRep: the head optimizer and the body optimizer both become the protocol's SGD,
  fresh per update; the head epochs (`-pls`) are `algorithm.fedrep.head_epochs`;
* APFL: the global and the personal optimizer both become the protocol's SGD, fresh
  per update; alpha starts at `algorithm.apfl.alpha_init` (PFLlib's `-al`); its
  update is PFLlib's own (step size = the learning rate);
* Ditto is scored with its personal models (PFLlib's `evaluate_personalized`), the
  global model is recorded beside it;
* SCAFFOLD keeps PFLlib's own SCAFFOLDOptimizer (a plain SGD step on grad + c - c_k), so
  the scenario must set momentum 0 and weight decay 0 for it too; its server step size
  (`-slr`) is `algorithm.scaffold.server_lr`.

Left as the reference does it (the differences docs/cross-check.md discusses):
training batches drop the last incomplete batch (`drop_last=True`), FedALA's
weight learning reads a contiguous random 80% slice and stops its start phase on
the standard deviation of the last ten losses, and client order inside a round is
random.

`--batch-order ours` is a diagnostic: every local update then reads the batches
hdcfl-ray's client reads in that round (the same per-(seed, client, round)
permutation for each epoch, the last batch kept even when incomplete) instead of
PFLlib's shuffled, drop-last loader. With the batch order shared, whatever still
differs between the two sides is arithmetic, not sampling.

`--paired` goes further, for the paired mode of docs/cross-check.md: our batches
as above, each batch cut from the client's tensor in our memory layout by the
same indexing op (`x[order[start:start + batch]]`), each test set scored in one
batch as ours is, and the server's average computed our way (float64 sum of
w_k * theta_k in client-id order, one rounding to float32 at the end) instead of
PFLlib's float32 sum in random client order. Every other step is PFLlib's own.
The permutations follow our order of phases: Ditto's personal training reads the
epochs after the global model's (PFLlib runs it first), FedRep's body epochs
follow its head epochs, FedBABU's fine-tuning reads a fresh generator of the last
round (our final evaluation is a fresh context of that round).

For SCAFFOLD `--paired` also gives PFLlib our rounding where the two differ only in it
(install_paired_scaffold): the corrected step adds c - c_k to the gradient in one sum, the
control update and the server's averages run in float64 with one rounding to float32. Its
flow, step count and weights stay PFLlib's. On the same inputs PFLlib's own step, control
update, Delta c and averages also run every time, and the result records per round how
many values they give differently from ours and the largest difference.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

REPO_ROOT = Path(__file__).resolve().parents[2]

# hdcfl-ray method -> PFLlib server (module, class), and whether PFLlib's main.py
# splits the model into base and head for it.
METHODS: dict[str, tuple[str, str, bool]] = {
    "fedavg": ("flcore.servers.serveravg", "FedAvg", True),
    "fedavg_se": ("flcore.servers.serverper", "FedPer", True),
    "fedbabu": ("flcore.servers.serverbabu", "FedBABU", True),
    "fedala": ("flcore.servers.serverala", "FedALA", False),
    "local": ("flcore.servers.serverlocal", "Local", False),
    "fedprox": ("flcore.servers.serverprox", "FedProx", False),
    "ditto": ("flcore.servers.serverditto", "Ditto", False),
    "fedrep": ("flcore.servers.serverrep", "FedRep", True),
    "apfl": ("flcore.servers.serverapfl", "APFL", False),
    "scaffold": ("flcore.servers.serverscaffold", "SCAFFOLD", False),
}
# PFLlib puts these methods' proximal term (SCAFFOLD: its correction) into its own
# optimizer, a plain SGD step: the scenario has to run them without momentum and weight decay.
PLAIN_SGD_METHODS = ("fedprox", "ditto", "scaffold")


class EncoderWithHead(nn.Module):
    """hdcfl-ray's encoder followed by its linear head, named `fc` as PFLlib's models name it."""

    def __init__(self, encoder: nn.Module, fc: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.fc = fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.encoder(x))


def small_cnn_class() -> type[nn.Module]:
    spec = importlib.util.spec_from_file_location("hdcfl_small_cnn", REPO_ROOT / "hdcfl_ray" / "models" / "small_cnn.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # PFLlib torch.save()s whole models, which pickles the class by module name
    spec.loader.exec_module(module)
    return module.SmallCNN


def build_model(settings: dict[str, Any], init_path: Path, split: bool) -> nn.Module:
    sizes = settings["model"]
    encoder = small_cnn_class()(sizes["in_channels"], width=sizes["width"], feature_dim=sizes["feature_dim"])
    head = nn.Linear(sizes["feature_dim"], settings["num_classes"])
    state = torch.load(init_path, weights_only=True)
    encoder.load_state_dict(state["encoder"])
    head.load_state_dict(state["head"])
    model = EncoderWithHead(encoder, head)
    if not split:
        return model
    from flcore.trainmodel.models import BaseHeadSplit

    # as PFLlib's main.py does for its split methods
    model_head = copy.deepcopy(model.fc)
    model.fc = nn.Identity()
    return BaseHeadSplit(model, model_head)


def our_batch_generator(seed: int, client_id: int, round_index: int) -> torch.Generator:
    """hdcfl-ray's per-(seed, client, round) batch-order generator
    (hdcfl_ray/training/local_training.py `client_generator`, which this venv cannot import)."""
    entropy = np.random.SeedSequence([seed, client_id, round_index, 0x7EA1]).generate_state(1)[0]
    generator = torch.Generator()
    generator.manual_seed(int(entropy))
    return generator


class OurBatches:
    """A batch sampler giving hdcfl-ray's batches: each pass (epoch) draws the next
    permutation from the round's generator and cuts it into batches, the last one kept."""

    def __init__(self, num_samples: int, batch_size: int, generator: torch.Generator) -> None:
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.generator = generator

    def __iter__(self):
        order = torch.randperm(self.num_samples, generator=self.generator).tolist()
        for start in range(0, self.num_samples, self.batch_size):
            yield order[start : start + self.batch_size]

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)


class RoundPermutations:
    """The permutations a client's round generator gives, drawn once and kept, so
    that a phase PFLlib runs earlier than we do can still read the epochs we give it."""

    def __init__(self, num_samples: int, generator: torch.Generator) -> None:
        self.num_samples = num_samples
        self.generator = generator
        self.drawn: list[torch.Tensor] = []

    def epoch(self, index: int) -> torch.Tensor:
        while len(self.drawn) <= index:
            self.drawn.append(torch.randperm(self.num_samples, generator=self.generator))
        return self.drawn[index]


class NumpyRoundPermutations(RoundPermutations):
    """Our APFL's batch order: one `permutation` per epoch from the client's numpy stream
    of the round (ClientContext.numpy_rng(BATCH_ORDER_STREAM) = SeedSequence([seed,
    client, round, tag of the "client" stream, 0xA9F1]) in hdcfl_ray/seeding.py)."""

    CLIENT_STREAM_TAG = 0xC11E
    APFL_BATCH_ORDER_STREAM = 0xA9F1

    def __init__(self, num_samples: int, seed: int, client_id: int, round_index: int) -> None:
        entropy = [seed, client_id, round_index, self.CLIENT_STREAM_TAG, self.APFL_BATCH_ORDER_STREAM]
        self.rng = np.random.default_rng(np.random.SeedSequence(entropy))
        self.num_samples = num_samples
        self.drawn = []

    def epoch(self, index: int) -> torch.Tensor:
        while len(self.drawn) <= index:
            self.drawn.append(torch.as_tensor(self.rng.permutation(self.num_samples), dtype=torch.long))
        return self.drawn[index]


class PairedBatches:
    """Our batches as our training loop cuts them: each pass reads the next epoch's
    permutation (from `first_epoch` on) and indexes the client's tensor, held in our
    memory layout, with each slice of it (`inputs[order[start:start + batch]]`)."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int, permutations: RoundPermutations,
                 first_epoch: int = 0) -> None:
        self.inputs, self.labels, self.batch_size = inputs, labels, batch_size
        self.permutations = permutations
        self.next_epoch = first_epoch

    def __iter__(self):
        order = self.permutations.epoch(self.next_epoch)
        self.next_epoch += 1
        for start in range(0, int(order.shape[0]), self.batch_size):
            batch = order[start : start + self.batch_size]
            yield self.inputs[batch], self.labels[batch]

    def __len__(self) -> int:
        return -(-int(self.labels.shape[0]) // self.batch_size)


def in_layout(array: np.ndarray, strides: list[int]) -> torch.Tensor:
    """`array` as a float32 tensor with the given strides (our client host's layout)."""
    values = torch.from_numpy(np.ascontiguousarray(array)).type(torch.float32)
    tensor = torch.empty_strided(tuple(values.shape), tuple(strides), dtype=torch.float32)
    tensor.copy_(values)
    return tensor


def paired_average(server: Any) -> None:
    """Our server's weighted average (aggregate.weighted_average): float64 accumulation of
    (n_k / n) * theta_k in client-id order, cast to float32 once, for every parameter."""
    # the uploader of each model (FedPer, FedBABU and FedRep upload `model.base` and keep no ids)
    owners = {}
    for client in server.clients:
        owners[id(client.model)] = client.id
        if hasattr(client.model, "base"):
            owners[id(client.model.base)] = client.id
    ids = [owners[id(model)] for model in server.uploaded_models]
    order = sorted(range(len(ids)), key=lambda i: ids[i])
    server.global_model = copy.deepcopy(server.uploaded_models[order[0]])
    columns = [list(server.uploaded_models[i].parameters()) for i in order]
    for index, parameter in enumerate(server.global_model.parameters()):
        total = torch.zeros(parameter.shape, dtype=torch.float64)
        for position, i in enumerate(order):
            total += columns[position][index].data.double() * float(server.uploaded_weights[i])
        parameter.data = total.float()


def scaffold_corrected_step(parameters: list[torch.Tensor], server_controls: list[torch.Tensor],
                            client_controls: list[torch.Tensor], lr: float) -> None:
    """Our SCAFFOLD step: the gradient gains the float32 difference c - c_k (the gradient of
    our loss term <c - c_k, w>, added to the cross-entropy's in one rounding), then
    p.add_(grad, alpha=-lr) (our SGD without momentum and weight decay). PFLlib's
    SCAFFOLDOptimizer adds the two one at a time: (grad + c) - c_k."""
    with torch.no_grad():
        for parameter, c, c_k in zip(parameters, server_controls, client_controls):
            parameter.add_(parameter.grad + (c - c_k), alpha=-lr)


def scaffold_control_update(client_controls: list[torch.Tensor], server_controls: list[torch.Tensor],
                            start: list[torch.Tensor], trained: list[torch.Tensor], steps: int, lr: float) -> list[torch.Tensor]:
    """Our option II (scaffold_control.updated_control with the step count of
    maths/local_steps.py at momentum 0): c_k+ = c_k - c + (x - y_k) / (steps * lr) in float64,
    rounded to float32 once; c_k itself when no step was taken. PFLlib computes
    c_k - c + (1 / num_batches / epochs / lr) * (x - y_k) in float32."""
    scale = float(steps) * float(lr)
    if scale == 0.0:
        return [c_k.detach().clone() for c_k in client_controls]
    updated = []
    for c_k, c, x, y in zip(client_controls, server_controls, start, trained):
        moved = (x.detach().double() - y.detach().double()) / scale
        updated.append((c_k.detach().double() - c.detach().double() + moved).float())
    return updated


def scaffold_average(model: list[torch.Tensor], control: list[torch.Tensor],
                     uploads: list[tuple[int, list[torch.Tensor], list[torch.Tensor]]], num_clients: int,
                     server_lr: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Our SCAFFOLD server (Scaffold.aggregate) on uploads (client id, y_k, Delta c_k) of equal
    sample counts: the mean of the y_k (float64 sum of y_k / |S| in client-id order, one
    float32 rounding), stepped x + server_lr (mean - x) in float64 (the mean itself at 1);
    c + (|S| / N) mean Delta c, the mean rounded to float32 first, then the sum. PFLlib adds
    (y_k - x) / J * server_lr and Delta c_k / N to float32 copies, one client at a time in
    its upload order (J = its clients per round: |S| under full participation)."""
    ordered = sorted(uploads, key=lambda upload: upload[0])
    share = 1.0 / len(ordered)

    def mean(read: Any, index: int) -> torch.Tensor:
        total = torch.zeros(ordered[0][1][index].shape, dtype=torch.float64)
        for upload in ordered:
            total += read(upload)[index].detach().double() * share
        return total.float()

    new_model, new_control = [], []
    for index, (x, c) in enumerate(zip(model, control)):
        averaged = mean(lambda upload: upload[1], index)
        if server_lr != 1.0:
            x64 = x.detach().double()
            averaged = (x64 + server_lr * (averaged.double() - x64)).float()
        new_model.append(averaged)
        delta = mean(lambda upload: upload[2], index)
        new_control.append((c.detach().double() + (len(ordered) / num_clients) * delta.double()).float())
    return new_model, new_control


def difference_count(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> dict[str, float]:
    """How many values of two equally shaped tensor lists differ, and the largest difference."""
    return {
        "values": sum(int(a.numel()) for a in ours),
        "differing": sum(int((a != b).sum()) for a, b in zip(ours, theirs)),
        "max_abs": max(float((a.double() - b.double()).abs().max()) for a, b in zip(ours, theirs)),
    }


def merged_counts(counts: list[dict[str, float]]) -> dict[str, float]:
    return {
        "values": sum(c["values"] for c in counts),
        "differing": sum(c["differing"] for c in counts),
        "max_abs": max((c["max_abs"] for c in counts), default=0.0),
    }


class PairedScaffoldOptimizer:
    """The paired mode's SCAFFOLD optimizer: `step(c, c_k)` takes our corrected step
    (scaffold_corrected_step) and, on copies of the same weights and gradients, PFLlib's own
    SCAFFOLDOptimizer step, whose difference from ours it records."""

    def __init__(self, parameters: Any, lr: float, reference_class: type, record: list[dict[str, float]]) -> None:
        self.parameters = list(parameters)
        self.lr = float(lr)
        self.reference_class = reference_class
        self.record = record

    def zero_grad(self, set_to_none: bool = True) -> None:
        for parameter in self.parameters:
            parameter.grad = None

    def step(self, server_controls: list[torch.Tensor], client_controls: list[torch.Tensor]) -> None:
        copies = [parameter.detach().clone() for parameter in self.parameters]
        for copy_, parameter in zip(copies, self.parameters):
            copy_.grad = parameter.grad.detach().clone()
        self.reference_class(copies, lr=self.lr).step(server_controls, client_controls)  # PFLlib's own step
        scaffold_corrected_step(self.parameters, server_controls, client_controls, self.lr)
        self.record.append(difference_count([p.detach() for p in self.parameters], copies))


def install_paired_scaffold(server: Any, settings: dict[str, Any], checks: list[dict[str, Any]]) -> None:
    """The paired mode's SCAFFOLD: PFLlib's server and clients keep their flow (what is sent,
    when c_k is updated, the step count num_batches x epochs, the weights 1/J and 1/N), with our
    rounding in the three places where the two differ only in it: the corrected step, the
    update of c_k (and Delta c = c_k+ - c_k) and the server's average of y_k and Delta c_k.
    Each time, PFLlib's own code also runs on the same inputs, and `checks` records per round
    how many values it gives differently and by how much (the last entry is the update after
    the last evaluation, which no evaluation sees)."""
    from flcore.optimizers.fedoptimizer import SCAFFOLDOptimizer

    if len(set(settings["train_samples"])) != 1:
        raise ValueError(
            "PFLlib's SCAFFOLD averages y_k uniformly and ours sample-weighted: export clients of equal size "
            "(run.py sets dataset.test_fraction for it)"
        )
    pending: dict[str, list[dict[str, float]]] = {"step": [], "control": [], "delta_control": []}
    for client in server.clients:
        client.optimizer = PairedScaffoldOptimizer(client.model.parameters(), client.learning_rate, SCAFFOLDOptimizer,
                                                   pending["step"])
        client.crosscheck_delta_control = None

        def update_yc(max_local_epochs: int | None = None, client: Any = client, reference: Any = client.update_yc) -> None:
            epochs = client.local_epochs if max_local_epochs is None else max_local_epochs
            before = [c_k.detach().clone() for c_k in client.client_c]
            steps = client.num_batches * epochs  # PFLlib's count of the local steps (len(trainloader) x epochs)
            ours = scaffold_control_update(before, client.global_c, list(client.global_model.parameters()),
                                           list(client.model.parameters()), steps, client.learning_rate)
            reference(max_local_epochs)  # PFLlib's own update of client_c (in place), on the same inputs
            pending["control"].append(difference_count(ours, [c_k.detach() for c_k in client.client_c]))
            for c_k, value in zip(client.client_c, ours):
                c_k.data = value
            client.crosscheck_delta_control = [new - old for new, old in zip(ours, before)]  # ours: c_k+ - c_k, float32

        def delta_yc(max_local_epochs: int | None = None, client: Any = client, reference: Any = client.delta_yc) -> Any:
            delta_y, delta_c = reference(max_local_epochs)  # PFLlib's own: -c + (x - y_k) / (num_batches epochs lr)
            pending["delta_control"].append(difference_count(client.crosscheck_delta_control, [d.detach() for d in delta_c]))
            return delta_y, client.crosscheck_delta_control

        client.update_yc = update_yc
        client.delta_yc = delta_yc

    reference_aggregate = server.aggregate_parameters

    def aggregate_parameters() -> None:
        ids = list(server.uploaded_ids)
        if len(ids) != server.num_join_clients:
            raise ValueError(f"{len(ids)} uploads for J = {server.num_join_clients}: the paired mode runs full participation")
        model, control = server.global_model, server.global_c
        reference_aggregate()  # PFLlib's own, on the same uploads (its delta_yc gives our Delta c)
        theirs_model, theirs_control = list(server.global_model.parameters()), server.global_c
        uploads = [(cid, list(server.clients[cid].model.parameters()), server.clients[cid].crosscheck_delta_control) for cid in ids]
        new_model, new_control = scaffold_average(list(model.parameters()), control, uploads, server.num_clients,
                                                  float(server.server_learning_rate))
        server.global_model = copy.deepcopy(model)
        for parameter, value in zip(server.global_model.parameters(), new_model):
            parameter.data = value
        server.global_c = new_control
        checks.append({
            "round": len(checks) + 1,
            "step": merged_counts(pending["step"]),
            "control": merged_counts(pending["control"]),
            "delta_control": merged_counts(pending["delta_control"]),
            "model_average": difference_count(new_model, [p.detach() for p in theirs_model]),
            "control_average": difference_count(new_control, [c.detach() for c in theirs_control]),
        })
        for kept in pending.values():
            kept.clear()

    server.aggregate_parameters = aggregate_parameters


def reference_args(settings: dict[str, Any], method: str, model: nn.Module, dataset: str) -> SimpleNamespace:
    """PFLlib's argument namespace (the attributes its servers and clients read)."""
    rounds = settings["rounds"]
    return SimpleNamespace(
        algorithm=METHODS[method][1],
        dataset=dataset,
        device="cpu",
        model=model,
        num_classes=settings["num_classes"],
        num_clients=settings["num_clients"],
        global_rounds=rounds - 1 if method == "fedbabu" else rounds,
        local_epochs=settings["local_epochs"],
        batch_size=settings["batch_size"],
        local_learning_rate=settings["lr"],
        learning_rate_decay=False,
        learning_rate_decay_gamma=0.99,
        join_ratio=1.0,
        random_join_ratio=False,
        eval_gap=1,
        few_shot=0,
        goal="crosscheck",
        save_folder_name="items",
        top_cnt=100,
        auto_break=False,
        time_select=False,
        time_threthold=10000,
        client_drop_rate=0.0,
        train_slow_rate=0.0,
        send_slow_rate=0.0,
        dlg_eval=False,
        dlg_gap=100,
        batch_num_per_client=2,
        num_new_clients=0,
        fine_tuning_epoch_new=0,
        fine_tuning_epochs=settings["fedbabu"]["finetune_epochs"],
        eta=settings["fedala"]["eta"],
        rand_percent=int(round(settings["fedala"]["data_fraction"] * 100)),
        layer_idx=settings["fedala"]["layers"],
        # FedProx's mu and Ditto's lambda are both PFLlib's -mu
        mu=settings["fedprox"]["mu"] if method == "fedprox" else settings["ditto"]["proximal"] if method == "ditto" else 0.0,
        # Ditto's personal epochs and FedRep's head epochs are both PFLlib's -pls
        plocal_epochs=(
            settings["ditto"]["personal_epochs"] if method == "ditto"
            else settings["fedrep"]["head_epochs"] if method == "fedrep" else 1
        ),
        alpha=settings["apfl"]["alpha_init"] if method == "apfl" else 1.0,  # APFL's -al
        server_learning_rate=settings.get("scaffold", {}).get("server_lr", 1.0),  # SCAFFOLD's -slr
        # read by other PFLlib methods' constructors only; PFLlib's defaults
        beta=0.0, lamda=1.0, K=5, p_learning_rate=0.01, M=5, itk=4000, alphaK=1.0, sigma=1.0, tau=1.0,
    )


def match_protocol(server: Any, settings: dict[str, Any], method: str, our_batch_order: bool = False,
                   paired: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Install the optimizers, evaluation record and FedBABU fine-tuning described above
    (and, with `our_batch_order` or `paired`, our batches; with `paired` also our
    layout, test batching and average). Returns the record lists every evaluation
    appends to: "headline" (what the method is scored with) and, for Ditto, "global"."""

    def sgd(parameters: Any, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum, weight_decay=weight_decay)

    def training_sgd(parameters: Any) -> torch.optim.Optimizer:
        return sgd(parameters, settings["lr"], settings["momentum"], settings["weight_decay"])

    if method in PLAIN_SGD_METHODS and (settings["momentum"] != 0 or settings["weight_decay"] != 0):
        raise ValueError(
            f"{method}: PFLlib's proximal optimizer has no momentum or weight decay; export the scenario with "
            "protocol.optimizer.momentum=0 and protocol.optimizer.weight_decay=0"
        )
    seed, epochs = int(settings["seed"]), int(settings["local_epochs"])
    paired = bool(paired)
    use_our_batches = our_batch_order or paired

    def fresh_optimizers(client: Any) -> None:
        """A new optimizer (fresh momentum) before every local update, as ours."""
        if method in ("fedprox", "scaffold"):
            return  # PFLlib's PerturbedGradientDescent and SCAFFOLDOptimizer: stateless, kept as they are
        if method == "fedrep":
            client.optimizer = training_sgd(client.model.base.parameters())
            client.optimizer_per = training_sgd(client.model.head.parameters())
            return
        client.optimizer = training_sgd(client.model.parameters())
        if method == "apfl":
            client.optimizer_per = training_sgd(client.model_per.parameters())

    for client in server.clients:
        fresh_optimizers(client)
        client.crosscheck_round = 0
        client.crosscheck_permutations = None

        def start_round(client: Any = client) -> None:
            client.crosscheck_round += 1  # hdcfl-ray's 1-based round of this local update
            client.crosscheck_permutations = None

        if method == "ditto":  # PFLlib trains the personal model first, then the global one

            def ptrain(client: Any = client, reference_ptrain: Any = client.ptrain) -> None:
                start_round(client)
                client.crosscheck_phase_epoch = epochs  # ours trains the global model first: its epochs come first
                reference_ptrain()

            def train(client: Any = client, reference_train: Any = client.train) -> None:
                fresh_optimizers(client)
                client.crosscheck_phase_epoch = 0
                reference_train()

            client.ptrain = ptrain
        else:

            def train(client: Any = client, reference_train: Any = client.train) -> None:
                start_round(client)
                fresh_optimizers(client)
                client.crosscheck_phase_epoch = 0
                reference_train()

        client.train = train

        if use_our_batches:
            from torch.utils.data import DataLoader
            from utils.data_utils import read_client_data

            def permutations(client: Any = client, fresh: bool = False) -> RoundPermutations:
                if method == "apfl" and client.crosscheck_permutations is None:  # ours draws APFL's order apart
                    client.crosscheck_permutations = NumpyRoundPermutations(
                        client.train_samples, seed, client.id, client.crosscheck_round
                    )
                if fresh or client.crosscheck_permutations is None:
                    generator = our_batch_generator(seed, client.id, client.crosscheck_round)
                    client.crosscheck_permutations = RoundPermutations(client.train_samples, generator)
                return client.crosscheck_permutations

            def load_train_data(batch_size: int | None = None, client: Any = client) -> Any:
                size = batch_size or client.batch_size
                if paired:
                    inputs, labels = client.crosscheck_train
                    return PairedBatches(inputs, labels, size, permutations(client), client.crosscheck_phase_epoch)
                data = read_client_data(client.dataset, client.id, is_train=True)
                generator = our_batch_generator(seed, client.id, client.crosscheck_round)
                return DataLoader(data, batch_sampler=OurBatches(len(data), size, generator))

            client.load_train_data = load_train_data

        if paired:
            layouts = settings["layouts"][str(client.id)]
            tensors = {}
            for split in ("train", "test"):
                with np.load(Path("..") / "dataset" / client.dataset / split / f"{client.id}.npz", allow_pickle=True) as stored:
                    data = stored["data"].tolist()
                tensors[split] = (in_layout(data["x"], layouts[split]), torch.from_numpy(data["y"]).type(torch.int64))
            client.crosscheck_train = tensors["train"]
            client.crosscheck_test = tensors["test"]

            def load_test_data(batch_size: int | None = None, client: Any = client) -> list[tuple[torch.Tensor, torch.Tensor]]:
                return [client.crosscheck_test]  # ours scores a client's test set in batches of 512: one here

            client.load_test_data = load_test_data

        if method == "fedbabu":
            finetune = settings["fedbabu"]

            def fine_tune(client: Any = client, reference_fine_tune: Any = client.fine_tune) -> None:
                client.set_parameters(server.global_model)  # the global body after the last aggregation
                client.optimizer = sgd(
                    client.model.parameters(), finetune["finetune_lr"], finetune["finetune_momentum"],
                    finetune["finetune_weight_decay"],
                )
                if paired:  # our final evaluation is a fresh context of the last round: a fresh generator
                    client.crosscheck_permutations = None
                    client.crosscheck_phase_epoch = 0
                reference_fine_tune()

            client.fine_tune = fine_tune

    scaffold_checks: list[dict[str, Any]] = []
    if paired and method == "scaffold":
        install_paired_scaffold(server, settings, scaffold_checks)
    elif paired:
        server.aggregate_parameters = lambda: paired_average(server)

    records: dict[str, list[dict[str, Any]]] = {"headline": [], "global": [], "scaffold_checks": scaffold_checks}

    def scored_model(client: Any, kind: str) -> nn.Module:
        personal = kind == "headline" and method in ("ditto", "apfl")
        return client.model_per if personal else client.model

    @torch.no_grad()
    def test_loss(client: Any, kind: str) -> float:
        """The scored model's mean test cross-entropy as ours computes it (one summed
        float32 batch over the test set, divided by its size): paired mode only."""
        model = scored_model(client, kind)
        model.eval()
        inputs, labels = client.crosscheck_test
        return float(nn.functional.cross_entropy(model(inputs).float(), labels, reduction="sum")) / int(labels.shape[0])

    @torch.no_grad()
    def global_record(clients: list[Any]) -> dict[str, Any]:
        accuracy, loss = [], []
        for client in clients:
            client.model.eval()
            inputs, labels = client.crosscheck_test
            logits = client.model(inputs).float()
            accuracy.append(int((logits.argmax(dim=1) == labels).sum()) / int(labels.shape[0]))
            loss.append(float(nn.functional.cross_entropy(logits, labels, reduction="sum")) / int(labels.shape[0]))
        return {"client_ids": [int(c.id) for c in clients], "accuracy": accuracy, "loss": loss, "pooled": float(np.mean(accuracy))}

    def recorder(kind: str, metrics: Any) -> Any:
        def evaluate(acc: list[float] | None = None, loss: list[float] | None = None) -> None:
            ids, num_samples, correct, _auc = metrics()
            per_client = [float(c) / n for c, n in zip(correct, num_samples)]
            pooled = float(sum(correct)) / float(sum(num_samples))
            order = sorted(range(len(ids)), key=lambda i: ids[i])
            record = {"client_ids": [int(ids[i]) for i in order], "accuracy": [per_client[i] for i in order], "pooled": pooled}
            if paired:
                by_id = {client.id: client for client in server.clients}
                record["loss"] = [test_loss(by_id[int(ids[i])], kind) for i in order]
                if method == "apfl":  # the global model each client holds after send_models, scored beside v
                    records["global"].append(global_record([by_id[int(ids[i])] for i in order]))
            records[kind].append(record)
            if kind == "headline":
                (server.rs_test_acc if acc is None else acc).append(pooled)

        return evaluate

    if method == "ditto":
        server.evaluate = recorder("global", server.test_metrics)
        server.evaluate_personalized = recorder("headline", server.test_metrics_personalized)
    else:
        server.evaluate = recorder("headline", server.test_metrics)
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pfllib", type=Path, required=True, help="PFLlib's system/ folder")
    parser.add_argument("--root", type=Path, required=True, help="export root (holds dataset/NAME and work/)")
    parser.add_argument("--dataset", default="hdcfl", help="dataset folder name under ROOT/dataset")
    parser.add_argument("--method", choices=sorted(METHODS), required=True)
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--batch-order",
        choices=("reference", "ours"),
        default="reference",
        help="ours: read hdcfl-ray's batches in every local update (a diagnostic, see above)",
    )
    parser.add_argument("--paired", action="store_true",
                        help="our batches, memory layout, test batching and average (the paired mode, see above)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    args.root, args.out = args.root.resolve(), args.out.resolve()  # before the chdir below
    folder = args.root / "dataset" / args.dataset
    settings = json.loads((folder / "crosscheck.json").read_text())
    sys.path.insert(0, str(args.pfllib.resolve()))
    os.chdir(args.root / "work")  # PFLlib reads ../dataset/NAME/{train,test}/<client>.npz

    module_name, class_name, split = METHODS[args.method]
    server_class = getattr(importlib.import_module(module_name), class_name)
    model = build_model(settings, folder / "init.pt", split)
    suffix = "-paired" if args.paired else "" if args.batch_order == "reference" else "-our-batch-order"
    log_path = Path.cwd() / f"{args.method}{suffix}.log"  # the reference's own printout
    started = time.perf_counter()
    with log_path.open("w") as log, contextlib.redirect_stdout(log):
        server = server_class(reference_args(settings, args.method, model, args.dataset), 0)
        seed = int(settings["seed"])
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        recorded = match_protocol(server, settings, args.method, our_batch_order=args.batch_order == "ours",
                                  paired=args.paired)
        server.train()
    records = recorded["headline"]
    final = records[-1]
    result = {
        "method": args.method,
        "reference_class": class_name,
        "batch_order": "ours" if args.paired else args.batch_order,
        "paired": args.paired,
        "seed": settings["seed"],
        "rounds": settings["rounds"],
        "evaluations": len(records),
        "final_client_ids": final["client_ids"],
        "final_client_accuracy": final["accuracy"],
        "final_mean_client_accuracy": float(np.mean(final["accuracy"])),
        "final_pooled_accuracy": final["pooled"],
        "pooled_accuracy_by_evaluation": [r["pooled"] for r in records],
        # evaluation t is the state after t aggregations (FedBABU's last: after fine-tuning)
        "client_accuracy_by_evaluation": [r["accuracy"] for r in records],
        "global_client_accuracy_by_evaluation": [r["accuracy"] for r in recorded["global"]],
        "client_loss_by_evaluation": [r.get("loss") for r in records],
        "global_client_loss_by_evaluation": [r.get("loss") for r in recorded["global"]],
        # SCAFFOLD, paired: per round, PFLlib's own step, c_k update, Delta c and averages against ours
        "scaffold_checks": recorded["scaffold_checks"],
        "wall_s": time.perf_counter() - started,
        "log": str(log_path),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("method", "seed", "final_mean_client_accuracy", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
