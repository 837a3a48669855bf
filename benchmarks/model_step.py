"""One local-training step of each natural-data model, in one process: the defaults of the
two natural scenarios (char_lstm at 64 units, small_cnn at width 16 and 64 features)
against LEAF's reference models (leaf_lstm, leaf_femnist_cnn), at LEAF's batch size of 10.

Each model trains `--steps` batches of 10 through `train_locally` (the clients' own loop:
forward, loss, backward, SGD step) on seeded random inputs of the real sets' shapes
(80-character windows over 81 classes; 28x28 grayscale images over 62 classes), after
`--warmup` steps; the models take turns, `--repeats` times, and the median time per step
is printed with every repeat: wall time, and the process's CPU time, which a machine
shared with other jobs inflates less (at one thread, the two agree on an idle machine).

    python -m benchmarks.model_step [--threads 1] [--steps 40] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from hdcfl_ray.config.schema import ModelConfig, OptimizerConfig
from hdcfl_ray.data.transforms import to_float_batch
from hdcfl_ray.models import build_split_model, count_parameters
from hdcfl_ray.models.split_model import SplitModel
from hdcfl_ray.training.local_training import train_locally

BATCH = 10  # LEAF's batch size for Shakespeare and FEMNIST


@dataclass(frozen=True)
class Case:
    label: str
    model: ModelConfig
    text: bool
    classes: int


CASES = (
    Case("char_lstm (64 units, scenarios/shakespeare.yaml)", ModelConfig(encoder="char_lstm", feature_dim=64), True, 81),
    Case("leaf_lstm", ModelConfig(encoder="leaf_lstm"), True, 81),
    Case("small_cnn (width 16, 64 features, scenarios/femnist.yaml)", ModelConfig(encoder="small_cnn", width=16, feature_dim=64), False, 62),
    Case("leaf_femnist_cnn", ModelConfig(encoder="leaf_femnist_cnn"), False, 62),
)


def case_data(case: Case, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(0)
    shape = (samples, 80, 1, 1) if case.text else (samples, 28, 28, 1)
    images = rng.integers(0, case.classes if case.text else 256, size=shape).astype(np.uint8)
    return to_float_batch(images), torch.as_tensor(rng.integers(0, case.classes, size=samples), dtype=torch.long)


def seconds_per_step(model: SplitModel, inputs: torch.Tensor, labels: torch.Tensor, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds per step of `steps` batches."""
    optimizer = OptimizerConfig(name="sgd", lr=0.1, momentum=0.0, weight_decay=0.0)
    wall, cpu = time.perf_counter(), time.process_time()
    train_locally(
        model, inputs[: steps * BATCH], labels[: steps * BATCH], epochs=1, batch_size=BATCH, optimizer_config=optimizer,
        generator=torch.Generator().manual_seed(0),
    )
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a CPU host trains with runtime.torch_threads)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {case.label: build_split_model(case.model, 1, case.classes, seed=0) for case in CASES}
    data = {case.label: case_data(case, args.steps * BATCH) for case in CASES}
    timings: dict[str, list[tuple[float, float]]] = {case.label: [] for case in CASES}
    for _ in range(args.repeats):
        for case in CASES:
            inputs, labels = data[case.label]
            seconds_per_step(models[case.label], inputs, labels, args.warmup)
            timings[case.label].append(seconds_per_step(models[case.label], inputs, labels, args.steps))
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {BATCH}, {args.steps} steps, {args.repeats} repeats")
    print("| model | parameters | wall ms per step (median) | each repeat | CPU ms per step (median) | each repeat |")
    print("| --- | ---: | ---: | --- | ---: | --- |")
    for case in CASES:
        model = models[case.label]
        parameters = count_parameters(model.encoder) + count_parameters(model.head)
        columns = []
        for runs in ([1000 * wall for wall, _ in timings[case.label]], [1000 * cpu for _, cpu in timings[case.label]]):
            columns += [f"{statistics.median(runs):.1f}", ", ".join(f"{run:.1f}" for run in runs)]
        print(f"| {case.label} | {parameters:,} | {' | '.join(columns)} |")


if __name__ == "__main__":
    main()
