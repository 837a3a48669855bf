"""Run one PFLlib method on a split exported by export_split.py and write its per-client accuracies.

Runs in the reference's own venv (torch, numpy, scikit-learn, h5py, matplotlib),
never in the project's; run.py calls it:

    REF_PYTHON benchmarks/crosscheck/pfllib_side.py --pfllib PFLLIB/system --root ROOT \
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
  scenario's `finetune_epochs`.

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
}


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
    (hdcfl_ray/runtime/client/local_training.py `client_generator`, which this venv cannot import)."""
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
    )


def match_protocol(server: Any, settings: dict[str, Any], method: str, our_batch_order: bool = False) -> list[dict[str, Any]]:
    """Install the optimizer, evaluation record and FedBABU fine-tuning described above
    (and, with `our_batch_order`, hdcfl-ray's batches); returns the list every evaluation appends to."""

    def sgd(model: nn.Module, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)

    def training_sgd(model: nn.Module) -> torch.optim.Optimizer:
        return sgd(model, settings["lr"], settings["momentum"], settings["weight_decay"])

    for client in server.clients:
        client.optimizer = training_sgd(client.model)

        client.crosscheck_round = 0

        def train(client: Any = client, reference_train: Any = client.train) -> None:
            client.crosscheck_round += 1  # hdcfl-ray's 1-based round of this local update
            client.optimizer = training_sgd(client.model)  # fresh optimizer state per local update
            reference_train()

        client.train = train

        if our_batch_order:
            from torch.utils.data import DataLoader
            from utils.data_utils import read_client_data

            def load_train_data(batch_size: int | None = None, client: Any = client) -> DataLoader:
                data = read_client_data(client.dataset, client.id, is_train=True)
                generator = our_batch_generator(int(settings["seed"]), client.id, client.crosscheck_round)
                return DataLoader(data, batch_sampler=OurBatches(len(data), batch_size or client.batch_size, generator))

            client.load_train_data = load_train_data

        if method == "fedbabu":
            finetune = settings["fedbabu"]

            def fine_tune(client: Any = client, reference_fine_tune: Any = client.fine_tune) -> None:
                client.set_parameters(server.global_model)  # the global body after the last aggregation
                client.optimizer = sgd(
                    client.model, finetune["finetune_lr"], finetune["finetune_momentum"], finetune["finetune_weight_decay"]
                )
                reference_fine_tune()

            client.fine_tune = fine_tune

    records: list[dict[str, Any]] = []

    def evaluate(acc: list[float] | None = None, loss: list[float] | None = None) -> None:
        ids, num_samples, correct, _auc = server.test_metrics()
        per_client = [float(c) / n for c, n in zip(correct, num_samples)]
        pooled = float(sum(correct)) / float(sum(num_samples))
        records.append({"client_ids": [int(i) for i in ids], "accuracy": per_client, "pooled": pooled})
        (server.rs_test_acc if acc is None else acc).append(pooled)

    server.evaluate = evaluate
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
    suffix = "" if args.batch_order == "reference" else "-our-batch-order"
    log_path = Path.cwd() / f"{args.method}{suffix}.log"  # the reference's own printout
    started = time.perf_counter()
    with log_path.open("w") as log, contextlib.redirect_stdout(log):
        server = server_class(reference_args(settings, args.method, model, args.dataset), 0)
        seed = int(settings["seed"])
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        records = match_protocol(server, settings, args.method, our_batch_order=args.batch_order == "ours")
        server.train()
    final = records[-1]
    result = {
        "method": args.method,
        "reference_class": class_name,
        "batch_order": args.batch_order,
        "seed": settings["seed"],
        "rounds": settings["rounds"],
        "evaluations": len(records),
        "final_client_ids": final["client_ids"],
        "final_client_accuracy": final["accuracy"],
        "final_mean_client_accuracy": float(np.mean(final["accuracy"])),
        "final_pooled_accuracy": final["pooled"],
        "pooled_accuracy_by_evaluation": [r["pooled"] for r in records],
        "wall_s": time.perf_counter() - started,
        "log": str(log_path),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("method", "seed", "final_mean_client_accuracy", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
