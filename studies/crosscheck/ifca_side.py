"""Run the IFCA reference (jichan3751/ifca, mnist/train_cluster_mnist.py) on a split exported by
export_split.py and write its per-client, per-round accuracies, losses and cluster assignments.

Runs in the reference's own venv (torch, torchvision, numpy); run_ifca.py calls it:

    REF_PYTHON studies/crosscheck/ifca_side.py --ifca IFCA/mnist --root ROOT --out RESULT.json [--paired]

The reference's `TrainMNISTCluster.run()` loop runs unchanged: each round it scores every
cluster model on every client's training data and assigns the client to the lowest
loss (`get_inference_stats`), copies the assigned model, takes `tau` full-batch
gradient steps (`train`, `local_param_update`) and averages each cluster's uploads
(`global_param_update`). What this adapter supplies, so that both sides run the same
experiment:

* the data: `load_data` returns the exported client's tensors (already rotated, in [-1, 1])
  instead of slicing and rotating MNIST; `setup()` (which downloads MNIST) is not called;
* the models: the S cluster models are hdcfl-ray's SmallCNN with a linear head, from
  our seeded independent initialisations (init_independent.pt), as our IFCA starts;
* the settings: m = clients, p = S, tau = local epochs, lr = the protocol's, rounds;
* the record: after each round's assignment on the training data, every client's test
  accuracy and loss with the model its training data chose (our IFCA's evaluation rule),
  beside the reference's own test figure, whose assignment uses the test labels.

The reference's full batch is the client's data in stored order, and its local step is
`param.data -= lr * param.grad`; ours permutes the batch each epoch and steps with torch's
SGD (`param.add_(grad, alpha=-lr)`, one fused rounding). The reference averages a cluster
in float32 (sum, then / count); ours in float64, sample-weighted, rounded once.

`--paired` feeds the reference our arithmetic and inputs: the full batch is our round's
permutation of the client's tensor (with tau = 1 that is the batch our epoch reads), the
local step is torch SGD's `add_(grad, alpha=-lr)`, the average is ours (float64 sum of
(n_k / n) theta_k in client-id order, one float32 rounding). On the same inputs it also
measures, every round, how far the reference's own step and average are from these: the
largest difference and how many weights differ.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pfllib_side import EncoderWithHead, in_layout, our_batch_generator, small_cnn_class  # noqa: E402


def cluster_models(settings: dict[str, Any], init_path: Path) -> list[nn.Module]:
    sizes = settings["model"]
    models = []
    for state in torch.load(init_path, weights_only=True):
        encoder = small_cnn_class()(sizes["in_channels"], width=sizes["width"], feature_dim=sizes["feature_dim"])
        head = nn.Linear(sizes["feature_dim"], settings["num_classes"])
        encoder.load_state_dict(state["encoder"])
        head.load_state_dict(state["head"])
        models.append(EncoderWithHead(encoder, head))
    return models


def client_tensors(folder: Path, settings: dict[str, Any], client_id: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    with np.load(folder / split / f"{client_id}.npz", allow_pickle=True) as stored:
        data = stored["data"].tolist()
    x = in_layout(data["x"], settings["layouts"][str(client_id)][split])
    return x, torch.from_numpy(data["y"]).type(torch.int64)


def ours_average(local_models: list[nn.Module], weights: list[float]) -> dict[str, torch.Tensor]:
    """Our cluster average on the same uploads: float64 sum of (n_k / n) theta_k in the
    given (client-id) order, rounded to float32 once."""
    total = float(sum(weights))
    out: dict[str, torch.Tensor] = {}
    for name, _ in local_models[0].named_parameters():
        acc = None
        for model, weight in zip(local_models, weights):
            term = dict(model.named_parameters())[name].data.double() * (weight / total)
            acc = term if acc is None else acc + term
        out[name] = acc.float()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ifca", type=Path, required=True, help="the reference's mnist/ folder (train_cluster_mnist.py)")
    parser.add_argument("--root", type=Path, required=True, help="export root (holds dataset/NAME)")
    parser.add_argument("--dataset", default="hdcfl")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--paired", action="store_true", help="our batches, step and average (see above)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    root, out = args.root.resolve(), args.out.resolve()
    folder = root / "dataset" / args.dataset
    settings = json.loads((folder / "crosscheck.json").read_text())
    if settings["momentum"] != 0 or settings["weight_decay"] != 0:
        raise ValueError("the IFCA reference steps with plain gradient descent: export with momentum 0 and weight decay 0")
    clients = int(settings["num_clients"])
    if max(settings["train_samples"]) > settings["batch_size"]:
        raise ValueError("the IFCA reference trains on the full local batch: export with batch_size >= every client's samples")
    if args.paired and settings["local_epochs"] != 1:
        raise ValueError("--paired needs local_epochs 1: the reference reads one batch per round, ours one per epoch")
    sys.path.insert(0, str(args.ifca.resolve()))
    work = root / "work-ifca"
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    import train_cluster_mnist as reference  # noqa: E402  (the reference's own module, unchanged)

    seed = int(settings["seed"])
    config = {
        "m": clients, "m_test": clients, "p": int(settings["ifca"]["clusters"]), "n": 0, "h1": 0,
        "num_epochs": int(settings["rounds"]), "batch_size": int(settings["batch_size"]),
        "tau": int(settings["local_epochs"]), "lr": float(settings["lr"]),
        "data_seed": seed, "train_seed": seed, "project_dir": str(work),
    }
    exp = reference.TrainMNISTCluster(config)
    exp.result_fname = str(work / "results.pickle")
    exp.checkpoint_fname = str(work / "checkpoint.pt")
    exp.epoch, exp.lr = None, None
    torch.manual_seed(seed)
    np.random.seed(seed)
    exp.models = cluster_models(settings, folder / "init_independent.pt")
    exp.criterion = nn.CrossEntropyLoss()
    train = {c: client_tensors(folder, settings, c, "train") for c in range(clients)}
    test = {c: client_tensors(folder, settings, c, "test") for c in range(clients)}
    # the true rotation groups, for the reference's own cluster-accuracy printout
    exp.dataset = {split: {"cluster_assign": np.zeros(clients, dtype=np.int64)} for split in ("train", "test")}

    state = {"training": False}
    checks: list[dict[str, Any]] = []

    def load_data(m_i: int, train_split: bool = True, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        train_split = kwargs.get("train", train_split)
        x, y = train[m_i] if train_split else test[m_i]
        if state["training"] and args.paired:  # the batch our round's first epoch reads
            order = torch.randperm(int(y.shape[0]), generator=our_batch_generator(seed, m_i, exp.epoch + 1))
            batch = order[0 : int(settings["batch_size"])]
            return x[batch], y[batch]
        return x, y

    exp.load_data = lambda m_i, train=True: load_data(m_i, train)

    reference_step = exp.local_param_update
    reference_average = exp.global_param_update
    step_check = {"elements": 0, "differing": 0, "max_abs": 0.0}

    def local_param_update(model: nn.Module, lr: float) -> None:
        if not args.paired:
            return reference_step(model, lr)
        as_reference = copy.deepcopy(model)
        for (name, p), (_, q) in zip(model.named_parameters(), as_reference.named_parameters()):
            q.grad = p.grad.clone()
        reference_step(as_reference, lr)  # the reference's own step, on the same gradients, measured
        with torch.no_grad():
            for (_, p), (_, q) in zip(model.named_parameters(), as_reference.named_parameters()):
                p.add_(p.grad, alpha=-lr)  # torch SGD's step (momentum 0, weight decay 0)
                step_check["elements"] += p.numel()
                step_check["differing"] += int((p != q).sum())
                step_check["max_abs"] = max(step_check["max_abs"], float((p - q).abs().max()))
        model.zero_grad()

    exp.local_param_update = local_param_update

    def global_param_update(local_models: list[nn.Module], global_model: nn.Module) -> None:
        n = [float(settings["train_samples"][0])] * len(local_models)  # equal sizes (checked below)
        ours = ours_average(local_models, n)
        theirs = copy.deepcopy(global_model)
        reference_average(local_models, theirs)  # the reference's own average, on the same uploads
        differing = sum(int((dict(theirs.named_parameters())[k].data != v).sum()) for k, v in ours.items())
        largest = max(float((dict(theirs.named_parameters())[k].data - v).abs().max()) for k, v in ours.items())
        checks.append({"round": exp.epoch + 1, "members": len(local_models), "weights_differing": differing,
                       "max_abs_difference": largest, "weights": sum(v.numel() for v in ours.values())})
        if args.paired:
            for name, p in global_model.named_parameters():
                p.data = ours[name]
        else:
            for name, p in global_model.named_parameters():
                p.data = dict(theirs.named_parameters())[name].data

    exp.global_param_update = global_param_update
    if len(set(settings["train_samples"])) != 1:
        raise ValueError("the IFCA reference averages without sample weights: export clients of equal size")

    reference_train = exp.train

    def train_round(cluster_assign: Any, lr: float) -> Any:
        state["training"] = True
        try:
            return reference_train(cluster_assign, lr)
        finally:
            state["training"] = False

    exp.train = train_round

    records: list[dict[str, Any]] = []
    reference_stats = exp.get_inference_stats

    @torch.no_grad()
    def get_inference_stats(train: bool = True) -> dict[str, Any]:
        res = reference_stats(train=train)
        if train:  # the assignment on training data: score each client's test set with its model
            accuracy, loss = [], []
            for m_i, p_i in enumerate(res["cluster_assign"]):
                x, y = test[m_i]
                logits = exp.models[int(p_i)](x).float()
                accuracy.append(int((logits.argmax(dim=1) == y).sum()) / int(y.shape[0]))
                loss.append(float(nn.functional.cross_entropy(logits, y, reduction="sum")) / int(y.shape[0]))
            records.append({"round": exp.epoch + 1, "assignment": [int(p) for p in res["cluster_assign"]],
                            "accuracy": accuracy, "loss": loss, "reference_train_loss": float(res["loss"])})
        else:
            records[-1]["reference_test_accuracy_own_rule"] = float(res["acc"])
        return res

    exp.get_inference_stats = get_inference_stats
    exp.test = lambda train=False: get_inference_stats(train=train)

    started = time.perf_counter()
    with (work / ("ifca-paired.log" if args.paired else "ifca.log")).open("w") as log, contextlib.redirect_stdout(log):
        exp.run()
    result = {
        "reference": "jichan3751/ifca mnist/train_cluster_mnist.py",
        "paired": args.paired,
        "seed": seed,
        "rounds": int(settings["rounds"]),
        # records[t]: after t rounds (t = 0: the initial models); assignment by training loss
        "client_accuracy_by_round": [r["accuracy"] for r in records],
        "client_loss_by_round": [r["loss"] for r in records],
        "assignment_by_round": [r["assignment"] for r in records],
        "reference_test_accuracy_own_rule_by_round": [r.get("reference_test_accuracy_own_rule") for r in records],
        "final_mean_client_accuracy": float(np.mean(records[-1]["accuracy"])),
        "average_checks": checks,
        "step_check": step_check if args.paired else None,
        "wall_s": time.perf_counter() - started,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("seed", "paired", "final_mean_client_accuracy", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
