#!/usr/bin/env bash
# Where HDC-FL's prototype mixture pays at CPU scale: one factor at a time away from
# scenarios/cpu/cpu-c10-rot.yaml and cpu-c10-ls3.yaml (E = 1, 250 images per client,
# participation 0.5, width 16), HDC-FL only, seeds 42, 123 and 2026. Each run logs the prototype mixture and, from the same
# evaluation, the global encoder with each client's own head, so the gain is paired per seed.
#
#   export HDCFL_CIFAR10_PARQUET=data/cifar10-parquet   # from the repository root
#   scenarios/cpu/gain-grid.sh                                 # 30 runs into runs/cpu-gain-grid (53 min on 2 cores)
#
# The two base cells come from the reproduction sweep (scenarios/cpu/sweep-reproduction.yaml,
# runs/cpu-reproduction); the report puts them beside the grid in docs/reproduction-gain-grid.md.
# Like every sweep, a rerun skips finished runs and resumes killed ones.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${HDCFL_CIFAR10_PARQUET:?export HDCFL_CIFAR10_PARQUET=<folder with train.parquet and test.parquet>, e.g. data/cifar10-parquet from scripts/cifar10_to_parquet.py}"
out="${GAIN_GRID_OUT:-runs/cpu-gain-grid}"
base="${REPRODUCTION_OUT:-runs/cpu-reproduction}"

cell() {  # cell SCENARIO NAME --set KEY=VALUE...
  local scenario=$1 name=$2
  shift 2
  hdcfl-ray sweep "scenarios/cpu/$scenario.yaml" --algorithms hdcfl --seeds 42,123,2026 \
    --set "name=$name" "$@" --out "$out/$name"
}

cell cpu-c10-rot grid-rot-participation20pct --set protocol.participation=0.2   # staler cache: 4 clients a round
cell cpu-c10-rot grid-rot-participation100pct --set protocol.participation=1.0     # every cached encoder fresh
cell cpu-c10-rot grid-rot-images500 --set dataset.max_train_samples=10000     # 500 training images per client
cell cpu-c10-rot grid-rot-epochs3 --set protocol.local_epochs=3               # more local drift per round
cell cpu-c10-rot grid-rot-width32 --set model.width=32                        # about 4x the encoder parameters

cell cpu-c10-ls3 grid-ls3-participation20pct --set protocol.participation=0.2   # staler cache: 4 clients a round
cell cpu-c10-ls3 grid-ls3-participation100pct --set protocol.participation=1.0     # every cached encoder fresh
cell cpu-c10-ls3 grid-ls3-images500 --set dataset.max_train_samples=10000     # 500 training images per client
cell cpu-c10-ls3 grid-ls3-epochs3 --set protocol.local_epochs=3               # more local drift per round
cell cpu-c10-ls3 grid-ls3-width32 --set model.width=32                        # about 4x the encoder parameters

hdcfl-ray report "$base/cpu-c10-rot/hdcfl" "$base/cpu-c10-ls3/hdcfl" "$out" --format md --out docs/reproduction-gain-grid.md
echo "gain grid: docs/reproduction-gain-grid.md"
