"""The client training loop against a plain PyTorch loop, in one process.

Trains the same small CNN on the same 10,000 CIFAR-10 images for one epoch two
ways, alternately, three times: one pass of a plain loop (torch.optim.SGD,
batch 32), and 20 calls of hdcfl-ray's `train_locally` on 500-image slices (what
20 clients do in a round). Equal times mean the simulator's per-client loop adds
nothing; any gap in `efficiency.py` then lies outside it.

    python -m benchmarks.training_loop [--cifar PATH]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from benchmarks.efficiency import cifar_path
from hdcfl_ray.config.schema import DatasetConfig, ModelConfig, OptimizerConfig
from hdcfl_ray.data.sources import load_dataset
from hdcfl_ray.data.transforms import to_float_batch
from hdcfl_ray.models import build_split_model
from hdcfl_ray.training.local_training import client_generator, train_locally

CLIENTS = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cifar", default=None)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    dataset = load_dataset(DatasetConfig(name="parquet_images", path=str(cifar_path(args.cifar)), max_train_samples=10_000), 42)
    model = build_split_model(ModelConfig(encoder="small_cnn", width=16, feature_dim=64), 3, dataset.num_classes, seed=42)
    inputs, labels = to_float_batch(dataset.train_images), torch.as_tensor(dataset.train_labels, dtype=torch.long)
    config = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=5.0e-4)
    share = inputs.shape[0] // CLIENTS
    parts = (model.encoder, model.head)
    initial = [{name: tensor.clone() for name, tensor in part.state_dict().items()} for part in parts]

    def fresh() -> None:
        # Both loops start from the same weights, so neither times a diverged (NaN) model.
        for part, state in zip(parts, initial):
            part.load_state_dict(state)

    def plain() -> float:
        fresh()
        optimizer = torch.optim.SGD([*model.encoder.parameters(), *model.head.parameters()], lr=0.05, momentum=0.9, weight_decay=5.0e-4)
        order = torch.randperm(inputs.shape[0])
        started = time.perf_counter()
        for start in range(0, inputs.shape[0], 32):
            batch = order[start : start + 32]
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model.head(model.encoder(inputs[batch])), labels[batch]).backward()
            optimizer.step()
        return time.perf_counter() - started

    def clients() -> float:
        fresh()
        started = time.perf_counter()
        for client in range(CLIENTS):
            part = slice(client * share, (client + 1) * share)
            stats = train_locally(model, inputs[part], labels[part], epochs=1, batch_size=32, optimizer_config=config,
                          generator=client_generator(42, client, 1))
            assert not stats.nonfinite and stats.steps == -(-share // 32), stats
        return time.perf_counter() - started

    plain(), clients()  # warm-up
    for repeat in range(3):
        print(f"repeat {repeat + 1}: plain loop {plain():.2f} s, 20 clients' train_locally {clients():.2f} s")


if __name__ == "__main__":
    main()
