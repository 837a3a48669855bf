"""One local update two ways, on the same batches: where our and PFLlib's arithmetic part.

    python studies/crosscheck/one_update.py --root runs/crosscheck/pfllib-seed42 [--clients 0,1,2,3]

Runs in the project's venv and needs no reference code. For each client it
starts from the seeded initial model and trains one round (the scenario's
epochs, batch size and optimizer) twice, with hdcfl-ray's batch order both times:

* ours: `train_locally` on the tensors the client host builds;
* the reference's data path: the client's exported .npz read back and turned into
  tensors as PFLlib's `read_client_data` does, batched by a DataLoader's default
  collate, stepped by `torch.optim.SGD`.

It prints the largest absolute difference of any weight afterwards, the
strides of our input batch and whether our first convolution ran in the
channels-last layout (its output comes back channels-last). A zero means the two paths are the same bits; a
difference of a few 1e-8 is rounding, and the strides say why: with one channel,
`to_float_batch`'s permute leaves an unrotated (or 180-degree) image batch with
channels-last strides, so convolutions take torch's channels-last kernel, while a
90/270-degree batch (and every collated batch) is in the default layout.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pfllib_side import EncoderWithHead, OurBatches, our_batch_generator  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="an export root written by run.py / export_split.py")
    parser.add_argument("--scenario", type=Path, default=Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml")
    parser.add_argument("--clients", default="0,1,2,3")
    args = parser.parse_args()

    from torch.utils.data import DataLoader

    from hdcfl_ray.config.loading import load_scenario
    from hdcfl_ray.models import build_split_model
    from hdcfl_ray.runtime.backends.local_host import local_host
    from hdcfl_ray.training.local_training import client_generator, train_locally
    from hdcfl_ray.runtime.driver import prepare_run

    torch.set_num_threads(1)
    folder = args.root / "dataset" / "hdcfl"
    settings = json.loads((folder / "crosscheck.json").read_text())
    seed = int(settings["seed"])
    prepared = prepare_run(load_scenario(args.scenario, [f"seed={seed}", "algorithm.name=local"]))
    scenario, host = prepared.scenario, local_host(prepared)
    protocol = scenario.protocol
    for client_id in [int(c) for c in args.clients.split(",")]:
        client = prepared.partition.clients[client_id]
        inputs, labels = host._split_tensors(client, "train")
        ours = build_split_model(scenario.model, prepared.dataset.channels, prepared.dataset.num_classes, seed)
        theirs = copy.deepcopy(ours)
        train_locally(
            ours, inputs, labels, epochs=protocol.local_epochs, batch_size=protocol.batch_size,
            optimizer_config=protocol.optimizer, generator=client_generator(seed, client_id, 1),
        )
        # PFLlib's read_client_data / process_image on the exported file (written by our export)
        with np.load(folder / "train" / f"{client_id}.npz", allow_pickle=True) as stored:
            data = stored["data"].tolist()
        x, y = torch.Tensor(data["x"]).type(torch.float32), torch.Tensor(data["y"]).type(torch.int64)
        samples = [(xi, yi) for xi, yi in zip(x, y)]
        net = EncoderWithHead(theirs.encoder, theirs.head)
        optimizer = torch.optim.SGD(
            net.parameters(), lr=protocol.optimizer.lr, momentum=protocol.optimizer.momentum,
            weight_decay=protocol.optimizer.weight_decay,
        )
        batches = OurBatches(len(samples), protocol.batch_size, our_batch_generator(seed, client_id, 1))
        loader = DataLoader(samples, batch_sampler=batches)
        loss_fn = torch.nn.CrossEntropyLoss()
        net.train()
        for _epoch in range(protocol.local_epochs):
            for xb, yb in loader:
                optimizer.zero_grad()
                loss_fn(net(xb), yb).backward()
                optimizer.step()
        ours_params = [*ours.encoder.parameters(), *ours.head.parameters()]
        difference = max(float((p - q).detach().abs().max()) for p, q in zip(ours_params, net.parameters()))
        batch = inputs[: protocol.batch_size]
        first_conv = next(module for module in ours.encoder.modules() if isinstance(module, torch.nn.Conv2d))
        with torch.no_grad():
            channels_last = first_conv(batch).is_contiguous(memory_format=torch.channels_last) and not first_conv(batch).is_contiguous()
        print(
            f"client {client_id:2d}  rotation {client.rotation_degrees:5.1f}  our batch strides {tuple(batch.stride())}"
            f"  conv runs channels-last {channels_last}  max |ours - reference path| {difference:.1e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
