"""Peak memory of reading LEAF's JSON (`dataset.name: leaf_json`): a seeded FEMNIST-like
file (784 pixels per image as LEAF writes them: 1.0 for the background, k/255 for the
strokes) is read by this tree's reader and, with `--before REV`, by the reader at git
revision REV, each in a fresh process; the table gives each one's peak resident memory
(ru_maxrss), the part of it the read added over the imports, and the time.

    python -m benchmarks.leaf_read_memory [--images 20000] [--before HEAD] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import REPOSITORY, append_markdown, machine_description, module_environment, print_table

IMAGES_PER_USER = 200
PIXELS = 784


def write_femnist_like(path: Path, images: int, seed: int = 0) -> None:
    """LEAF's layout, written user by user (the writer never holds the whole file's floats)."""
    rng = np.random.default_rng(seed)
    users = [f"f{index:04d}_00" for index in range((images + IMAGES_PER_USER - 1) // IMAGES_PER_USER)]
    counts = [min(IMAGES_PER_USER, images - index * IMAGES_PER_USER) for index in range(len(users))]
    with path.open("w", encoding="utf-8") as handle:
        handle.write(f'{{"users": {json.dumps(users)}, "num_samples": {json.dumps(counts)}, "user_data": {{')
        for index, (user, count) in enumerate(zip(users, counts)):
            ink = rng.random((count, PIXELS)) < 0.2
            pixels = np.where(ink, rng.integers(0, 255, (count, PIXELS)) / 255.0, 1.0)
            labels = rng.integers(0, 62, count).tolist()
            handle.write(("" if index == 0 else ", ") + json.dumps(user) + ": ")
            handle.write(json.dumps({"x": pixels.tolist(), "y": labels}))
        handle.write("}}")


def _child(data: Path, reader: str) -> dict[str, Any]:
    """Run in a fresh process: read `data` with the reader in file `reader` ('' = this tree's)."""
    from hdcfl_ray.config.schema import DatasetConfig

    if reader:
        spec = importlib.util.spec_from_file_location("leaf_before", reader)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        load_leaf = module.load_leaf
    else:
        from hdcfl_ray.data.sources.leaf import load_leaf
    baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    dataset = load_leaf(DatasetConfig(name="leaf_json", path=str(data)), 0, "users")
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "images": int(dataset.train_labels.shape[0] + dataset.test_labels.shape[0]),
        "classes": dataset.num_classes,
        "baseline_mb": baseline_kb / 1024,
        "peak_mb": peak_kb / 1024,
        "seconds": seconds,
    }


def _measure(data: Path, reader: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.leaf_read_memory", "--child", str(data), "--reader", reader]
    finished = subprocess.run(command, capture_output=True, text=True, env=module_environment(), cwd=REPOSITORY)
    if finished.returncode != 0:
        raise SystemExit(f"the reader failed:\n{finished.stderr}")
    return json.loads(finished.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--before", default=None, help="also measure the reader at this git revision")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reader", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(Path(args.child), args.reader)))
        return
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "all_data_0.json"
        write_femnist_like(data, args.images)
        readers = {"this tree": ""}
        if args.before:
            old = Path(folder) / "leaf_before.py"
            source = subprocess.run(
                ["git", "show", f"{args.before}:hdcfl_ray/data/sources/leaf.py"], capture_output=True, text=True, check=True, cwd=REPOSITORY
            )
            old.write_text(source.stdout)
            readers = {f"at {args.before}": str(old), **readers}
        rows = []
        for name, reader in readers.items():
            result = _measure(data, reader)
            rows.append(
                {
                    "reader": name,
                    "file MB": data.stat().st_size / 2**20,
                    "images": result["images"],
                    "classes": result["classes"],
                    "peak RSS MB": result["peak_mb"],
                    "added by the read MB": result["peak_mb"] - result["baseline_mb"],
                    "seconds": result["seconds"],
                }
            )
    print_table(rows)
    if args.out:
        append_markdown(args.out, "Reading LEAF's JSON: peak memory", " ".join(sys.argv), machine_description(), rows)


if __name__ == "__main__":
    main()
