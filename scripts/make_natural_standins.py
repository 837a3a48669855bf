"""Write the natural-data stand-ins the scenarios read (scenarios/femnist.yaml,
scenarios/shakespeare.yaml): a FEMNIST-layout and a Shakespeare-layout Parquet folder,
and with --leaf the same data as LEAF's JSON files. The shipped copies under
scenarios/data/ were made with the defaults; the same command remakes them byte for byte.

    python scripts/make_natural_standins.py --out scenarios/data
    python scripts/make_natural_standins.py --out /tmp/standins --writers 100 --roles 80 --leaf
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hdcfl_ray.data.standins.femnist import write_femnist_standin
from hdcfl_ray.data.standins.leaf_json import leaf_users_from_parquet, write_leaf_json
from hdcfl_ray.data.standins.shakespeare import write_shakespeare_standin

SHARD = Path("data") / "train-00000-of-00001.parquet"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("scenarios/data"))
    parser.add_argument("--writers", type=int, default=36, help="FEMNIST stand-in writers")
    parser.add_argument("--roles", type=int, default=32, help="Shakespeare stand-in speaking roles")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--leaf", action="store_true", help="also write both as LEAF's JSON files (train/ and test/)")
    args = parser.parse_args()
    femnist = write_femnist_standin(args.out / "femnist-standin", writers=args.writers, seed=args.seed)
    shakespeare = write_shakespeare_standin(args.out / "shakespeare-standin", roles=args.roles, seed=args.seed)
    print(f"wrote {femnist} and {shakespeare}")
    if args.leaf:
        for folder, id_column, x, y in ((femnist, "writer_id", "image", "character"), (shakespeare, "character_id", "x", "y")):
            written = write_leaf_json(folder.with_name(folder.name + "-leaf"), leaf_users_from_parquet(folder / SHARD, id_column, x, y))
            print(f"wrote {written}")


if __name__ == "__main__":
    main()
