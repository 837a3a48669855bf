"""LEAF's JSON layout (`users`, `num_samples`, `user_data: {user: {x, y}}`), written from
the FEMNIST and Shakespeare stand-ins: FEMNIST's x a flattened 28 x 28 image of values in
[0, 1], Shakespeare's x the 80 characters and y the next one. One file per split, in
`train/` and `test/` as LEAF's scripts write them (its sample split), or one file."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from PIL import Image


def _document(users: dict[str, tuple[list[Any], list[Any]]]) -> dict[str, Any]:
    return {
        "users": list(users),
        "num_samples": [len(xs) for xs, _ in users.values()],
        "user_data": {user: {"x": xs, "y": ys} for user, (xs, ys) in users.items()},
    }


def leaf_users_from_parquet(table_path: Path, id_column: str, x_column: str, y_column: str) -> dict[str, tuple[list[Any], list[Any]]]:
    """A stand-in's Parquet rows grouped by user as LEAF holds them (images as [0, 1] floats)."""
    table = pq.read_table(table_path)
    users: dict[str, tuple[list[Any], list[Any]]] = {}
    for owner, x, y in zip(table.column(id_column).to_pylist(), table.column(x_column).to_pylist(), table.column(y_column).to_pylist()):
        if isinstance(x, dict):  # an image struct: flattened, scaled to [0, 1]
            x = (np.asarray(Image.open(io.BytesIO(x["bytes"])), dtype=np.float64).reshape(-1) / 255.0).round(4).tolist()
        xs, ys = users.setdefault(str(owner), ([], []))
        xs.append(x)
        ys.append(y)
    return users


def write_leaf_json(out: Path, users: dict[str, tuple[list[Any], list[Any]]], test_fraction: float | None = 0.2, seed: int = 0) -> Path:
    """`out/train/<name>.json` and `out/test/<name>.json` (each user's last share in test),
    or `out` itself as one file when `test_fraction` is None. Returns what was written."""
    if test_fraction is None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(_document(users)))
        return out
    rng = np.random.default_rng(seed)
    train, test = {}, {}
    for user, (xs, ys) in users.items():
        order = rng.permutation(len(xs))
        held = max(1, int(round(test_fraction * len(xs)))) if len(xs) > 1 else 0
        test[user] = ([xs[i] for i in order[:held]], [ys[i] for i in order[:held]])
        train[user] = ([xs[i] for i in order[held:]], [ys[i] for i in order[held:]])
    for split, users_of_split in (("train", train), ("test", test)):
        (out / split).mkdir(parents=True, exist_ok=True)
        (out / split / f"all_data_{split}.json").write_text(json.dumps(_document(users_of_split)))
    return out
