"""What a batched regulariser adds to a round's training: the same clients trained as one
batched model (`train_together`) with no extra term, with FedProx's proximal pull
(`ProximalPull`) and with SCAFFOLD's control-variate correction (`LinearTerm`), each a
fresh process, alternated, medians over the repeats. Both terms take per-client
tensors shaped like the model, so the question is whether the correction costs more
than the pull: it should not (a product and a sum against a difference, a square and
a sum per parameter).

    python -m benchmarks.regulariser_cost [--clients 10] [--encoder small_cnn] [--images 256] [--repeats 5] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import append_markdown, machine_description, module_environment, print_table
from benchmarks._workload import cifar_clients, cifar_model

TERMS = ("none", "proximal pull (FedProx)", "linear correction (SCAFFOLD)")


def _child(term: str, clients: int, encoder: str, images: int) -> dict[str, Any]:
    import torch

    from hdcfl_ray.contract import LinearTerm, OptimizerConfig, ProximalPull
    from hdcfl_ray.runtime.client.batched_training import TrainRequest, train_together

    torch.set_num_threads(1)
    base = cifar_model(encoder)
    data = cifar_clients(clients, images)
    generator = torch.Generator().manual_seed(1)
    requests = []
    for client, (inputs, labels) in enumerate(data):
        model = copy.deepcopy(base)
        pieces = [torch.randn(p.shape, generator=generator) * 0.01 for p in (*model.encoder.parameters(), *model.head.parameters())]
        regulariser: Any = None
        if term == TERMS[1]:
            regulariser = ProximalPull(targets=pieces, strength=0.01, total_importance=1.0, spread=0.0)
        elif term == TERMS[2]:
            regulariser = LinearTerm(targets=pieces)
        requests.append(TrainRequest(model=model, inputs=inputs, labels=labels, epochs=1, batch_size=32,
                                     optimizer_config=OptimizerConfig(name="sgd", lr=0.01, momentum=0.9),
                                     generator=torch.Generator().manual_seed(client), regulariser=regulariser))
    started = time.perf_counter()
    stats = train_together(requests)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "trained_together": max(s.trained_together for s in stats)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--encoder", default="small_cnn")
    parser.add_argument("--images", type=int, default=256, help="training images per client (one epoch, batch 32)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    parser.add_argument("--child-term", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_term is not None:
        print(json.dumps(_child(args.child_term, args.clients, args.encoder, args.images)))
        return 0
    measured: dict[str, list[dict[str, Any]]] = {term: [] for term in TERMS}
    for _ in range(args.repeats):
        for term in TERMS:
            command = [sys.executable, "-m", "benchmarks.regulariser_cost", "--clients", str(args.clients), "--encoder", args.encoder,
                       "--images", str(args.images), "--child-term", term]
            output = subprocess.run(command, check=True, capture_output=True, text=True, env=module_environment()).stdout
            measured[term].append(json.loads(output.strip().splitlines()[-1]))
    none = statistics.median(record["seconds"] for record in measured[TERMS[0]])
    rows = []
    for term, records in measured.items():
        median = statistics.median(record["seconds"] for record in records)
        rows.append({"term": term, "median s": round(median, 3), "vs none": round(median / none, 3),
                     "trained together": records[0]["trained_together"], "processes": len(records)})
    print_table(rows)
    if args.out:
        command = (f"python -m benchmarks.regulariser_cost --clients {args.clients} --encoder {args.encoder} "
                   f"--images {args.images} --repeats {args.repeats}")
        append_markdown(args.out, f"A batched regulariser's cost ({args.clients} clients, {args.encoder})", command, machine_description(), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
