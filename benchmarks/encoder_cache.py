"""HDC-FL's server-side encoder cache at K clients with a ResNet-18-sized encoder.

Runs the server half of HDC-FL (the algorithm's aggregate and refresh, no
training) on synthetic uploads: K clients in four planted groups upload an
encoder of ResNet-18's length (11.2 M floats) and a head, a fixed number per
round (partial participation), until every client is cached; the last round
refreshes. Reports the peak anonymous memory (what the process needs; the
memory-mapped cache lives in the page cache, which the kernel reclaims), the
peak file-backed resident memory, the time of the refresh, the size of the
cache file, whether the four planted groups were recovered, and the float16
error of the prototypes against a float32 cache of the same uploads.

    python -m benchmarks.encoder_cache                       # K = 1000
    python -m benchmarks.encoder_cache --clients 100 --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks._common import append_markdown, machine_description, print_table
from benchmarks._workload import cifar_model
from hdcfl_ray.contract import ModelParams, Upload
from hdcfl_ray.algorithms.fedavg_se import FedAvgSE
from hdcfl_ray.algorithms.hdcfl import HDCFL
from hdcfl_ray.algorithms.hdcfl import HDCFLParams
from hdcfl_ray.diagnostics.clustering import adjusted_rand
from hdcfl_ray.models import FlatIndex

GROUPS = 4


class MemoryWatch:
    """Samples this process's RssAnon and RssFile (kB in /proc/self/status) every 50 ms."""

    def __init__(self) -> None:
        self.peak_anon = 0
        self.peak_file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(0.05)

    def sample(self) -> None:
        fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        self.peak_anon = max(self.peak_anon, int(fields["RssAnon"].split()[0]) * 1024)
        self.peak_file = max(self.peak_file, int(fields["RssFile"].split()[0]) * 1024)

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def resnet18_lengths() -> tuple[int, int]:
    model = cifar_model("resnet18_cifar")
    return FlatIndex.of(model.encoder).total_size, FlatIndex.of(model.head).total_size


class SyntheticUploads:
    """Client k of group k % 4: encoder = base[g] + small client noise, head = centre[g] + noise.

    A client's encoder is built from two shared long vectors and two scalars, so
    making one costs one pass over its 11 M floats (random draws of that size
    for every client would dominate the benchmark)."""

    def __init__(self, encoder_length: int, head_length: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.bases = [rng.standard_normal(encoder_length, dtype=np.float32) * 0.05 for _ in range(GROUPS)]
        self.noise = rng.standard_normal(encoder_length, dtype=np.float32) * 0.01
        self.head_centres = rng.standard_normal((GROUPS, head_length)).astype(np.float32)
        self.rng = rng

    def upload(self, client_id: int) -> Upload:
        group = client_id % GROUPS
        encoder = self.bases[group] + np.float32(self.rng.uniform(-1, 1)) * self.noise
        head = self.head_centres[group] + 0.1 * self.rng.standard_normal(self.head_centres.shape[1]).astype(np.float32)
        return Upload(client_id=client_id, num_samples=500, train_loss=0.0, steps=1, models={"encoder": encoder}, values={"head": head})


def run_server(clients: int, per_round: int, precision: str, encoder_length: int, head_length: int, seed: int) -> dict:
    rounds = -(-clients // per_round)
    params = HDCFLParams(groups=GROUPS, activation_round=rounds, refresh_every=1, cache="disk", cache_precision=precision)
    algorithm = HDCFL(params, rounds=rounds, seed=seed)
    uploads = SyntheticUploads(encoder_length, head_length, seed)
    with MemoryWatch() as memory:
        state = algorithm.init_server(ModelParams(np.zeros(encoder_length, dtype=np.float32)), [], clients)
        started = time.perf_counter()
        refresh_seconds = float("nan")
        for round_index in range(1, rounds + 1):
            batch = [uploads.upload(k) for k in range((round_index - 1) * per_round, min(clients, round_index * per_round))]
            before = time.perf_counter()
            if round_index == rounds:
                # Time the refresh alone: aggregation first, then the refresh hook.
                FedAvgSE.aggregate(algorithm, state, round_index, batch)
                before = time.perf_counter()
                notes = algorithm._refresh_if_due(state, round_index)
                refresh_seconds = time.perf_counter() - before
            else:
                algorithm.aggregate(state, round_index, batch)
            del batch
        total_seconds = time.perf_counter() - started
    labels = np.array([notes.refresh.group_labels[k] for k in range(clients)])
    return {
        "clients": clients,
        "precision": precision,
        "cache_file_gb": algorithm._disk_store.nbytes / 1e9,
        "naive_cache_gb": clients * encoder_length * 4 / 1e9,
        "peak_anon_gb": memory.peak_anon / 1e9,
        "peak_file_backed_gb": memory.peak_file / 1e9,
        "refresh_s": refresh_seconds,
        "all_rounds_s": total_seconds,
        "ari_planted": adjusted_rand(labels, np.arange(clients) % GROUPS),
        "prototypes": state.personalisation.prototypes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=50, help="uploads per round (partial participation)")
    parser.add_argument("--error-clients", type=int, default=40, help="K of the float16-vs-float32 comparison")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=None, help="append the results to this markdown file")
    args = parser.parse_args()

    encoder_length, head_length = resnet18_lengths()
    print(f"encoder: ResNet-18 (CIFAR), {encoder_length:,} floats ({encoder_length * 4 / 1e6:.1f} MB fp32); head {head_length} floats")
    print(f"K = {args.clients}: a cache of full fp32 encoders would need {args.clients * encoder_length * 4 / 1e9:.1f} GB")
    result = run_server(args.clients, args.per_round, "float16", encoder_length, head_length, args.seed)
    result.pop("prototypes")

    # Accuracy cost of float16 rows: the same uploads through a float32 and a float16 cache.
    exact = run_server(args.error_clients, args.per_round, "float32", encoder_length, head_length, args.seed)["prototypes"]
    half = run_server(args.error_clients, args.per_round, "float16", encoder_length, head_length, args.seed)["prototypes"]
    relative_error = float(np.linalg.norm(half - exact) / np.linalg.norm(exact))
    max_error = float(np.max(np.abs(half - exact)))
    result["fp16_prototype_rel_error"] = relative_error
    result["fp16_prototype_max_abs_error"] = max_error

    rows = [{key: (f"{value:.4g}" if isinstance(value, float) else value) for key, value in result.items()}]
    print_table(rows)
    if args.out is not None:
        command = "python -m benchmarks.encoder_cache " + " ".join(sys.argv[1:])
        append_markdown(args.out, f"Encoder cache, K = {args.clients}, ResNet-18-sized encoder", command.strip(), machine_description(), rows)


if __name__ == "__main__":
    main()
